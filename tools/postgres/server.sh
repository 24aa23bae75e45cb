#!/usr/bin/env bash
# A PostgreSQL server for weir's integration tests, its benchmark and its demo: Debian's
# PostgreSQL (apt-get install postgresql; 15 on bookworm), one cluster made by initdb in a
# directory of its own, owned by an unprivileged user (initdb and postgres refuse to run as
# root: as root the script runs them as the `postgres` system user the package creates, or
# `nobody`), listening on a free loopback port, with TLS (a CA and a certificate for
# 127.0.0.1 made by openssl) and password authentication (SCRAM-SHA-256) for TCP clients.
#
#   tools/postgres/server.sh start     initdb (first time), start, wait until it accepts
#                                      connections; prints `host=127.0.0.1`, `port=PORT`,
#                                      `user=weir`, `password=weir-secret`, `dbname=weir`,
#                                      `ca=FILE` (the CA of the server's certificate, PEM),
#                                      `dir=DIR` (its directory), `url=postgresql://...`
#   tools/postgres/server.sh stop      stop it (fast shutdown) and remove its directory
#   tools/postgres/server.sh restart   stop it (immediate: in-flight work is cut) and start it
#                                      again on the same data and port (a server restart
#                                      under a running job)
#   tools/postgres/server.sh kill      SIGKILL the postmaster (a crash; `start` recovers it)
#   tools/postgres/server.sh status    `running port=... pid=...` or `stopped` (exit 1)
#   tools/postgres/server.sh psql ...  psql as the superuser over the server's own socket
#
# Environment:
#   WEIR_PG_DIR          the server's directory: data, socket, log, TLS files, pid
#                        (default /tmp/weir-pg-$UID); removed by `stop`
#   WEIR_PG_BIN          where initdb, pg_ctl, postgres are (default: pg_config --bindir, or
#                        /usr/lib/postgresql/<newest>/bin)
#   WEIR_PG_PREPARED     max_prepared_transactions (default 64; 0 turns two-phase commit off,
#                        the setting weir's exactly-once sink refuses)
#   WEIR_PG_PORT         the port (default: a free one)
#   WEIR_PG_USER         the unprivileged OS user to run as when started as root
#
# The database `weir` belongs to the role `weir` (password `weir-secret`, not a superuser);
# the role `weir_noauth` may log in only with a password nobody knows (authentication tests).
set -euo pipefail

DIR=${WEIR_PG_DIR:-/tmp/weir-pg-$(id -u)}
PREPARED=${WEIR_PG_PREPARED:-64}

log() { echo "server.sh: $*" >&2; }

bindir() {
  if [ -n "${WEIR_PG_BIN:-}" ]; then echo "$WEIR_PG_BIN"; return; fi
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -n "$newest" ]; then echo "$newest"; return; fi
  if command -v pg_config >/dev/null; then pg_config --bindir; return; fi
  log "PostgreSQL not found (apt-get install postgresql)"
  exit 1
}
BIN=$(bindir)

# Who runs the server: this user, or as root an unprivileged one.
RUN_AS=()
if [ "$(id -u)" -eq 0 ]; then
  user=${WEIR_PG_USER:-}
  if [ -z "$user" ]; then
    if id postgres >/dev/null 2>&1; then user=postgres; else user=nobody; fi
  fi
  RUN_AS=(setpriv --reuid="$(id -u "$user")" --regid="$(id -g "$user")" --init-groups --reset-env)
