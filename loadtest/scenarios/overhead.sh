#!/usr/bin/env bash
# Real-time pass-through overhead, side by side in one run: the simulator called
# directly, through tiergate, through a bare hyper proxy (loadtest's `bare_proxy`: the
# HTTP stack with none of tiergate's work), through nginx as a plain reverse proxy and
# through HAProxy (one thread, keep-alive both sides, `http-reuse always`), all to the
# same simulator. Open loop, same offered rate, targets interleaved in short
# rounds (2 s each by default), so that bursts of noise on a shared machine fall on every
# target alike rather than on whichever one was running.
# tiergate runs twice: `tiergate` with one worker thread (threads.workers = 1), as nginx
# runs one worker process here, and `tiergate_per_core` with its default (one per core).
# PREV=/path/to/an/older/tiergate adds `tiergate_prev`, that binary with one worker, to
# compare two builds in the same run.
# Then, over HTTP, large tensors: a 1 MiB and a 16 MiB FP32 tensor each way (Triton's
# binary extension in, `binary_data_output` back) at LARGE_RATES (default "50 5" per
# second), direct against tiergate (one worker), nginx and HAProxy, with tiergate's peak
# memory (VmHWM) before and after each, so the memory a large request holds is seen.
#
#   loadtest/scenarios/overhead.sh [RATE] [DURATION] [ROUNDS]     (defaults: 200 60s 30)
#   CPUS=split loadtest/scenarios/overhead.sh ...                    (the proxies on every
#       CPU but the last, the simulator and the load generator on the last one, as a
#       gateway on its own cores between callers and model servers on other machines;
#       the default, CPUS=shared, lets every process share every CPU)
#   PROTOCOL=grpc loadtest/scenarios/overhead.sh ...                 (the gRPC door and a
#       grpc:// backend; nginx with grpc_pass; no bare hyper proxy, it speaks HTTP/1)
#
# Installs nginx from the distribution's packages when it is missing (needs root), builds
# tiergate and loadtest with the dist profile, and writes results to $OUT (default
# target/loadtest/overhead-PROTOCOL-CPUS): summary.txt, results.json and SVG plots.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200}
DURATION=${2:-60s}
ROUNDS=${3:-30}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
PROTOCOL=${PROTOCOL:-http}
CPUS=${CPUS:-shared}
OUT=${OUT:-$TARGET_DIR/loadtest/overhead-$PROTOCOL-$CPUS}

if ! command -v nginx >/dev/null; then
  scripts/apt-install.sh nginx-light
fi
if ! command -v haproxy >/dev/null; then
  scripts/apt-install.sh haproxy
fi
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh
cpu_sides "$CPUS"
PROXY_SIDE=("${MOST_CPUS[@]}"); PEER_SIDE=("${LAST_CPU[@]}")

SIM=$(free_port); SIMG=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port); BARE=$(free_port); NGX=$(free_port)
HAP=$(free_port)
GWC=$(free_port); GWCG=$(free_port); GWCM=$(free_port)

"${PEER_SIDE[@]}" "$BIN/tiergate" sim --http "127.0.0.1:$SIM" --grpc "127.0.0.1:$SIMG" --model resnet50:resnet50-trt 2>"$WORK/sim.log" & PIDS+=($!)
if [ "$PROTOCOL" = grpc ]; then BACKEND="grpc://127.0.0.1:$SIMG"; else BACKEND="http://127.0.0.1:$SIM"; fi
realtime_policy "$BACKEND"
TIERGATE_THREADS__WORKERS=1 "${PROXY_SIDE[@]}" "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/gw" \
  --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
GW_PID=$!
"${PROXY_SIDE[@]}" "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/gw_per_core" \
  --http "127.0.0.1:$GWC" --grpc "127.0.0.1:$GWCG" --metrics "127.0.0.1:$GWCM" 2>"$WORK/gw_per_core.log" & PIDS+=($!)

