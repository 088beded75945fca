#!/usr/bin/env bash
# Where a proxy's added latency goes, finer than overhead.sh resolves it: the gaps
# between the system calls of the one thread that serves (a wake-up from epoll_wait,
# the read of the client's request, the write to the backend, the read of the backend's
# answer, the write to the client), traced with `perf trace`, for tiergate (one worker
# thread), nginx (one worker) and HAProxy (one thread), each in front of the same
# simulator, targets interleaved in rounds. A gap is the proxy's own work between two
# calls; perf trace adds about 25 µs to each, the same for every proxy, so gaps are
# compared between proxies, not read as absolute times. The median of each gap over
# RATE × SECONDS requests is printed per target and round.
#
#   loadtest/scenarios/syscall_gaps.sh [RATE] [SECONDS] [ROUNDS]   (defaults: 200 5 2)
#   PREV=/path/to/an/older/tiergate loadtest/scenarios/syscall_gaps.sh ...  (adds
#       `tiergate_prev`, that binary with one worker)
#
# Installs perf, nginx and HAProxy from the distribution's packages when missing (needs
# root, as perf trace does), builds tiergate and loadtest with the dist profile, and
# writes the traces and summary.txt to $OUT (default target/loadtest/syscall_gaps).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200}
SECONDS_PER_ROUND=${2:-5}
ROUNDS=${3:-2}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/syscall_gaps}

command -v perf >/dev/null || scripts/apt-install.sh linux-perf
command -v nginx >/dev/null || scripts/apt-install.sh nginx-light
command -v haproxy >/dev/null || scripts/apt-install.sh haproxy
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port); NGX=$(free_port); HAP=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-trt 2>"$WORK/sim.log" & PIDS+=($!)
realtime_policy "http://127.0.0.1:$SIM"
# The thread that serves: a gateway's one tokio worker.
worker_of() { grep -l '^tokio-rt-worker$' /proc/"$1"/task/*/comm | head -1 | cut -d/ -f5; }
TARGETS=()
GW=$(free_port); pid=$(one_worker_gateway "$BIN/tiergate" "$GW" tiergate); PIDS+=("$pid")
wait_ready "$GW" /v2/health/ready 30
TARGETS+=("tiergate $(worker_of "$pid") $GW")
if [ -n "${PREV:-}" ]; then
  GWP=$(free_port); pid=$(one_worker_gateway "$PREV" "$GWP" tiergate_prev); PIDS+=("$pid")
  wait_ready "$GWP" /v2/health/ready 30
  TARGETS+=("tiergate_prev $(worker_of "$pid") $GWP")
fi
start_nginx "$NGX" "$SIM" http
haproxy_config "$HAP" "$SIM"
haproxy -db -f "$WORK/haproxy/haproxy.cfg" & PIDS+=($!)
HAP_PID=$!
wait_ready "$SIM" /v2/health/ready
wait_port "$NGX"
wait_port "$HAP"
sleep 0.5
TARGETS+=("nginx $(nginx_worker) $NGX")
TARGETS+=("haproxy $HAP_PID $HAP")

mkdir -p "$OUT"
{
  echo "Gaps between each proxy's system calls at $RATE/s, $ROUNDS rounds of $((RATE * SECONDS_PER_ROUND)) requests per target (medians; perf trace adds about 25 µs to every gap)"
  for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
      set -- $t
      trace="$OUT/trace-$1-$round.txt"
      "$BIN/loadtest" run --url "http://127.0.0.1:$3" --model resnet50 --rate "$RATE" --duration 1s --warmup 0s --budget-ms 200 >/dev/null 2>&1
      perf trace -t "$2" -o "$trace" >/dev/null 2>&1 &
      tracer=$!
      sleep 1 # perf trace attaches
      # The proxies' sockets to the simulator (their inodes), to tell a proxy's reads
      # apart: listed every 200 ms, as a proxy may open new ones during the round.
      sockets="$OUT/backend-$1-$round.txt"
      : > "$sockets"
      (while :; do ss -tnieH "dport = :$SIM" | grep -o 'ino:[0-9]*' | cut -d: -f2 >> "$sockets"; sleep 0.2; done) &
      lister=$!
      latency=$("$BIN/loadtest" run --url "http://127.0.0.1:$3" --model resnet50 --rate "$RATE" \
        --duration "${SECONDS_PER_ROUND}s" --warmup 0s --budget-ms 200 2>&1 | grep '^latency' | sed 's/latency ms *//; s/ *(mean.*//')
      kill "$lister"; wait "$lister" 2>/dev/null || true
      kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
      echo "round $round  $1 | latency ms $latency"
      python3 loadtest/scenarios/syscall_gaps.py "$trace" "$sockets"
    done
  done
} | tee "$OUT/summary.txt"
