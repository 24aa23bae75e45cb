#!/usr/bin/env bash
# A real S3 server on loopback for weir's checkpoint-store tests: s3proxy (org.gaul:s3proxy,
# from Maven Central) over a local directory, with AWS v2/v4 signatures and one key pair.
#
#   tools/s3/s3proxy.sh start     resolve (first time), start, wait for the port; prints
#                                 `endpoint=http://127.0.0.1:PORT`, `bucket=weir`,
#                                 `access_key=weir`, `secret_key=weir-secret`
#   tools/s3/s3proxy.sh stop      stop it (its data stays until the next start)
#   tools/s3/s3proxy.sh restart   stop and start it again on the same port and data (a store
#                                 that was down comes back)
#   tools/s3/s3proxy.sh status    `running endpoint=...` or `stopped` (exit 1)
#
# Environment: WEIR_S3_CACHE (jar cache, default ~/.cache/weir/s3proxy), WEIR_S3_DIR (its
# state: data, pid, log; default /tmp/weir-s3-$UID), WEIR_S3_VERSION (default 2.6.0).
set -euo pipefail

VERSION=${WEIR_S3_VERSION:-2.6.0}
CACHE=${WEIR_S3_CACHE:-$HOME/.cache/weir/s3proxy}
DIR=${WEIR_S3_DIR:-/tmp/weir-s3-$(id -u)}
LIB="$CACHE/$VERSION/lib"

log() { echo "s3proxy.sh: $*" >&2; }

resolve() {
  if [ -f "$LIB/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn not found (apt-get install maven)"; exit 1; }
  local work="$CACHE/$VERSION/pom"
  mkdir -p "$work" "$LIB"
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>weir</groupId>
  <artifactId>weir-s3proxy</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.gaul</groupId><artifactId>s3proxy</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
POM
  log "resolving org.gaul:s3proxy:$VERSION into $LIB"
  if ! MAVEN_OPTS="${MAVEN_OPTS:-} -XX:-UsePerfData" mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB" >"$work/mvn.log" 2>&1; then
    log "Maven could not resolve s3proxy:$VERSION; see $work/mvn.log"
    tail -20 "$work/mvn.log" >&2
    exit 1
  fi
  touch "$LIB/.complete"
}

pid_alive() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

print_addresses() {
  echo "endpoint=http://127.0.0.1:$(cat "$DIR/port")"
  echo "bucket=weir"
  echo "access_key=weir"
  echo "secret_key=weir-secret"
}

launch() {
  local port=$1
  cat >"$DIR/s3proxy.properties" <<PROPS
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=weir
s3proxy.credential=weir-secret
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DIR/data
PROPS
  echo "$port" >"$DIR/port"
  # Without a configuration logback logs every request at DEBUG (megabytes per test).
  cat >"$DIR/logback.xml" <<XML
<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="out"/></root>
</configuration>
XML
  nohup java -XX:-UsePerfData -Xmx256m -Dlogback.configurationFile="$DIR/logback.xml" -cp "$LIB/*" \
    org.gaul.s3proxy.Main --properties "$DIR/s3proxy.properties" \
    >>"$DIR/s3proxy.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid"
  local deadline=$((SECONDS + 60))
  while ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! pid_alive; then log "s3proxy exited; see $DIR/s3proxy.log"; tail -30 "$DIR/s3proxy.log" >&2; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then log "port $port not open after 60 s"; exit 1; fi
    sleep 0.2
  done
}

start() {
  if pid_alive; then print_addresses; return 0; fi
  resolve
  rm -rf "$DIR"
  # A bucket of the filesystem backend is a directory under its base.
  mkdir -p "$DIR/data/weir"
  launch "$(free_port)"
  print_addresses
}

stop() {
  if ! pid_alive; then rm -f "$DIR/pid"; return 0; fi
  local pid
  pid=$(cat "$DIR/pid")
  kill "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/pid"; return 0; }
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$DIR/pid"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; launch "$(cat "$DIR/port")"; print_addresses ;;
  status) if pid_alive; then echo "running endpoint=http://127.0.0.1:$(cat "$DIR/port")"; else echo stopped; exit 1; fi ;;
  *) echo "usage: $0 start|stop|restart|status" >&2; exit 2 ;;
esac
