# shellcheck shell=bash
# Apache Cassandra for local development: one node answering CQL on
# $CASSANDRA_ADDRESS:$CASSANDRA_PORT (127.0.0.1:9042).
#
# Sourced by scripts/services, which provides CACHE_DIR, STATE_DIR, SCRIPT_DIR and PY, and the
# helpers log, die, is_pid_alive and wait_ready.
#
# No Cassandra tarball is used: the server is assembled from org.apache.cassandra:cassandra-all
# and its runtime dependencies on Maven Central (fetched with mvn) and started directly with
# java, using the flags that bin/cassandra, cassandra-env.sh and conf/jvm17-server.options would
# have given it. The jar carries no cassandra.yaml or logback.xml, so both are written here.
#
# Overrides:
#   CASSANDRA_VERSION  cassandra-all version (default: the latest 5.0.x when this was written)
#   CASSANDRA_HEAP     JVM heap flags (default: -Xms512m -Xmx1g)
#   CASSANDRA_JVM_OPTS extra JVM flags, appended after the ones below
#   CASSANDRA_JAVA     java binary; Cassandra 5.0 runs on Java 11 or 17 only
#                      (default: $JAVA_HOME/bin/java, else java on PATH)
#   CASSANDRA_PORT, CASSANDRA_STORAGE_PORT, CASSANDRA_JMX_PORT
#                      CQL (9042), gossip (7000) and JMX (7199) ports; a second instance
#                      beside the first needs other ports and its own CELERY_SCHEDULER_STATE
#
# One node of a multi-node cluster (scripts/cassandra-cluster starts several):
#   CASSANDRA_ADDRESS  listen and CQL address (127.0.0.1); JMX stays on 127.0.0.1
#   CASSANDRA_SEEDS    seeds, host:port,... (default this node alone)
#   CASSANDRA_CLUSTER_NAME  (celery-scheduler-dev); nodes of other names are refused
#   CASSANDRA_INITIAL_TOKEN  this node's token (default: one chosen at first start)
#   CASSANDRA_COMMITLOG_SYNC periodic (every 10 s, the default), group (within 15 ms) or
#                      batch: when a write is on disk, and with group or batch, acknowledged
# Unset, they give the single node described above.

: "${CASSANDRA_VERSION:=5.0.9}"
: "${CASSANDRA_HEAP:=-Xms512m -Xmx1g}"
: "${CASSANDRA_PORT:=9042}"
: "${CASSANDRA_STORAGE_PORT:=7000}"
: "${CASSANDRA_JMX_PORT:=7199}"
: "${CASSANDRA_ADDRESS:=127.0.0.1}"
: "${CASSANDRA_SEEDS:=$CASSANDRA_ADDRESS:$CASSANDRA_STORAGE_PORT}"
: "${CASSANDRA_CLUSTER_NAME:=celery-scheduler-dev}"
: "${CASSANDRA_INITIAL_TOKEN:=}"
: "${CASSANDRA_COMMITLOG_SYNC:=periodic}"

CASSANDRA_MAVEN_DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

cassandra_address() { echo "$CASSANDRA_ADDRESS:$CASSANDRA_PORT"; }
cassandra_home() { echo "$CACHE_DIR/cassandra-$CASSANDRA_VERSION"; }
cassandra_dir() { echo "$STATE_DIR/cassandra"; }
cassandra_pidfile() { echo "$(cassandra_dir)/cassandra.pid"; }
cassandra_logfile() { echo "$(cassandra_dir)/logs/system.log"; }

