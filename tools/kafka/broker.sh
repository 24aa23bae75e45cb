#!/usr/bin/env bash
# An Apache Kafka broker for weir's integration tests: one KRaft node (broker + controller)
# on 127.0.0.1, resolved from Maven Central (no tarball download), started in the background.
#
#   tools/kafka/broker.sh start     resolve (first time), format, start, wait for the ports;
#                                   prints `bootstrap=127.0.0.1:PORT` (PLAINTEXT) and
#                                   `sasl_ssl=127.0.0.1:PORT` (SASL_SSL), `ca=FILE` (the CA
#                                   that signed the broker's certificate, PEM), `lib=DIR` (the
#                                   broker's jars: Kafka's own command-line tools run from them),
#                                   `data=DIR` (its log directory: DumpLogSegments reads it)
#   tools/kafka/broker.sh stop      stop the broker started by `start` (by its pid)
#   tools/kafka/broker.sh restart   stop the broker and start it again on its data and port
#                                   (a broker restart under a running job)
#   tools/kafka/broker.sh status    `running bootstrap=...` or `stopped` (exit 1)
#   tools/kafka/broker.sh resolve   only fill the jar cache
#
# Environment:
#   WEIR_KAFKA_CACHE    jar cache (default ~/.cache/weir/kafka); kept between runs
#   WEIR_KAFKA_DIR      the broker's state: logs, pid, bootstrap (default /tmp/weir-kafka-$UID)
#   WEIR_KAFKA_VERSION  org.apache.kafka:kafka_2.13 version (default 4.4.0)
#   WEIR_KAFKA_HEAP     JVM heap (default 512m)
#
# Tests read the address from $WEIR_KAFKA_DIR/bootstrap:
#   export WEIR_KAFKA_BOOTSTRAP=$(tools/kafka/broker.sh start | sed -n 's/^bootstrap=//p')
#
# The SASL_SSL listener: TLS with a certificate for 127.0.0.1 (IP SAN only: connecting by the
# name `localhost` is a hostname mismatch, which the tests use), signed by a CA made at start
# (openssl; $WEIR_KAFKA_DIR/tls/ca.pem); mechanisms SCRAM-SHA-256, SCRAM-SHA-512 (users
# created at format time), PLAIN and OAUTHBEARER (Kafka's unsecured JWT mode: tests only).
# Every mechanism knows one user: `weir`, password `weir-secret`.
set -euo pipefail

VERSION=${WEIR_KAFKA_VERSION:-4.4.0}
CACHE=${WEIR_KAFKA_CACHE:-$HOME/.cache/weir/kafka}
DIR=${WEIR_KAFKA_DIR:-/tmp/weir-kafka-$(id -u)}
HEAP=${WEIR_KAFKA_HEAP:-512m}
LIB="$CACHE/$VERSION/lib"

log() { echo "broker.sh: $*" >&2; }

resolve() {
  if [ -f "$LIB/.complete-tools" ]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn not found (apt-get install maven)"; exit 1; }
  command -v java >/dev/null || { log "java not found (Kafka 4 needs Java 17+: apt-get install openjdk-17-jre-headless)"; exit 1; }
  local work="$CACHE/$VERSION/pom"
  mkdir -p "$work" "$LIB"
  # The broker and what it needs at run time; Kafka's command-line tools (console producer and
  # consumer, consumer groups: the tests use them as a user would); log4j2's core so the
  # broker can log (Kafka 4 logs through log4j2 and ships only its API as a dependency).
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>weir</groupId>
  <artifactId>weir-kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.24.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
  log "resolving org.apache.kafka:kafka_2.13:$VERSION into $LIB"
  local t0=$SECONDS
  # Its own local repository, so a resolve needs (and touches) nothing of ~/.m2.
  if ! MAVEN_OPTS="${MAVEN_OPTS:-} -XX:-UsePerfData" mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$CACHE/m2" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$LIB" >"$work/mvn.log" 2>&1; then
    log "Maven could not resolve kafka_2.13:$VERSION; see $work/mvn.log"
    tail -20 "$work/mvn.log" >&2
    exit 1
  fi
  touch "$LIB/.complete-tools"
  log "resolved $(ls "$LIB" | wc -l) jars in $((SECONDS - t0)) s"
}

pid_alive() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() {
  local port=$1 deadline=$((SECONDS + ${WEIR_KAFKA_START_TIMEOUT:-120}))
  while ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! pid_alive; then log "the broker exited; see $DIR/broker.log"; tail -30 "$DIR/broker.log" >&2; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then log "port $port not open after ${WEIR_KAFKA_START_TIMEOUT:-120} s"; exit 1; fi
    sleep 0.2
  done
}

