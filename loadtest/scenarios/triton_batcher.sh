#!/usr/bin/env bash
# Side by side, in one run: the resnet50-eager cost model (7.5 ms + 0.085 ms x B per
# call, one instance) served by a real Triton server (PyTriton) with Triton's own
# dynamic batcher, called directly; versus tiergate's micro-batch tier in front of the
# same model on a second Triton server with batching off. Same load tool, same offered
# rates, targets interleaved in rounds (loadtest compare), one row per request.
#
#   loadtest/scenarios/triton_batcher.sh [RATES] [DURATION] [ROUNDS]   (defaults: "500 1000 2000" 12s 2)
#
# Creates PyTriton's Python environment with tests/conformance/venv.sh on first use,
# builds tiergate and loadtest with the dist profile, and writes to $OUT (default
# target/loadtest/triton_batcher): summary.txt, and results and plots per rate.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATES=${1:-"500 1000 2000"}
DURATION=${2:-12s}
ROUNDS=${3:-2}
MAX_BATCH=${MAX_BATCH:-64}
BUDGET_MS=${BUDGET_MS:-1000}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/triton_batcher}

VENV=$(tests/conformance/venv.sh pytriton)
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

DYN=$(free_port); DYNG=$(free_port); DYNM=$(free_port)
PLAIN=$(free_port); PLAING=$(free_port); PLAINM=$(free_port)
GW=$(free_port); GWG=$(free_port); GWM=$(free_port)


SCRIPT=loadtest/scenarios/pytriton_cost.py
"$VENV/bin/python" "$SCRIPT" batcher "$DYN" "$DYNG" "$DYNM" "$MAX_BATCH" >"$WORK/dyn.log" 2>&1 & PIDS+=($!)
"$VENV/bin/python" "$SCRIPT" plain "$PLAIN" "$PLAING" "$PLAINM" >"$WORK/plain.log" 2>&1 & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/triton.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
[routes.resnet50.flags]
realtime = false
micro_batch = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$PLAIN"]
max_batch = $MAX_BATCH
max_wait = "250ms"
max_in_flight = 1
queue_capacity = 4096
TOML
"$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
wait_ready "$DYN" /v2/models/resnet50/ready 180 || { cat "$WORK/dyn.log" >&2; exit 1; }
wait_ready "$PLAIN" /v2/models/resnet50/ready 180 || { cat "$WORK/plain.log" >&2; exit 1; }
wait_ready "$GW" /v2/health/ready

mkdir -p "$OUT"
: > "$OUT/summary.txt"
# Triton's own counters: inferences (rows) and model executions (batches) of resnet50.
triton() { curl -fs "http://127.0.0.1:$1/metrics" | awk -v k="nv_inference_$2" '$1 ~ "^" k "\\{model=\"resnet50\"" {s += $2} END {print s + 0}'; }
gw_rows() { curl -fs "http://127.0.0.1:$GWM/metrics" | awk -v k="$1" '$1 == "tiergate_batch_rows_" k "{route=\"resnet50\"}" {v = $2} END {print v + 0}'; }
mean_batch() { python3 -c "import sys; r, b = eval(sys.argv[1]), eval(sys.argv[2]); print(f'{r / b:.1f}' if b else '-')" "$1" "$2"; }
for RATE in $RATES; do
  D0=$(triton "$DYNM" count); DX0=$(triton "$DYNM" exec_count); P0=$(gw_rows sum); PX0=$(gw_rows count)
  "$BIN/loadtest" compare --target "triton_dynamic_batcher=http://127.0.0.1:$DYN" --target "tiergate_micro_batch=http://127.0.0.1:$GW" \
    --model resnet50 --rows 1 --cols 16 --binary --budget-ms "$BUDGET_MS" --timeout 30s \
    --rate "$RATE" --duration "$DURATION" --rounds "$ROUNDS" \
    --json "$OUT/compare_$RATE.json" --plot "$OUT/compare_$RATE" | tee -a "$OUT/summary.txt"
  D1=$(triton "$DYNM" count); DX1=$(triton "$DYNM" exec_count); P1=$(gw_rows sum); PX1=$(gw_rows count)
  echo "mean rows per model call (warmups included): triton_dynamic_batcher $(mean_batch $((D1 - D0)) $((DX1 - DX0)))" \
       "(Triton's nv_inference_count / nv_inference_exec_count), tiergate_micro_batch $(mean_batch "$P1 - $P0" "$PX1 - $PX0")" \
       "(tiergate_batch_rows)" | tee -a "$OUT/summary.txt"
  echo | tee -a "$OUT/summary.txt"
done
