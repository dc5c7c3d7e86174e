# RabbitMQ from Debian's package, run as our own node (not the system service) so that
# tests get a known configuration: loopback only, its own data directory and ports.
# Sourced by scripts/services.

RABBITMQ_PORT=${RABBITMQ_PORT:-5672}
# Erlang distribution port of our node (the system default is 25672)
RABBITMQ_DIST_PORT=${RABBITMQ_DIST_PORT:-$((RABBITMQ_PORT + 20000))}

rabbitmq_address() { echo "127.0.0.1:$RABBITMQ_PORT"; }

rabbitmq_dir() { echo "$STATE_DIR/rabbitmq"; }

rabbitmq_logfile() { echo "$(rabbitmq_dir)/log/rabbit.log"; }

# Debian's rabbitmq-server and rabbitmqctl on PATH switch to the rabbitmq user; the scripts
# behind them run the node as whoever starts it, in our own directories.
rabbitmq_bin() {
    if [[ -x /usr/lib/rabbitmq/bin/$1 ]]; then echo "/usr/lib/rabbitmq/bin/$1"; else command -v "$1"; fi
}

rabbitmq_install() { "$SCRIPT_DIR/debian-install" rabbitmq-server; }

# The environment our node runs with: its name, ports, files, and no plugins.
rabbitmq_env() {
    local dir
    dir=$(rabbitmq_dir)
    export RABBITMQ_NODENAME="celery_scheduler_$RABBITMQ_PORT@localhost"
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$RABBITMQ_PORT
    export RABBITMQ_DIST_PORT ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log
    export RABBITMQ_PID_FILE=$dir/rabbitmq.pid RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
    export RABBITMQ_CONFIG_FILE=$dir/rabbitmq RABBITMQ_LOGS=$dir/log/rabbit.log
    export HOME=${HOME:-/root}
}

rabbitmq_start() {
    local dir pidfile
    dir=$(rabbitmq_dir)
    pidfile=$dir/rabbitmq.pid
    already_up rabbitmq "$pidfile" && return 0
    rabbitmq_install
    mkdir -p "$dir/log" "$dir/mnesia"
    echo "[]." > "$dir/enabled_plugins"
    # loopback only; the default guest user may connect from loopback
    printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users = none\n' "$RABBITMQ_PORT" > "$dir/rabbitmq.conf"
    # Erlang resolves every path against its working directory, and fails to start when that
    # directory is gone; run it from its own state directory, which outlives any checkout.
    # The whole subshell is redirected, not only the server: a subshell left holding our
    # stdout would keep a caller's pipe (`scripts/services up | tail`) open until the node stops.
    (cd "$dir" && rabbitmq_env && exec nohup "$(rabbitmq_bin rabbitmq-server)") \
        >"$dir/log/console.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 60); do [[ -s $pidfile ]] && break; sleep 0.5; done
    [[ -s $pidfile ]] || die "rabbitmq-server did not write $pidfile (log: $dir/log/console.log)"
    wait_ready rabbitmq 90 "$pidfile" "$dir/log/console.log"
}

rabbitmq_stop() {
    local dir pid waited=0
    dir=$(rabbitmq_dir)
    if ! is_pid_alive "$dir/rabbitmq.pid"; then
        log "rabbitmq is not running"
        return 0
    fi
    pid=$(<"$dir/rabbitmq.pid")
    # a clean stop (it removes its pid file), then the usual SIGTERM/SIGKILL if it hangs
    (rabbitmq_env; "$(rabbitmq_bin rabbitmqctl)" stop >/dev/null 2>&1) || true
    while kill -0 "$pid" 2>/dev/null && (( waited < 20 )); do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$pid" > "$dir/rabbitmq.pid"
        stop_pid rabbitmq "$dir/rabbitmq.pid" 10
    fi
    rm -f "$dir/rabbitmq.pid"
    log "rabbitmq stopped"
}

rabbitmq_status() { pid_status rabbitmq "$(rabbitmq_dir)/rabbitmq.pid" "$(rabbitmq_address)"; }

rabbitmq_wipe() { rm -rf "$(rabbitmq_dir)"; }
