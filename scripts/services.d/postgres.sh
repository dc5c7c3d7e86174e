# PostgreSQL from Debian's package, run as our own server (not the system cluster) so that
# the benchmarks get a known configuration: loopback only, its own data directory and port,
# no Unix socket, no password for local connections. Not a default service: celery_scheduler
# does not need it, only the benchmark's peer procrastinate does (`scripts/services up postgres`).
# Sourced by scripts/services.

POSTGRES_PORT=${POSTGRES_PORT:-5432}
# the server refuses to run as root; as root we run it as this user (Debian's package makes it)
POSTGRES_RUN_AS=${POSTGRES_RUN_AS:-postgres}

postgres_address() { echo "127.0.0.1:$POSTGRES_PORT"; }

postgres_dir() { echo "$STATE_DIR/postgres"; }

postgres_logfile() { echo "$(postgres_dir)/postgres.log"; }

postgres_install() { "$SCRIPT_DIR/debian-install" postgresql; }

# The newest server Debian installed (/usr/lib/postgresql/<major>/bin).
postgres_bin() {
    local bin
    bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
    [[ -x $bin/postgres && -x $bin/initdb ]] || die "no PostgreSQL server under /usr/lib/postgresql (scripts/debian-install postgresql)"
    echo "$bin"
}

# The command prefix that runs a program as the server's user: nothing, or setpriv to
# POSTGRES_RUN_AS when we are root (setpriv execs, so the server keeps the pid we start).
postgres_as_prefix() {
    PG_AS=()
    [[ $(id -u) -eq 0 ]] || return 0
    id -u "$POSTGRES_RUN_AS" >/dev/null 2>&1 \
        || die "PostgreSQL will not run as root and user '$POSTGRES_RUN_AS' does not exist; set POSTGRES_RUN_AS to an unprivileged user"
    [[ $(id -u "$POSTGRES_RUN_AS") -ne 0 ]] || die "POSTGRES_RUN_AS=$POSTGRES_RUN_AS is root; PostgreSQL needs an unprivileged user"
    command -v setpriv >/dev/null || die "setpriv not found (Debian: util-linux); it runs PostgreSQL as $POSTGRES_RUN_AS"
    PG_AS=(setpriv --reuid="$POSTGRES_RUN_AS" --regid="$(id -g "$POSTGRES_RUN_AS")" --init-groups --)
}

postgres_as() { postgres_as_prefix; "${PG_AS[@]}" "$@"; }

# Where the cluster's files live: under the state directory, unless the server's user cannot
# reach it (a root-only home such as /root); then in /var/lib, named after the port.
postgres_data() {
    local dir
    dir=$(postgres_dir)
    if [[ -n ${POSTGRES_DATA:-} ]]; then
        echo "$POSTGRES_DATA"
    elif [[ $(id -u) -ne 0 ]] || postgres_as test -x "$dir"; then
        echo "$dir/data"
    else
        echo "/var/lib/celery-scheduler/postgres-$POSTGRES_PORT"  # postgres_wipe removes it too
    fi
}

# initdb on first start: superuser "postgres", trust on loopback (the server listens nowhere else).
postgres_init() {
    local data=$1 bin=$2
    [[ -s $data/PG_VERSION ]] && return 0
    log "creating a PostgreSQL cluster in $data"
    mkdir -p "$data"
    [[ $(id -u) -ne 0 ]] || chown "$POSTGRES_RUN_AS:" "$data"
    chmod 700 "$data"
    (cd "$(dirname "$data")" && postgres_as "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 \
        --locale=C) >>"$(postgres_logfile)" 2>&1 || die "initdb failed (log: $(postgres_logfile))"
}

postgres_start() {
    local dir pidfile data bin
    dir=$(postgres_dir)
    pidfile=$dir/postgres.pid
    already_up postgres "$pidfile" && return 0
    postgres_install
    postgres_as_prefix  # fail here, with its message, when there is no user to run the server as
    bin=$(postgres_bin)
    mkdir -p "$dir"
    data=$(postgres_data)
    postgres_init "$data" "$bin"
    # where to look, when it lives elsewhere
    [[ $data == "$dir/data" || -d $dir/data ]] || ln -sfn "$data" "$dir/data"
    # Run from its own state directory (the one holding its data): the caller's working
    # directory may be gone, or unreadable to the server's user. Every step execs, so $! is
    # the server's pid. 200 connections: each benchmark worker holds a small pool.
    postgres_as_prefix
    (cd "$(dirname "$data")" && exec nohup "${PG_AS[@]}" "$bin/postgres" -D "$data" \
        -c listen_addresses=127.0.0.1 -c port="$POSTGRES_PORT" -c unix_socket_directories= \
        -c max_connections=200) >>"$(postgres_logfile)" 2>&1 &
    echo $! > "$pidfile"
    wait_ready postgres 60 "$pidfile" "$(postgres_logfile)"
}

# SIGINT is PostgreSQL's fast shutdown: it ends open sessions instead of waiting for them.
postgres_stop() {
    local pidfile pid waited=0
    pidfile=$(postgres_dir)/postgres.pid
    if is_pid_alive "$pidfile"; then
        pid=$(<"$pidfile")
        kill -INT "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && (( waited < 30 )); do sleep 1; waited=$((waited + 1)); done
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$pidfile"
            log "postgres stopped"
            return 0
        fi
    fi
    stop_pid postgres "$pidfile" 10
}

postgres_status() { pid_status postgres "$(postgres_dir)/postgres.pid" "$(postgres_address)"; }

postgres_wipe() {
    [[ -z ${POSTGRES_DATA:-} ]] || rm -rf "$POSTGRES_DATA"
    rm -rf "$(postgres_dir)" "/var/lib/celery-scheduler/postgres-$POSTGRES_PORT"
}
