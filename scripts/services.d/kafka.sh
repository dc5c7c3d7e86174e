# shellcheck shell=bash
# Apache Kafka for local development: one KRaft node (broker and controller in the same
# JVM) on 127.0.0.1:$KAFKA_PORT (9092), controller listener on 127.0.0.1:$KAFKA_CONTROLLER_PORT
# (9093).
#
# Sourced by scripts/services, which provides CACHE_DIR, STATE_DIR, SCRIPT_DIR, PY and the
# helpers log, die, is_pid_alive and wait_ready.
#
# There is no Kafka distribution tarball involved: the broker is assembled from the
# Maven Central artifacts (kafka_2.13 and its runtime dependencies plus a logging
# backend) and started with plain `java -cp`, so the only things needed are a JDK (17+)
# and Maven.
#
# Overrides: KAFKA_VERSION (3.x only; 4.x needs a different storage format call and
# log4j2), KAFKA_HEAP (JVM heap flags), KAFKA_STOP_TIMEOUT (seconds between SIGTERM and
# SIGKILL), KAFKA_PORT and KAFKA_CONTROLLER_PORT (a second instance beside the first needs
# other ports and its own CELERY_SCHEDULER_STATE).
#
# One node of a multi-node KRaft cluster (scripts/kafka-cluster starts several): KAFKA_NODE_ID
# (1), KAFKA_QUORUM_VOTERS (id@host:port,...; default this node alone), KAFKA_CLUSTER_ID (the
# same on every node; default a random one at first start), KAFKA_INTERNAL_REPLICATION
# (replicas of the consumer-offsets and transaction topics, 1), KAFKA_EXTRA_CONFIG (lines
# appended to server.properties). Unset, they give the single node described above.

KAFKA_VERSION="${KAFKA_VERSION:-3.9.1}"
KAFKA_SCALA_VERSION="2.13"
KAFKA_HEAP="${KAFKA_HEAP:--Xms256m -Xmx512m}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_NODE_ID="${KAFKA_NODE_ID:-1}"
KAFKA_QUORUM_VOTERS="${KAFKA_QUORUM_VOTERS:-$KAFKA_NODE_ID@127.0.0.1:$KAFKA_CONTROLLER_PORT}"
KAFKA_CLUSTER_ID="${KAFKA_CLUSTER_ID:-}"
KAFKA_INTERNAL_REPLICATION="${KAFKA_INTERNAL_REPLICATION:-1}"
KAFKA_EXTRA_CONFIG="${KAFKA_EXTRA_CONFIG:-}"

# Logging backend matching the slf4j 1.7 API that Kafka 3.x is compiled against.
# kafka_2.13 ships without a binding, so without these Kafka would log nothing.
KAFKA_SLF4J_VERSION="1.7.36"
KAFKA_RELOAD4J_VERSION="1.2.25"
# Pinned so that the build does not depend on the (old) default of the installed Maven.
KAFKA_DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Not KAFKA_HOME: that name is often exported for a real Kafka installation.
KAFKA_INSTALL_DIR="$CACHE_DIR/kafka-$KAFKA_VERSION"
KAFKA_LIB="$KAFKA_INSTALL_DIR/lib"
KAFKA_DIR="$STATE_DIR/kafka"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_LOGS="$KAFKA_DIR/logs"
KAFKA_PIDFILE="$KAFKA_DIR/kafka.pid"
KAFKA_CONFIG="$KAFKA_DIR/server.properties"
KAFKA_LOG4J="$KAFKA_DIR/log4j.properties"

kafka_address() { echo "127.0.0.1:$KAFKA_PORT"; }

kafka_logfile() {
    echo "$KAFKA_LOGS/server.log"
}

# --- installation -------------------------------------------------------------------

