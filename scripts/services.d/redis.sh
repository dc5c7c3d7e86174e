# Redis from Debian's package, run as our own process (not the system service) so that
# tests get a known configuration: loopback only, no persistence.
# Sourced by scripts/services.

REDIS_PORT=${REDIS_PORT:-6379}

redis_address() { echo "127.0.0.1:$REDIS_PORT"; }

redis_dir() { echo "$STATE_DIR/redis"; }

redis_logfile() { echo "$(redis_dir)/redis.log"; }

redis_install() { "$SCRIPT_DIR/debian-install" redis-server; }

redis_start() {
    local dir pidfile
    dir=$(redis_dir)
    pidfile=$dir/redis.pid
    already_up redis "$pidfile" && return 0
    redis_install
    mkdir -p "$dir"
    # `--save ''` and `--appendonly no`: test data need not survive a restart.
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
        --pidfile "$pidfile" --logfile "$(redis_logfile)" --dir "$dir" \
        --save '' --appendonly no --protected-mode yes \
        || die "redis-server failed to start (log: $(redis_logfile))"
    # With --daemonize the pid file appears a moment after the command returns.
    local i
    for i in 1 2 3 4 5 6 7 8 9 10; do [[ -s $pidfile ]] && break; sleep 0.2; done
    wait_ready redis 30 "$pidfile" "$(redis_logfile)"
}

redis_stop() { stop_pid redis "$(redis_dir)/redis.pid" 10; }

redis_status() { pid_status redis "$(redis_dir)/redis.pid" "$(redis_address)"; }

redis_wipe() { rm -rf "$(redis_dir)"; }
