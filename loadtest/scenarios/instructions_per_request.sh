#!/usr/bin/env bash
# Instructions per request of each proxy in the overhead scenario, counted exactly by
# valgrind's callgrind: tiergate (one worker thread), PREV=/path/to/older/tiergate when
# given, the bare hyper proxy with hyper-util's pooled client (bare_hyper) and with
# its inline HTTP/1 client (bare_inline), and nginx with the overhead scenario's config
# (in one process: master_process off), each in front of the same simulator. Each
# proxy runs under callgrind, is warmed up, has its counters zeroed, serves N requests
# at 50/s, and is dumped; the count is every user-space instruction the process ran in
# that window (all threads, background work included) divided by N.
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
# VAR set, and prints its instructions per request.
count() {
  local name=$1 setting=$2; shift 2
  env "$setting" valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.out" --compress-strings=no --compress-pos=no \
    "$@" 2>"$WORK/$name.valgrind.log" &
  local pid=$!
  PIDS+=("$pid")
  wait_ready "$PORT" /v2/health/ready 60
  "$BIN/loadtest" run --url "http://127.0.0.1:$PORT" --model resnet50 --rate 20 --duration 5s --warmup 0s \
    --budget-ms 2000 >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$BIN/loadtest" run --url "http://127.0.0.1:$PORT" --model resnet50 --rate "$RATE" --duration "$((N / RATE))s" \
    --warmup 0s --budget-ms 2000 >"$WORK/$name.load.txt" 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  # The dump made by callgrind_control is part 1; the one at exit is not used.
  mv "$WORK/$name.out.1" "$OUT/$name.callgrind"
  python3 loadtest/scenarios/callgrind_self.py "$OUT/$name.callgrind" "$N" 0 | head -1 | sed "s/^/$name /"
}

gateway() { # gateway BINARY NAME
  PORT=$(free_port)
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
  if [ -n "${PREV:-}" ]; then gateway "$PREV" tiergate_prev; fi
  bare legacy bare_hyper
  bare inline bare_inline
  PORT=$(free_port)
  nginx_config "$PORT" "$SIM" http
  sed -i '1i master_process off;' "$WORK/nginx/nginx.conf"
  count nginx NGINX=1 nginx -c "$WORK/nginx/nginx.conf"
  echo
  echo "tiergate: the functions with the most instructions of their own, per request"
  python3 loadtest/scenarios/callgrind_self.py "$OUT/tiergate.callgrind" "$N" 25 | tail -n +2
} | tee "$OUT/summary.txt"