# The cache is trusted only if the marker written after a successful download exists
# and the number of jars still matches what it recorded.
_kafka_cache_ok() {
    local marker="$KAFKA_INSTALL_DIR/.complete" expected actual
    [[ -f "$marker" && -d "$KAFKA_LIB" ]] || return 1
    expected="$(sed -n 's/^jars=//p' "$marker")"
    actual="$(find "$KAFKA_LIB" -maxdepth 1 -name '*.jar' | wc -l)"
    [[ -n "$expected" && "$expected" -gt 0 && "$actual" -eq "$expected" ]]
}

_kafka_write_pom() {
    cat >"$1" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<!-- Only used to resolve the Kafka broker jars; see scripts/services.d/kafka.sh. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.services</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_$KAFKA_SCALA_VERSION</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>$KAFKA_SLF4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>ch.qos.reload4j</groupId>
      <artifactId>reload4j</artifactId>
      <version>$KAFKA_RELOAD4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
}

kafka_install() {
    if _kafka_cache_ok; then
        return 0
    fi
    case "$KAFKA_VERSION" in
        3.*) ;;
        *) die "KAFKA_VERSION=$KAFKA_VERSION is not supported (only Kafka 3.x)" ;;
    esac
    command -v mvn >/dev/null || die "kafka: Maven (mvn) is needed to fetch the Kafka jars"
    command -v java >/dev/null || die "kafka: java (17 or newer) is needed to run Kafka"

    log "installing Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIB"
    mkdir -p "$KAFKA_INSTALL_DIR"
    rm -f "$KAFKA_INSTALL_DIR/.complete"
    _kafka_write_pom "$KAFKA_INSTALL_DIR/pom.xml"

    # Download into a scratch directory and move it into place only once Maven has
    # succeeded, so an interrupted run never leaves a lib/ that looks usable.
    # Maven's own repository lives in the cache as well: nothing is written to ~/.m2
    # and deleting CACHE_DIR removes everything this downloaded.
    local staging="$KAFKA_INSTALL_DIR/lib.partial" mvn_log="$KAFKA_INSTALL_DIR/maven.log" jars
    rm -rf "$staging"
    # -q still lets Debian's Maven print colour escape codes, so the output goes to a
    # log file instead and is only shown when something went wrong.
    # -U: Maven remembers a failed download and would not retry it for a day; a retry
    # after a network hiccup should really retry.
    if ! mvn -B -U -f "$KAFKA_INSTALL_DIR/pom.xml" \
        -Dmaven.repo.local="$CACHE_DIR/m2" \
        "$KAFKA_DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$staging" >"$mvn_log" 2>&1; then
        # Show Maven's error lines minus its generic "re-run with -X" advice.
        grep -E '^\[(ERROR|FATAL)\] .' "$mvn_log" \
            | grep -vE 'To see the full|Re-run Maven|For more information|\[Help [0-9]+\] http' >&2 \
            || tail -n 30 "$mvn_log" >&2
        rm -rf "$staging"
        die "kafka: Maven could not fetch the Kafka $KAFKA_VERSION jars (full output: $mvn_log)"
    fi
    jars="$(find "$staging" -maxdepth 1 -name '*.jar' | wc -l)"
    [[ "$jars" -gt 0 ]] || die "kafka: Maven succeeded but produced no jars (see $mvn_log)"

    rm -rf "$KAFKA_LIB"
    mv "$staging" "$KAFKA_LIB"
    printf 'version=%s\njars=%s\n' "$KAFKA_VERSION" "$jars" >"$KAFKA_INSTALL_DIR/.complete"
    log "Kafka $KAFKA_VERSION installed ($jars jars)"
}

# --- configuration ------------------------------------------------------------------