fi
as_server() { "${RUN_AS[@]}" env HOME="$DIR" "$@"; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

pid_alive() {
  local pid
  [ -f "$DIR/data/postmaster.pid" ] || return 1
  pid=$(head -1 "$DIR/data/postmaster.pid")
  # A killed postmaster not yet reaped by its parent is a zombie: dead all the same.
  kill -0 "$pid" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

# A CA and the server's certificate (IP SAN 127.0.0.1 and DNS localhost), in $DIR/tls.
make_certs() {
  command -v openssl >/dev/null || { log "openssl not found (apt-get install openssl)"; exit 1; }
  local tls="$DIR/tls"
  mkdir -p "$tls"
  if ! {
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=weir test CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.pem" &&
      openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$tls/server.key" -out "$tls/server.csr" &&
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
        >"$tls/ext.cnf" &&
      openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 365 \
        -extfile "$tls/ext.cnf" -out "$tls/server.crt"
  } >"$tls/openssl.log" 2>&1; then
    log "making the test certificates failed; see $tls/openssl.log"
    tail -20 "$tls/openssl.log" >&2
    exit 1
  fi
  chmod 600 "$tls/server.key"
}

init() {
  rm -rf "$DIR"
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  make_certs
  local port=${WEIR_PG_PORT:-$(free_port)}
  echo "$port" >"$DIR/port"
  printf 'weir-super-%s\n' "$RANDOM$RANDOM" >"$DIR/superpass"
  if [ ${#RUN_AS[@]} -gt 0 ]; then chown -R "$(id -u "$user"):$(id -g "$user")" "$DIR"; fi
  chmod 600 "$DIR/superpass"
  if ! as_server "$BIN/initdb" -D "$DIR/data" -U postgres --pwfile="$DIR/superpass" -A scram-sha-256 \
      --auth-local=trust -E UTF8 --locale=C.UTF-8 --no-instructions >"$DIR/initdb.log" 2>&1; then
    log "initdb failed; see $DIR/initdb.log"
    tail -20 "$DIR/initdb.log" >&2
    exit 1
  fi
  cat >>"$DIR/data/postgresql.conf" <<CONF
# weir's test server (tools/postgres/server.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$DIR'
max_connections = 60
max_prepared_transactions = $PREPARED
shared_buffers = 64MB
ssl = on
ssl_cert_file = '$DIR/tls/server.crt'
ssl_key_file = '$DIR/tls/server.key'
logging_collector = off
log_min_messages = warning
CONF
  cat >"$DIR/data/pg_hba.conf" <<HBA
local all all trust
hostssl all all 127.0.0.1/32 scram-sha-256
hostnossl all all 127.0.0.1/32 scram-sha-256
HBA
  launch
  psql_admin -q -v ON_ERROR_STOP=1 <<SQL >/dev/null
CREATE ROLE weir LOGIN PASSWORD 'weir-secret';
CREATE ROLE weir_noauth LOGIN PASSWORD 'a-password-nobody-knows-$RANDOM';
CREATE DATABASE weir OWNER weir;
SQL
}

psql_admin() {
  as_server "$BIN/psql" -X -h "$DIR" -p "$(cat "$DIR/port")" -U postgres -d "${PGDATABASE:-postgres}" "$@"
}

# Start the server on the initialized data; wait until it accepts connections.
launch() {
  if ! as_server "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t "${WEIR_PG_START_TIMEOUT:-60}" \
      -o "-c port=$(cat "$DIR/port")" start >"$DIR/pg_ctl.log" 2>&1; then
    log "the server did not start; see $DIR/server.log"
    tail -30 "$DIR/server.log" >&2
    exit 1
  fi
}

print_settings() {
  local port
  port=$(cat "$DIR/port")
  echo "host=127.0.0.1"
  echo "port=$port"
  echo "user=weir"
  echo "password=weir-secret"
  echo "dbname=weir"
  echo "ca=$DIR/tls/ca.pem"
  echo "dir=$DIR"
  echo "url=postgresql://weir:weir-secret@127.0.0.1:$port/weir"
}

start() {
  if pid_alive; then print_settings; return 0; fi
  if [ -f "$DIR/data/PG_VERSION" ]; then launch; else init; fi
  print_settings
}

stop_server() {
  local mode=$1
  if pid_alive; then
    as_server "$BIN/pg_ctl" -D "$DIR/data" -m "$mode" -w -t 30 stop >>"$DIR/pg_ctl.log" 2>&1 || {
      log "pg_ctl stop failed; killing the postmaster"
      kill -9 "$(head -1 "$DIR/data/postmaster.pid")" 2>/dev/null || true
    }
  fi
}

case "${1:-}" in
  start) start ;;
  stop)
    stop_server fast
    rm -rf "$DIR"
    ;;
  restart)
    [ -f "$DIR/data/PG_VERSION" ] || { log "no server was started in $DIR"; exit 1; }
    stop_server immediate
    launch
    ;;
  kill)
    if pid_alive; then kill -9 "$(head -1 "$DIR/data/postmaster.pid")"; fi
    ;;
  status)
    if pid_alive; then
      echo "running port=$(cat "$DIR/port") pid=$(head -1 "$DIR/data/postmaster.pid")"
    else
      echo stopped
      exit 1
    fi
    ;;
  psql)
    shift
    psql_admin "$@"
    ;;
  *)
    echo "usage: $0 start|stop|restart|kill|status|psql [args]" >&2
    exit 2
    ;;
esac