_cassandra_jar_count() {
    local jars=("$1"/*.jar)
    [[ -e ${jars[0]} ]] || { echo 0; return; }
    echo "${#jars[@]}"
}

# True when the jars in the cache were fully fetched: the marker is only written after Maven
# succeeded, and it records the jar count so a lib dir damaged later is not trusted either.
_cassandra_installed() {
    local home lib
    home="$(cassandra_home)"
    lib="$home/lib"
    [[ -f $home/.complete && -f $lib/cassandra-all-$CASSANDRA_VERSION.jar ]] || return 1
    [[ "$(<"$home/.complete")" == "$(_cassandra_jar_count "$lib")" ]]
}

cassandra_install() {
    _cassandra_installed && return 0
    command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch Cassandra's jars"

    local home lib count
    home="$(cassandra_home)"
    lib="$home/lib"
    log "fetching Cassandra $CASSANDRA_VERSION jars from Maven Central into $lib"
    rm -rf "$lib" "$lib.partial" "$home/.complete"
    mkdir -p "$home"
    cat >"$home/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.services</groupId>
  <artifactId>cassandra-server</artifactId>
  <version>$CASSANDRA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>$CASSANDRA_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    # Copy into a side directory and rename it only once Maven succeeded, so an interrupted
    # download never looks like an installed one. The plugin version is pinned because Maven
    # would otherwise pick whatever it resolves on the day.
    # With -q Maven prints only errors, but Debian's build still emits colour-reset codes, so
    # its output goes to a file that is shown only on failure.
    # Maven's own repository lives in the cache too (as for Kafka), so removing the cache
    # directory removes everything; -U retries downloads Maven remembers as failed.
    if ! mvn -B -q -U -f "$home/pom.xml" "$CASSANDRA_MAVEN_DEPENDENCY_PLUGIN:copy-dependencies" \
        -Dmaven.repo.local="$CACHE_DIR/m2" \
        -DincludeScope=runtime -DoutputDirectory="$lib.partial" >"$home/maven.log" 2>&1; then
        cat "$home/maven.log" >&2
        die "Maven could not fetch cassandra-all $CASSANDRA_VERSION and its dependencies"
    fi
    count="$(_cassandra_jar_count "$lib.partial")"
    [[ -f $lib.partial/cassandra-all-$CASSANDRA_VERSION.jar ]] \
        || die "Maven finished but cassandra-all-$CASSANDRA_VERSION.jar is missing from $lib.partial"
    mv "$lib.partial" "$lib"
    echo "$count" >"$home/.complete"
    log "cassandra $CASSANDRA_VERSION: $count jars in $lib"
}

# Prints the pid if the pid file names a live Cassandra JVM. Checking the command line guards
# against a stale pid file whose pid now belongs to another process.
_cassandra_pid() {
    local pidfile pid args
    pidfile="$(cassandra_pidfile)"
    is_pid_alive "$pidfile" || return 1
    pid="$(<"$pidfile")"
    args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
    [[ $args == *org.apache.cassandra.service.CassandraDaemon* ]] || return 1
    echo "$pid"
}

# kill -0 also succeeds on a zombie, which can linger if nothing reaps the detached JVM.
_cassandra_proc_alive() {
    local stat
    stat="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
    [[ -n $stat && $stat != Z* ]]
}

_cassandra_java() {
    local java version major
    if [[ -n ${CASSANDRA_JAVA:-} ]]; then
        java="$CASSANDRA_JAVA"
    elif [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
        java="$JAVA_HOME/bin/java"
    else
        java="$(command -v java)" || die "java not found: Cassandra 5.0 needs Java 17 (or 11)"
    fi
    version="$("$java" -version 2>&1)" || die "$java -version failed"
    [[ $version =~ version\ \"([0-9]+) ]] || die "cannot tell the version of $java"
    major="${BASH_REMATCH[1]}"
    # Cassandra 5.0 refuses other Java versions at startup; say so before launching.
    [[ $major == 17 || $major == 11 ]] \
        || die "$java is Java $major; Cassandra 5.0 needs Java 17 or 11 (set CASSANDRA_JAVA)"
    echo "$java"
}

# The commit log settings of CASSANDRA_COMMITLOG_SYNC, each mode with its own window.
_cassandra_commitlog_config() {
    case $CASSANDRA_COMMITLOG_SYNC in
        periodic) printf 'commitlog_sync: periodic\ncommitlog_sync_period: 10000ms\n' ;;
        group) printf 'commitlog_sync: group\ncommitlog_sync_group_window: 15ms\n' ;;
        batch) printf 'commitlog_sync: batch\n' ;;
        *) die "CASSANDRA_COMMITLOG_SYNC=$CASSANDRA_COMMITLOG_SYNC: use periodic, group or batch" ;;
    esac
}

_cassandra_write_config() {
    local dir="$1" data="$1/data" logs="$1/logs" conf="$1/conf" commitlog
    commitlog="$(_cassandra_commitlog_config)"
    cat >"$conf/cassandra.yaml" <<EOF
# Generated by scripts/services on each start; edits here are overwritten.
# One development node; anything not set here keeps Cassandra's built-in default.
cluster_name: $CASSANDRA_CLUSTER_NAME
num_tokens: 1
${CASSANDRA_INITIAL_TOKEN:+initial_token: $CASSANDRA_INITIAL_TOKEN}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "$CASSANDRA_SEEDS"
listen_address: $CASSANDRA_ADDRESS
rpc_address: $CASSANDRA_ADDRESS
storage_port: $CASSANDRA_STORAGE_PORT
native_transport_port: $CASSANDRA_PORT
start_native_transport: true

# A node created by 5.0 has no 4.x nodes or sstables to stay compatible with.
storage_compatibility_mode: NONE

data_file_directories:
  - $data/data
commitlog_directory: $data/commitlog
saved_caches_directory: $data/saved_caches
hints_directory: $data/hints
cdc_raw_directory: $data/cdc_raw

$commitlog

# Keep the footprint small: two cores shared with other services, small data sets.
concurrent_reads: 4
concurrent_writes: 4
concurrent_counter_writes: 4
concurrent_materialized_view_writes: 4
concurrent_compactors: 1
memtable_flush_writers: 1
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
key_cache_size: 8MiB
counter_cache_size: 4MiB
file_cache_size: 32MiB

# Dropping or truncating tables is routine in development; no snapshot of each.
auto_snapshot: false
snapshot_before_compaction: false
EOF
    cat >"$conf/logback.xml" <<EOF
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>$logs/system.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>$logs/system.log.%i.zip</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>5</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>20MB</maxFileSize>
    </triggeringPolicy>
    <encoder>
      <pattern>%-5level [%thread] %date{ISO8601} %logger{0} - %msg%n</pattern>
    </encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
EOF
}

cassandra_start() {
    local dir pidfile logfile pid out java lib jamm before
    dir="$(cassandra_dir)"
    pidfile="$(cassandra_pidfile)"
    logfile="$(cassandra_logfile)"

    if pid="$(_cassandra_pid)"; then
        if "$PY" "$SCRIPT_DIR/probe.py" cassandra "$(cassandra_address)" >/dev/null 2>&1; then
            log "cassandra already running (pid $pid)"
            return 0
        fi
        # Most likely a start still in progress; a second JVM would only fail on the ports.
        log "cassandra (pid $pid) is up but not answering yet; waiting for it"
        wait_ready cassandra 240 "$pidfile" "$logfile"
        return 0
    fi
    rm -f "$pidfile"
    if out="$("$PY" "$SCRIPT_DIR/probe.py" cassandra "$(cassandra_address)" 2>/dev/null)"; then
        die "something not started by this script already answers: $out"
    fi

    cassandra_install
    java="$(_cassandra_java)"
    lib="$(cassandra_home)/lib"
    jamm=("$lib"/jamm-*.jar)
    [[ -f ${jamm[0]} ]] || die "no jamm jar in $lib"

    mkdir -p "$dir/conf" "$dir/conf/triggers" "$dir/data" "$dir/logs"
    # Native libraries (JNA, snappy, zstd, netty) unpack into java.io.tmpdir; a private one
    # avoids failing on a noexec /tmp, and a failed JNA load is fatal to Cassandra.
    rm -rf "$dir/tmp"
    mkdir -p "$dir/tmp"
    _cassandra_write_config "$dir"

    # shellcheck disable=SC2206  # CASSANDRA_HEAP and CASSANDRA_JVM_OPTS are split on purpose
    local opts=(
        $CASSANDRA_HEAP
        -Xss256k
        -XX:+UseG1GC
        -XX:+ParallelRefProcEnabled
        -XX:MaxTenuringThreshold=1
        -XX:+PerfDisableSharedMem
        -XX:+ExitOnOutOfMemoryError
        "-XX:ErrorFile=$dir/logs/hs_err_%p.log"
        -ea -da:net.openhft...
        -Djava.net.preferIPv4Stack=true
        # jamm (object sizes for memtable accounting) runs as an agent, as bin/cassandra sets it up.
        "-javaagent:${jamm[0]}"
        # JPMS openings Cassandra needs on Java 11+ (conf/jvm17-server.options).
        -Djdk.attach.allowAttachSelf=true
        --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
        --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
        --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
        --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
        --add-exports java.sql/java.sql=ALL-UNNAMED
        --add-exports java.base/java.lang.ref=ALL-UNNAMED
        --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
        --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
        --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
        --add-opens java.base/java.lang.module=ALL-UNNAMED
        --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
        --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
        --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
        --add-opens java.base/jdk.internal.math=ALL-UNNAMED
        --add-opens java.base/jdk.internal.module=ALL-UNNAMED
        --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
        --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
        --add-opens java.base/sun.nio.ch=ALL-UNNAMED
        --add-opens java.base/java.io=ALL-UNNAMED
        --add-opens java.base/java.lang.reflect=ALL-UNNAMED
        --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
        --add-opens java.base/java.lang=ALL-UNNAMED
        --add-opens java.base/java.util=ALL-UNNAMED
        --add-opens java.base/java.nio=ALL-UNNAMED
        -Dio.netty.tryReflectionSetAccessible=true
        -Dio.netty.allocator.useCacheForAllThreads=true
        -Dio.netty.allocator.maxOrder=11
        # Without this flag the daemon closes stdout/stderr, hiding late JVM errors.
        -Dcassandra-foreground=yes
        # cassandra.config must be a URL: a bare path is rejected.
        "-Dcassandra.config=file://$dir/conf/cassandra.yaml"
        "-Dcassandra.storagedir=$dir/data"
        "-Dcassandra.logdir=$dir/logs"
        "-Dcassandra.triggers_dir=$dir/conf/triggers"
        "-Dlogback.configurationFile=$dir/conf/logback.xml"
        "-Djava.io.tmpdir=$dir/tmp"
        "-Djna.tmpdir=$dir/tmp"
        # JMX on localhost only, for nodetool, which runs from the same jars:
        #   java --add-exports java.base/sun.nio.ch=ALL-UNNAMED --add-exports \
        #     java.base/jdk.internal.ref=ALL-UNNAMED -cp "<lib>/*" \
        #     org.apache.cassandra.tools.NodeTool -p 7199 status
        "-Dcassandra.jmx.local.port=$CASSANDRA_JMX_PORT"
        # A lone seed has no peers to wait for: skip the gossip settle and ring delays.
        -Dcassandra.skip_wait_for_gossip_to_settle=0
        -Dcassandra.ring_delay_ms=0
        ${CASSANDRA_JVM_OPTS:-}
        -cp "$lib/*"
        org.apache.cassandra.service.CassandraDaemon
    )

    # Cassandra always calls mlockall() at startup. As an unprivileged user that fails on the
    # usual small RLIMIT_MEMLOCK (a harmless warning in the log), but as root it succeeds and
    # pins the whole committed heap in RAM. On a shared development machine, drop the
    # capability that lets root lock memory, when setpriv is there to do it.
    local launch=(nohup setsid)
    if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
        launch+=(setpriv --bounding-set -ipc_lock --)
    fi

    log "starting cassandra $CASSANDRA_VERSION (log: $logfile)"
    before="$(stat -c %s "$logfile" 2>/dev/null || echo 0)"
    # setsid puts the JVM in its own session so Ctrl-C or the end of the calling shell does
    # not reach it. The inner bash records its own pid and then becomes java (exec), which
    # stays correct whether or not setsid had to fork.
    (
        cd "$dir" || exit 1
        ulimit -S -l 8192 2>/dev/null || true
        # shellcheck disable=SC2016  # $$ and $@ are for the inner bash
        "${launch[@]}" bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$java" "${opts[@]}" \
            >>"$dir/logs/stdout.log" 2>&1 </dev/null &
    )
    for _ in $(seq 50); do
        [[ -s $pidfile ]] && break
        sleep 0.1
    done
    [[ -s $pidfile ]] || die "cassandra did not start (no pid file); see $dir/logs/stdout.log"

    # A bad JVM flag or a broken classpath kills the JVM before logging starts, so the reason
    # is only in stdout.log, which wait_ready does not show. Wait for system.log to grow.
    for _ in $(seq 100); do
        (($(stat -c %s "$logfile" 2>/dev/null || echo 0) > before)) && break
        if ! is_pid_alive "$pidfile"; then
            tail -n 30 "$dir/logs/stdout.log" >&2 || true
            die "cassandra exited at once; see $dir/logs/stdout.log"
        fi
        sleep 0.1
    done

    # The tail that wait_ready shows on failure is mostly the shutdown hook; the cause is the
    # ERROR logged earlier, so on failure show the errors of this run as well.
    if ! (wait_ready cassandra 240 "$pidfile" "$logfile"); then
        tail -c +"$((before + 1))" "$logfile" | grep -A 3 '^ERROR' | tail -n 20 >&2 || true
        die "cassandra failed to start; full log: $logfile"
    fi
}

cassandra_stop() {
    local pidfile pid
    pidfile="$(cassandra_pidfile)"
    if ! pid="$(_cassandra_pid)"; then
        log "cassandra not running"
        rm -f "$pidfile"
        return 0
    fi
    # SIGTERM runs Cassandra's shutdown hook, which drains: memtables are flushed, so the next
    # start replays no commit log.
    log "stopping cassandra (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 120); do
        _cassandra_proc_alive "$pid" || break
        sleep 0.5
    done
    if _cassandra_proc_alive "$pid"; then
        log "cassandra (pid $pid) still running after 60 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 10); do
            _cassandra_proc_alive "$pid" || break
            sleep 1
        done
    fi
    rm -f "$pidfile"
    log "cassandra stopped"
}

cassandra_wipe() {
    cassandra_stop
    log "deleting cassandra data in $(cassandra_dir)/data"
    rm -rf "$(cassandra_dir)/data"
}

cassandra_status() {
    local pid out
    if ! pid="$(_cassandra_pid)"; then
        echo "cassandra: stopped"
        return 1
    fi
    if out="$("$PY" "$SCRIPT_DIR/probe.py" cassandra "$(cassandra_address)" 2>&1)"; then
        echo "cassandra: running (pid $pid): $out"
        return 0
    fi
    echo "cassandra: pid $pid alive but not answering: $out"
    return 1
}