_kafka_write_config() {
    mkdir -p "$KAFKA_DATA" "$KAFKA_LOGS"
    cat >"$KAFKA_CONFIG" <<CONF
# Generated by scripts/services on every start; edits here are overwritten.
process.roles=broker,controller
node.id=$KAFKA_NODE_ID
controller.quorum.voters=$KAFKA_QUORUM_VOTERS
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_DATA

# Replicas of the internal topics: a single node cannot hold more than one.
offsets.topic.replication.factor=$KAFKA_INTERNAL_REPLICATION
transaction.state.log.replication.factor=$KAFKA_INTERNAL_REPLICATION
transaction.state.log.min.isr=$(( KAFKA_INTERNAL_REPLICATION < 2 ? KAFKA_INTERNAL_REPLICATION : 2 ))
# The application creates its topics itself (with an explicit partition count); a typo
# in a topic name should fail instead of silently creating a one-partition topic.
auto.create.topics.enable=false
num.partitions=1
# No point in waiting for more consumers to join a group on a developer machine.
group.initial.rebalance.delay.ms=0
CONF
    [[ -z "$KAFKA_EXTRA_CONFIG" ]] || printf '%s\n' "$KAFKA_EXTRA_CONFIG" >>"$KAFKA_CONFIG"

    cat >"$KAFKA_LOG4J" <<CONF
# Generated by scripts/services on every start; edits here are overwritten.
# Everything goes to one size-capped file; the console is left for JVM crash output.
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=$(kafka_logfile)
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=3
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
# The same demotions Kafka's own config/log4j.properties makes for noisy loggers.
log4j.logger.kafka.request.logger=WARN
log4j.logger.kafka.network.RequestChannel\$=WARN
log4j.logger.kafka.authorizer.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
CONF
}

