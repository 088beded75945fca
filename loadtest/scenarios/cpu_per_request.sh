#!/usr/bin/env bash
# CPU time per request of each proxy in the overhead scenario, side by side: tiergate
# (one worker thread), the bare hyper proxy (one worker thread; with hyper-util's pooled
# client, and as `bare_inline` with its inline HTTP/1 client, the floor of tiergate's own
# client) and nginx (one worker), all in front of the same simulator. Each target gets RATE requests/s for SECONDS in
# each of ROUNDS rounds (targets interleaved); the proxy's user and system CPU ticks are
# read from /proc/PID/stat around each round. At low load a request's CPU time on the
# proxy is most of what the proxy adds to its latency, and it is far less noisy on a
# shared machine than the latency itself, so this is the instrument for comparing two
# builds: PREV=/path/to/older/tiergate adds a second gateway running that binary.
#
#   loadtest/scenarios/cpu_per_request.sh [RATE] [SECONDS] [ROUNDS]   (defaults: 500 10 3)
#
# Prints one line per target and round (CPU µs per request, then the client's latency),
# then each target's rounds sorted with their median,
# and writes them to $OUT (default target/loadtest/cpu_per_request)/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-500}
SECONDS_PER_ROUND=${2:-10}
ROUNDS=${3:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/cpu_per_request}

if ! command -v nginx >/dev/null; then
  scripts/apt-install.sh nginx-light
fi
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
TICK_US=$((1000000 / $(getconf CLK_TCK)))

. loadtest/scenarios/lib.sh

SIM=$(free_port); GW=$(free_port); BARE=$(free_port); NGX=$(free_port); PREV_GW=$(free_port); BARE_INLINE=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-trt 2>"$WORK/sim.log" & PIDS+=($!)
realtime_policy "http://127.0.0.1:$SIM"
TARGETS=()
pid=$(one_worker_gateway "$BIN/tiergate" "$GW" tiergate); PIDS+=("$pid"); TARGETS+=("tiergate $pid $GW")
if [ -n "${PREV:-}" ]; then
  pid=$(one_worker_gateway "$PREV" "$PREV_GW" tiergate_prev); PIDS+=("$pid"); TARGETS+=("tiergate_prev $pid $PREV_GW")
fi
TOKIO_WORKER_THREADS=1 "$BIN/bare_proxy" "127.0.0.1:$BARE" "127.0.0.1:$SIM" & PIDS+=($!)
TARGETS+=("bare_hyper $! $BARE")
TOKIO_WORKER_THREADS=1 "$BIN/bare_proxy" "127.0.0.1:$BARE_INLINE" "127.0.0.1:$SIM" inline & PIDS+=($!)
TARGETS+=("bare_inline $! $BARE_INLINE")

start_nginx "$NGX" "$SIM" http

wait_ready "$SIM" /v2/health/ready
for t in "${TARGETS[@]}"; do set -- $t; wait_ready "$3" /v2/health/ready 30; done
wait_port "$NGX"
sleep 0.5
NGINX_WORKER=$(nginx_worker)
TARGETS+=("nginx $NGINX_WORKER $NGX")

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
mkdir -p "$OUT"
N=$((RATE * SECONDS_PER_ROUND))
{
  echo "CPU per request at $RATE/s, $ROUNDS rounds of $N requests per target (tick $TICK_US µs = $((TICK_US / N)) µs/request resolution)"
  for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
      set -- $t
      "$BIN/loadtest" run --url "http://127.0.0.1:$3" --model resnet50 --rate "$RATE" --duration 1s --warmup 0s --budget-ms 200 >/dev/null 2>&1
      before=$(cpu_ticks "$2")
      latency=$("$BIN/loadtest" run --url "http://127.0.0.1:$3" --model resnet50 --rate "$RATE" \
        --duration "${SECONDS_PER_ROUND}s" --warmup 0s --budget-ms 200 2>&1 | grep '^latency' | sed 's/latency ms *//; s/ *(mean.*//')
      after=$(cpu_ticks "$2")
      printf "round %d  %-14s %4d µs CPU/request | latency ms %s\n" "$round" "$1" $(( (after - before) * TICK_US / N )) "$latency"
    done
  done
} | tee "$OUT/summary.txt"
# Each target's rounds in order and their median.
python3 - "$OUT/summary.txt" <<'PY' | tee -a "$OUT/summary.txt"
import statistics, sys
rounds = {}
for line in open(sys.argv[1]):
    if line.startswith("round "):
        _, _, target, cpu, *_ = line.split()
        rounds.setdefault(target, []).append(int(cpu))
for target, cpu in rounds.items():
    print(f"{target:<14} µs CPU/request: {', '.join(map(str, sorted(cpu)))}; median {statistics.median(cpu):g}")
PY