if [ -n "${PREV:-}" ]; then
  GWP=$(free_port)
  TIERGATE_THREADS__WORKERS=1 "${PROXY_SIDE[@]}" "$PREV" serve --policy-dir "$WORK/policy" --data-dir "$WORK/gw_prev" \
    --http "127.0.0.1:$GWP" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$(free_port)" 2>"$WORK/gw_prev.log" & PIDS+=($!)
fi
"${PROXY_SIDE[@]}" "$BIN/bare_proxy" "127.0.0.1:$BARE" "127.0.0.1:$SIM" & PIDS+=($!)

if [ "$PROTOCOL" = grpc ]; then
  start_nginx "$NGX" "$SIMG" grpc "${PROXY_SIDE[@]}"
else
  start_nginx "$NGX" "$SIM" http "${PROXY_SIDE[@]}"
  haproxy_config "$HAP" "$SIM"
  "${PROXY_SIDE[@]}" haproxy -db -f "$WORK/haproxy/haproxy.cfg" & PIDS+=($!)
fi

wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready
wait_ready "$GWC" /v2/health/ready
wait_ready "$BARE" /v2/health/ready
[ -z "${PREV:-}" ] || wait_ready "$GWP" /v2/health/ready 30
wait_port "$NGX"
[ "$PROTOCOL" = grpc ] || wait_port "$HAP"
wait_port "$SIMG"
wait_port "$GWG"
wait_port "$GWCG"

mkdir -p "$OUT"
if [ "$PROTOCOL" = grpc ]; then
  TARGETS=(--grpc --target "direct=http://127.0.0.1:$SIMG" --target "tiergate=http://127.0.0.1:$GWG"
           --target "tiergate_per_core=http://127.0.0.1:$GWCG" --target "nginx=http://127.0.0.1:$NGX")
else
  TARGETS=(--target "direct=http://127.0.0.1:$SIM" --target "tiergate=http://127.0.0.1:$GW"
           --target "tiergate_per_core=http://127.0.0.1:$GWC"
           --target "bare_hyper=http://127.0.0.1:$BARE" --target "nginx=http://127.0.0.1:$NGX"
           --target "haproxy=http://127.0.0.1:$HAP")
  [ -z "${PREV:-}" ] || TARGETS+=(--target "tiergate_prev=http://127.0.0.1:$GWP")
fi
"${PEER_SIDE[@]}" "$BIN/loadtest" compare "${TARGETS[@]}" \
  --model resnet50 --rate "$RATE" --duration "$DURATION" --rounds "$ROUNDS" \
  --budget-ms 200 --json "$OUT/results.json" --plot "$OUT" | tee "$OUT/summary.txt"

[ "$PROTOCOL" = http ] || exit 0
# Large tensors: the bytes a proxy moves, and the memory tiergate holds for them.
peak_kib() { awk '/^VmHWM/ {print $2}' "/proc/$GW_PID/status"; }
read -r -a RATES <<<"${LARGE_RATES:-50 5}"
for large in "1MiB 262144 ${RATES[0]}" "16MiB 4194304 ${RATES[1]}"; do
  read -r name cols rate <<<"$large"
  before=$(peak_kib)
  echo
  echo "Large tensor: $name FP32 each way (binary in and out), $rate/s"
  "${PEER_SIDE[@]}" "$BIN/loadtest" compare --target "direct=http://127.0.0.1:$SIM" \
    --target "tiergate=http://127.0.0.1:$GW" --target "nginx=http://127.0.0.1:$NGX" \
    --target "haproxy=http://127.0.0.1:$HAP" --model resnet50 --binary --binary-output --rows 1 --cols "$cols" \
    --rate "$rate" --duration "$DURATION" --rounds "$ROUNDS" --budget-ms 2000 \
    --json "$OUT/large-$name.json" | tee -a "$OUT/summary.txt"
  after=$(peak_kib)
  echo "tiergate peak memory (VmHWM): $((before / 1024)) MiB before, $((after / 1024)) MiB after the $name rows" \
    | tee -a "$OUT/summary.txt"
done
