#!/usr/bin/env bash
# A throwaway Spark standalone cluster on 127.0.0.1 from pyspark's bundled jars: one master
# and one worker, for trying `qrouter-tool audit --master spark://127.0.0.1:7077` locally.
#
#   tools/audit/standalone.sh start [WORKER_CORES] [WORKER_MEMORY]   # default 2, 4g
#   tools/audit/standalone.sh status
#   tools/audit/standalone.sh stop
#
# State (pid files, logs) lives in ${QROUTER_SPARK_STATE:-/tmp/qrouter-spark-standalone}.
# Ports: master 7077 (web UI 8080), worker web UI 8081; override with SPARK_MASTER_PORT.
set -euo pipefail

PYTHON=${PYTHON:-python3}
STATE=${QROUTER_SPARK_STATE:-/tmp/qrouter-spark-standalone}
PORT=${SPARK_MASTER_PORT:-7077}
HOST=127.0.0.1
URL="spark://$HOST:$PORT"

spark_home() {
    "$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

wait_for_port() {
    local port=$1 deadline=$((SECONDS + 60))
    until (exec 3<>"/dev/tcp/$HOST/$port") 2>/dev/null; do
        if ((SECONDS > deadline)); then
            echo "standalone: nothing listens on $HOST:$port after 60 s" >&2
            return 1
        fi
        sleep 0.5
    done
}

running() {
    [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null
}

start() {
    local cores=${1:-2} memory=${2:-4g} home
    home=$(spark_home)
    mkdir -p "$STATE"
    export SPARK_HOME="$home" SPARK_LOCAL_IP="$HOST" SPARK_LOG_DIR="$STATE"
    export SPARK_WORKER_DIR="$STATE/work"
    if ! running master; then
        "$home/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host "$HOST" --port "$PORT" --webui-port 8080 >"$STATE/master.log" 2>&1 &
        echo $! >"$STATE/master.pid"
    fi
    wait_for_port "$PORT"
    if ! running worker; then
        "$home/bin/spark-class" org.apache.spark.deploy.worker.Worker "$URL" \
            --host "$HOST" --cores "$cores" --memory "$memory" --webui-port 8081 \
            >"$STATE/worker.log" 2>&1 &
        echo $! >"$STATE/worker.pid"
    fi
    # The worker has registered once the master logs it.
    local deadline=$((SECONDS + 60))
    until grep -q "Registering worker" "$STATE/master.log" 2>/dev/null; do
        if ((SECONDS > deadline)); then
            echo "standalone: the worker did not register; see $STATE/worker.log" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "standalone: master $URL (web UI http://$HOST:8080), worker $cores cores / $memory"
}

stop() {
    local name
    for name in worker master; do
        if running "$name"; then
            kill "$(cat "$STATE/$name.pid")"
        fi
        rm -f "$STATE/$name.pid"
    done
    echo "standalone: stopped"
}

status() {
    local name
    for name in master worker; do
        if running "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
    done
}

case ${1:-} in
    start) shift; start "$@" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start [CORES] [MEMORY] | status | stop" >&2; exit 2 ;;
esac
