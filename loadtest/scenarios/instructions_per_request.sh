#!/usr/bin/env bash
# Instructions per request of each proxy in the overhead scenario, counted exactly by
# valgrind's callgrind: tiergate (one worker thread), other builds of it when PREV names
# them (`PREV=/path/to/older/tiergate`, or several as `PREV="NAME=PATH NAME=PATH"`,
# each shown as tiergate_NAME), the bare hyper proxy with hyper-util's pooled client (bare_hyper) and with
# its inline HTTP/1 client (bare_inline), nginx with the overhead scenario's config
# (in one process: master_process off) and HAProxy (one thread, keep-alive both sides,
# `http-reuse always`), each in front of the same simulator. Each proxy runs under
# callgrind and is warmed up; then its counters are zeroed and dumped twice: once over
# a window of N/50 seconds with no request (the idle background: timers, sweeps,
# upkeep), once over the same length serving N requests at 50/s. The first figure is
# every user-space instruction of the busy window (all threads) divided by N; the
# second, the path's own, subtracts the idle window's. For tiergate the inclusive cost
# of each stage of the path follows (door, body check, dispatch and classification,
# tier, pool and endpoint pick, the HTTP/1 exchange with the backend).
#
# Unlike CPU time or latency, the count does not depend on what else the machine is
# doing, so it compares two builds exactly, in one run or across runs. It does not see
# the kernel (system calls), caches or waiting: it is the size of the proxy's own work.
#
#   loadtest/scenarios/instructions_per_request.sh [N]   (default 500)
#
# Prints one line per target, then the functions with the most instructions per
# request in tiergate, and writes both to $OUT (default
# target/loadtest/instructions_per_request)/summary.txt with the callgrind files.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-500}
RATE=50
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/instructions_per_request}

if ! command -v valgrind >/dev/null; then
  scripts/apt-install.sh valgrind
fi
if ! command -v nginx >/dev/null; then
  scripts/apt-install.sh nginx-light
fi
if ! command -v haproxy >/dev/null; then
  scripts/apt-install.sh haproxy
fi
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-trt 2>"$WORK/sim.log" & PIDS+=($!)
realtime_policy "http://127.0.0.1:$SIM"
wait_ready "$SIM" /v2/health/ready
mkdir -p "$OUT"
rm -f "$OUT"/*.callgrind

# count NAME VAR=VALUE COMMAND...: runs COMMAND (a proxy on $PORT) under callgrind with
# VAR set, and prints its instructions per request, raw and with the idle window's
# subtracted, then the inclusive cost of each of $STAGES (NAME=REGEX, for tiergate).
count() {
  local name=$1 setting=$2; shift 2
  env "$setting" valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.out" --compress-strings=no --compress-pos=no \
    "$@" 2>"$WORK/$name.valgrind.log" &
  local pid=$!
  PIDS+=("$pid")
  wait_ready "$PORT" /v2/health/ready 60
  "$BIN/loadtest" run --url "http://127.0.0.1:$PORT" --model resnet50 --rate 20 --duration 5s --warmup 0s \
    --budget-ms 2000 >/dev/null 2>&1
  # The idle window, as long as the busy one: what the process does with nothing to serve.
  callgrind_control -z "$pid" >/dev/null 2>&1
  sleep "$((N / RATE))"
  callgrind_control -d "$pid" >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$BIN/loadtest" run --url "http://127.0.0.1:$PORT" --model resnet50 --rate "$RATE" --duration "$((N / RATE))s" \
    --warmup 0s --budget-ms 2000 >"$WORK/$name.load.txt" 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  # The dumps made by callgrind_control are parts 1 (idle) and 2 (busy); the one at exit
  # is not used.
  mv "$WORK/$name.out.1" "$OUT/$name.idle.callgrind"
  mv "$WORK/$name.out.2" "$OUT/$name.callgrind"
  local stages=()
  for stage in ${STAGES:-}; do stages+=(--stage "$stage"); done
  python3 loadtest/scenarios/callgrind_self.py "$OUT/$name.callgrind" "$N" 0 --idle "$OUT/$name.idle.callgrind" \
    "${stages[@]}" | sed "s/^/$name /"
  STAGES=
}

# The stages of tiergate's real-time path, by the functions that begin them.
TIERGATE_STAGES="door=HttpDoor::(answer|route)::\{\{closure\}\}$ body_check=inspect_request$ dispatch=Dispatch::serve::\{\{closure\}\}$
tier=Tiers::serve::\{\{closure\}\}$ pool=Pool::forward(_marked)?::\{\{closure\}\}$ h1_exchange=h1::Conns::(send_or_back|exchange)::\{\{closure\}\}$"

gateway() { # gateway BINARY NAME
  PORT=$(free_port)
  STAGES=$TIERGATE_STAGES
  count "$2" TIERGATE_THREADS__WORKERS=1 "$1" serve --policy-dir "$WORK/policy" --data-dir "$WORK/$2" \
    --http "127.0.0.1:$PORT" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$(free_port)"
}
bare() { # bare CLIENT NAME
  PORT=$(free_port)
  count "$2" TOKIO_WORKER_THREADS=1 "$BIN/bare_proxy" "127.0.0.1:$PORT" "127.0.0.1:$SIM" "$1"
}

{
  echo "Instructions per request at $RATE/s, $N requests per target (callgrind; user space, all threads)"
  gateway "$BIN/tiergate" tiergate
  for prev in ${PREV:-}; do
    case $prev in
      *=*) gateway "${prev#*=}" "tiergate_${prev%%=*}" ;;
      *) gateway "$prev" tiergate_prev ;;
    esac
  done
  bare legacy bare_hyper
  bare inline bare_inline
  PORT=$(free_port)
  nginx_config "$PORT" "$SIM" http
  sed -i '1i master_process off;' "$WORK/nginx/nginx.conf"
  count nginx NGINX=1 nginx -c "$WORK/nginx/nginx.conf"
  PORT=$(free_port)
  haproxy_config "$PORT" "$SIM"
  count haproxy HAPROXY=1 haproxy -db -f "$WORK/haproxy/haproxy.cfg"
  echo
  echo "tiergate: the functions with the most instructions of their own, per request"
  python3 loadtest/scenarios/callgrind_self.py "$OUT/tiergate.callgrind" "$N" 25 | tail -n +2
} | tee "$OUT/summary.txt"