start() {
  if pid_alive; then print_addresses; return 0; fi
  resolve
  rm -rf "$DIR"
  mkdir -p "$DIR/data"
  local port ctl sport
  port=$(free_port)
  ctl=$(free_port)
  while [ "$ctl" = "$port" ]; do ctl=$(free_port); done
  sport=$(free_port)
  while [ "$sport" = "$port" ] || [ "$sport" = "$ctl" ]; do sport=$(free_port); done
  make_certs
  cat >"$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl
listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_weir="weir-secret";
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="weir";
ssl.keystore.type=PEM
ssl.keystore.location=$DIR/tls/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$DIR/tls/ca.pem
ssl.client.auth=none
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=1
# Short transaction timeouts are allowed (tests use seconds).
transaction.max.timeout.ms=900000
# ACLs: a resource with none is open to every user (the tests' topics and groups); the
# PLAINTEXT and controller listeners' ANONYMOUS principal is a super user. A test that wants
# a user refused adds an ACL for another user on its own group (tests/kafka_security.rs).
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
super.users=User:ANONYMOUS
PROPS
  cat >"$DIR/log4j2.properties" <<'LOG'
rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka.server.KafkaRaftServer
logger.kafka.level=INFO
LOG
  local cp="$LIB/*"
  local jvm=(-Xms"$HEAP" -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xshare:auto
    -Dlog4j2.configurationFile="$DIR/log4j2.properties" -Djava.awt.headless=true)
  local cluster
  cluster=$(java -cp "$cp" "${jvm[@]}" kafka.tools.StorageTool random-uuid 2>>"$DIR/format.log" | tail -1)
  local scram=(--add-scram "SCRAM-SHA-256=[name=weir,password=weir-secret]"
    --add-scram "SCRAM-SHA-512=[name=weir,password=weir-secret]")
  java -cp "$cp" "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$DIR/server.properties" \
    --standalone "${scram[@]}" >>"$DIR/format.log" 2>&1 \
    || java -cp "$cp" "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$DIR/server.properties" \
    "${scram[@]}" >>"$DIR/format.log" 2>&1 \
    || { log "formatting the storage failed; see $DIR/format.log"; tail -20 "$DIR/format.log" >&2; exit 1; }
  echo "127.0.0.1:$port" >"$DIR/bootstrap"
  echo "127.0.0.1:$sport" >"$DIR/sasl_ssl"
  launch
}

# A CA and the broker's certificate (IP SAN 127.0.0.1, one year) signed by it, in
# $DIR/tls: ca.pem for clients; broker.pem (PKCS#8 key + chain) for the broker's PEM keystore.
make_certs() {
  command -v openssl >/dev/null || { log "openssl not found (apt-get install openssl)"; exit 1; }
  local tls="$DIR/tls"
  mkdir -p "$tls"
  if ! {
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=weir test CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.pem" &&
      openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$tls/broker.key" -out "$tls/broker.csr" &&
      printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$tls/ext.cnf" &&
      openssl x509 -req -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 365 \
        -extfile "$tls/ext.cnf" -out "$tls/broker.crt" &&
      openssl pkcs8 -topk8 -nocrypt -in "$tls/broker.key" -out "$tls/broker.p8" &&
      cat "$tls/broker.p8" "$tls/broker.crt" "$tls/ca.pem" >"$tls/broker.pem"
  } >"$tls/openssl.log" 2>&1; then
    log "making the test certificates failed; see $tls/openssl.log"
    tail -20 "$tls/openssl.log" >&2
    exit 1
  fi
}

# Run the broker on the formatted storage in $DIR; wait for its port.
launch() {
  local cp="$LIB/*"
  # Its own temp dir: the codecs' native libraries (lz4-java, snappy-java) unpack there, inside
  # $DIR, so even a broker killed with -9 leaves nothing in /tmp.
  mkdir -p "$DIR/tmp"
  local jvm=(-Xms"$HEAP" -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xshare:auto
    -Dlog4j2.configurationFile="$DIR/log4j2.properties" -Djava.awt.headless=true -Djava.io.tmpdir="$DIR/tmp")
  nohup java -cp "$cp" "${jvm[@]}" kafka.Kafka "$DIR/server.properties" >>"$DIR/broker.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid"
  local bootstrap
  bootstrap=$(cat "$DIR/bootstrap")
  wait_port "${bootstrap##*:}"
  local sasl_ssl
  sasl_ssl=$(cat "$DIR/sasl_ssl")
  wait_port "${sasl_ssl##*:}"
  print_addresses
}

print_addresses() {
  echo "bootstrap=$(cat "$DIR/bootstrap")"
  echo "sasl_ssl=$(cat "$DIR/sasl_ssl")"
  echo "ca=$DIR/tls/ca.pem"
  echo "lib=$LIB"
  echo "data=$DIR/data"
}

restart() {
  [ -f "$DIR/server.properties" ] || { log "no broker was started in $DIR"; exit 1; }
  stop
  launch
}

stop() {
  if ! pid_alive; then log "not running"; rm -f "$DIR/pid"; return 0; fi
  local pid
  pid=$(cat "$DIR/pid")
  kill "$pid"
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/pid"; log "stopped (pid $pid)"; return 0; }
    sleep 0.2
  done
  log "pid $pid did not stop in 30 s; killing it"
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$DIR/pid"
}

status() {
  if pid_alive; then echo "running bootstrap=$(cat "$DIR/bootstrap") pid=$(cat "$DIR/pid")"; else echo stopped; return 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) restart ;;
  resolve) resolve ;;
  *) echo "usage: $0 start|stop|restart|status|resolve" >&2; exit 2 ;;
esac