# Storage is formatted once; later starts reuse the data (and the cluster id in it).
_kafka_format_storage() {
    [[ -f "$KAFKA_DATA/meta.properties" ]] && return 0
    local cluster_id=$KAFKA_CLUSTER_ID
    log "formatting Kafka storage in $KAFKA_DATA"
    [[ -n "$cluster_id" ]] || cluster_id="$(java -Dlog4j.configuration="file:$KAFKA_LOG4J" \
        -cp "$KAFKA_LIB/*" kafka.tools.StorageTool random-uuid 2>>"$KAFKA_LOGS/format.log")" \
        || die "kafka: could not generate a cluster id (see $KAFKA_LOGS/format.log)"
    java -Dlog4j.configuration="file:$KAFKA_LOG4J" -cp "$KAFKA_LIB/*" \
        kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_CONFIG" \
        >>"$KAFKA_LOGS/format.log" 2>&1 \
        || { tail -n 20 "$KAFKA_LOGS/format.log" >&2; die "kafka: formatting the storage failed"; }
}

# --- process control ----------------------------------------------------------------

# The pid file is only believed if that pid is alive *and* is a Kafka JVM, so a pid
# recycled by an unrelated process (e.g. after a reboot) is never signalled.
_kafka_pid_alive() {
    is_pid_alive "$KAFKA_PIDFILE" || return 1
    local pid
    pid="$(cat "$KAFKA_PIDFILE")"
    [[ ! -r "/proc/$pid/cmdline" ]] || grep -qa 'kafka\.Kafka' "/proc/$pid/cmdline"
}

_kafka_probe() {
    "$PY" "$SCRIPT_DIR/probe.py" kafka "$(kafka_address)" 2>&1
}

_kafka_port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

_kafka_wait_ready() {
    # wait_ready only shows server.log; a JVM that dies before log4j is set up (bad
    # classpath, bad JVM flag) only writes to kafka.out, so show that as well.
    if ! (wait_ready kafka 120 "$KAFKA_PIDFILE" "$(kafka_logfile)"); then
        if [[ -s "$KAFKA_LOGS/kafka.out" ]]; then
            log "last lines of $KAFKA_LOGS/kafka.out:"
            tail -n 20 "$KAFKA_LOGS/kafka.out" >&2
        fi
        die "kafka did not become ready"
    fi
}

kafka_start() {
    # Two overlapping starts (e.g. two terminals) would both format the storage and
    # launch a JVM; the second one waits here and then finds Kafka running.
    mkdir -p "$KAFKA_DIR"
    local lock_fd
    exec {lock_fd}>"$KAFKA_DIR/start.lock"
    if command -v flock >/dev/null; then
        flock -w 300 "$lock_fd" || die "kafka: another start did not finish within 300s"
    fi
    _kafka_start_locked "$lock_fd"
    exec {lock_fd}>&-
}

_kafka_start_locked() {
    local lock_fd="$1"
    if _kafka_pid_alive; then
        if _kafka_probe >/dev/null; then
            log "kafka already running (pid $(cat "$KAFKA_PIDFILE"))"
            return 0
        fi
        # Alive but not answering: still booting, or wedged. Give it the usual time
        # rather than starting a second broker on the same data directory.
        log "kafka process $(cat "$KAFKA_PIDFILE") is up but not answering yet; waiting"
        _kafka_wait_ready
        return 0
    fi
    rm -f "$KAFKA_PIDFILE"

    local port
    for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
        if _kafka_port_busy "$port"; then
            die "kafka: 127.0.0.1:$port is already in use by a process not started by this script"
        fi
    done

    kafka_install
    _kafka_write_config
    _kafka_format_storage

    log "starting kafka $KAFKA_VERSION (logs: $KAFKA_LOGS)"
    local -a jvm_opts
    # shellcheck disable=SC2206  # KAFKA_HEAP is deliberately split into flags
    jvm_opts=($KAFKA_HEAP
        -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
        -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
        -Dlog4j.configuration="file:$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_LOGS")
    # A header line so that the tail of kafka.out shown on failure is about this start.
    echo "=== $(date '+%F %T') starting kafka $KAFKA_VERSION" >>"$KAFKA_LOGS/kafka.out"
    # setsid puts the JVM in a session of its own, so it gets neither the terminal's
    # SIGHUP nor a Ctrl-C aimed at the calling shell. The inner sh writes its own pid
    # and then execs java, so the pid file holds the JVM's pid even when setsid forks.
    # The lock fd is closed for the JVM, which would otherwise hold the lock forever.
    local launcher=()
    command -v setsid >/dev/null && launcher=(setsid)
    # shellcheck disable=SC2016  # $$ and $@ belong to the inner sh
    "${launcher[@]}" nohup sh -c 'echo $$ >"$0"; exec "$@"' "$KAFKA_PIDFILE" \
        java "${jvm_opts[@]}" -cp "$KAFKA_LIB/*" kafka.Kafka "$KAFKA_CONFIG" \
        </dev/null >>"$KAFKA_LOGS/kafka.out" 2>&1 {lock_fd}>&- &

    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$KAFKA_PIDFILE" ]] && break
        sleep 0.1
    done
    [[ -s "$KAFKA_PIDFILE" ]] || die "kafka: the JVM did not start (see $KAFKA_LOGS/kafka.out)"
    _kafka_wait_ready
}

kafka_stop() {
    if [[ ! -f "$KAFKA_PIDFILE" ]]; then
        log "kafka not running"
        return 0
    fi
    if ! _kafka_pid_alive; then
        log "kafka not running (removing stale pid file)"
        rm -f "$KAFKA_PIDFILE"
        return 0
    fi
    local pid i
    pid="$(cat "$KAFKA_PIDFILE")"
    log "stopping kafka (pid $pid)"
    # SIGTERM makes Kafka shut down cleanly (flush, close the log segments), which
    # spares the next start a log recovery.
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < KAFKA_STOP_TIMEOUT * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "kafka did not stop within ${KAFKA_STOP_TIMEOUT}s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$KAFKA_PIDFILE"
    log "kafka stopped"
}

kafka_wipe() {
    kafka_stop
    log "deleting kafka data in $KAFKA_DATA"
    rm -rf "$KAFKA_DATA"
}

kafka_status() {
    local out
    if _kafka_pid_alive; then
        if out="$(_kafka_probe)"; then
            echo "kafka: running (pid $(cat "$KAFKA_PIDFILE")): $out"
            return 0
        fi
        echo "kafka: process $(cat "$KAFKA_PIDFILE") alive but not answering: $out"
        return 1
    fi
    echo "kafka: stopped"
    return 1
}
