#!/usr/bin/env bash
# Priority bands and tenant shares on one batch pool under a critical load: tenant A's
# critical requests at 40% and then 80% of the pool's capacity, beside two standard
# tenants (B with weight 2, C with weight 1) and a sheddable one (D). What each band and
# tenant gets, and how full the batches are. The simulator has the resnet50-eager profile
# three times slower (t(B) = 22.5 ms + 0.255 ms x B) on one instance; the route has
# max_batch 8 and one batch in flight: about 326 rows/s in full batches, 44 one by one.
#
#   A: critical (x-tiergate-priority, which the route's max_priority allows), one row,
#      budget 500 ms, at 40% or 80% of the capacity (130/s, 261/s).
#   B, C: standard, one row, budget 1 s, B_RATE/s each (default 40).
#   D: sheddable, one row, budget 2 s, 10/s.
#
#   loadtest/scenarios/bands.sh [DURATION]      (default 20s)
#
# PREV=/path/to/another/tiergate runs the same phases on that build too (each phase on
# both builds, one after the other). Writes to $OUT (default target/loadtest/bands):
# summary.txt and each load's JSON. "in budget" is a tenant's 200s within budget over
# its requests; "rows/batch" and "full" come from the gateway's own batch metrics over
# the phase.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-20s}
B_RATE=${B_RATE:-40}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/bands}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model "resnet50:resnet50-eager" --slowdown 3 --instances 1 \
  2>"$WORK/sim.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
# start NAME BINARY: a gateway on the route below; sets GW and GWM.
start() {
  local name=$1 bin=$2
  GW=$(free_port); GWM=$(free_port)
  mkdir -p "$WORK/$name/policy"
  cat > "$WORK/$name/policy/bands.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "50ms"
[routes.resnet50.flags]
realtime = false
micro_batch = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = 8
max_in_flight = 1
queue_capacity = 4096
max_priority = "critical"
tenant_header = "x-api-key"
tenant_weights = { "tenant-b" = 2, "tenant-c" = 1 }
TOML
  TIERGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT=0 "$bin" serve --policy-dir "$WORK/$name/policy" \
    --data-dir "$WORK/$name/data" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$(free_port)" \
    --metrics "127.0.0.1:$GWM" 2>"$WORK/$name/gw.log" & PIDS+=($!)
  GW_PID=$!
  wait_ready "$GW" /v2/health/ready
}
# batch_metrics PORT: rows sum, batches, and full batches (all 8 rows) so far.
batch_metrics() {
  curl -fs "http://127.0.0.1:$1/metrics" | awk '
    /^tiergate_batch_rows_sum\{/ { s += $NF }
    /^tiergate_batch_rows_count\{/ { c += $NF }
    /^tiergate_batch_fill_ratio_bucket\{.*le="0.95"/ { part += $NF }
    END { printf "%d %d %d\n", s, c, c - part }'
}
SECS=${DURATION%s}
COMMON=(--model resnet50 --cols 16 --binary --timeout 30s --rows 1)
mkdir -p "$OUT"
: > "$WORK/phases"
# phase BUILD NAME PERCENT: one load of every tenant, A at PERCENT of the capacity.
phase() {
  local build=$1 name=$2 percent=$3
  local a_rate=$((326 * percent / 100)) url="http://127.0.0.1:$GW" pids=()
  echo "$build: $name (A at $a_rate/s)" >&2
  local before; before=$(batch_metrics "$GWM")
  load() {
    local tenant=$1 rate=$2 budget=$3 band=$4
    "$BIN/loadtest" run --url "$url" "${COMMON[@]}" --rate "$rate" --budget-ms "$budget" \
      --header "x-api-key:tenant-$tenant" --header "x-tiergate-priority:$band" \
      --duration "$DURATION" --warmup 2s --label "${build}_${name}_$tenant" \
      --json "$OUT/${build}_${name}_$tenant.json" > /dev/null &
    pids+=($!)
  }
  load a "$a_rate" 500 critical
  load b "$B_RATE" 1000 standard
  load c "$B_RATE" 1000 standard
  load d 10 2000 sheddable
  for p in "${pids[@]}"; do wait "$p"; done
  local after; after=$(batch_metrics "$GWM")
  echo "$build $name $percent $a_rate $before $after" >> "$WORK/phases"
}
run_build() {
  local build=$1 bin=$2
  start "$build" "$bin"
  phase "$build" critical_40 40
  phase "$build" critical_80 80
  kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
}
run_build this "$BIN/tiergate"
if [ -n "${PREV:-}" ]; then run_build prev "$PREV"; fi

python3 - "$OUT" "$WORK/phases" "$SECS" "$B_RATE" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases, secs, b_rate = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
print(f"one pool of about 326 rows/s in full batches of 8; A critical (budget 500 ms); B and C standard "
      f"at {b_rate}/s each (weights 2 and 1, budget 1 s); D sheddable at 10/s (budget 2 s)")
print(f"{'build':<5} {'phase':<12} {'tenant':<14} {'sent/s':>7} {'served/s':>8} {'in budget':>9} "
      f"{'p50 ms':>8} {'p99 ms':>8} {'429/503':>7}")
for line in open(phases):
    build, name, percent, a_rate, s0, c0, f0, s1, c1, f1 = line.split()
    for tenant, band in [("a", "critical"), ("b", "standard w2"), ("c", "standard w1"), ("d", "sheddable")]:
        s = json.load(open(f"{out}/{build}_{name}_{tenant}.json"))
        sent = max(s["scheduled"], 1)
        ok = s["status_counts"].get("200", 0)
        refused = s["status_counts"].get("429", 0) + s["status_counts"].get("503", 0)
        lat = s["latency_ms"]
        print(f"{build:<5} {name:<12} {tenant + ' ' + band:<14} {sent / secs:>7.1f} {ok / secs:>8.1f} "
              f"{(s['ok_within_budget'] or 0) / sent:>9.4f} {lat['p50']:>8.1f} {lat['p99']:>8.1f} {refused:>7}")
    rows, batches, full = int(s1) - int(s0), int(c1) - int(c0), int(f1) - int(f0)
    print(f"{build:<5} {name:<12} batches: {batches}, {rows / max(batches, 1):.2f} rows each, "
          f"{full / max(batches, 1):.0%} of them full")
PY
