#!/usr/bin/env bash
# An Apache Kafka broker for weir's integration tests: one KRaft node (broker + controller)
# on 127.0.0.1, resolved from Maven Central (no tarball download), started in the background.
#
#   tools/kafka/broker.sh start     resolve (first time), format, start, wait for the port;
#                                   prints `bootstrap=127.0.0.1:PORT`
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
set -euo pipefail

VERSION=${WEIR_KAFKA_VERSION:-4.4.0}
CACHE=${WEIR_KAFKA_CACHE:-$HOME/.cache/weir/kafka}
DIR=${WEIR_KAFKA_DIR:-/tmp/weir-kafka-$(id -u)}
HEAP=${WEIR_KAFKA_HEAP:-512m}
LIB="$CACHE/$VERSION/lib"

log() { echo "broker.sh: $*" >&2; }

resolve() {
  if [ -f "$LIB/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn not found (apt-get install maven)"; exit 1; }
  command -v java >/dev/null || { log "java not found (Kafka 4 needs Java 17+: apt-get install openjdk-17-jre-headless)"; exit 1; }
  local work="$CACHE/$VERSION/pom"
  mkdir -p "$work" "$LIB"
  # The broker and what it needs at run time; log4j2's core so the broker can log (Kafka 4
  # logs through log4j2 and ships only its API as a dependency).
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>weir</groupId>
  <artifactId>weir-kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
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
  touch "$LIB/.complete"
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
  if pid_alive; then echo "bootstrap=$(cat "$DIR/bootstrap")"; return 0; fi
  resolve
  rm -rf "$DIR"
  mkdir -p "$DIR/data"
  local port ctl
  port=$(free_port)
  ctl=$(free_port)
  while [ "$ctl" = "$port" ]; do ctl=$(free_port); done
  cat >"$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
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
  java -cp "$cp" "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$DIR/server.properties" \
    --standalone >>"$DIR/format.log" 2>&1 \
    || java -cp "$cp" "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$DIR/server.properties" \
    >>"$DIR/format.log" 2>&1 \
    || { log "formatting the storage failed; see $DIR/format.log"; tail -20 "$DIR/format.log" >&2; exit 1; }
  echo "127.0.0.1:$port" >"$DIR/bootstrap"
  launch
}

# Run the broker on the formatted storage in $DIR; wait for its port.
launch() {
  local cp="$LIB/*"
  local jvm=(-Xms"$HEAP" -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xshare:auto
    -Dlog4j2.configurationFile="$DIR/log4j2.properties" -Djava.awt.headless=true)
  nohup java -cp "$cp" "${jvm[@]}" kafka.Kafka "$DIR/server.properties" >>"$DIR/broker.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid"
  local bootstrap
  bootstrap=$(cat "$DIR/bootstrap")
  wait_port "${bootstrap##*:}"
  echo "bootstrap=$bootstrap"
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
