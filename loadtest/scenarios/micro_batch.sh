#!/usr/bin/env bash
# The micro-batch tier's gain, in one run: the simulator with the resnet50-eager profile
# (t(B) = 7.5 ms + 0.085 ms x B) on ONE instance, served per request (called directly,
# open loop above its capacity) and through tiergate's micro-batch tier at several
# offered rates, one row per request, budget 1 s.
#
#   loadtest/scenarios/micro_batch.sh [RATES] [DURATION]      (defaults: "1000 2500 4000 4500 5500" 20s)
#   MAX_BATCH=64 IN_FLIGHT=2 loadtest/scenarios/micro_batch.sh ...
#   PROFILE=bert-base-trt PER_REQUEST_RATE=2000 loadtest/scenarios/micro_batch.sh ...  (another cost profile;
#       the direct per-request run must offer more than the profile's 1/t(1))
#
# Builds tiergate and loadtest with the dist profile and writes to $OUT (default
# target/loadtest/micro_batch): summary.txt (the table below), gain.svg (goodput and p99
# against offered load), one JSON and one plot directory per run. Columns: goodput (200s per second, ended inside the window), its fraction of the cost
# model's maximum B/t(B) at max_batch, its gain over per-request serving (measured in
# the same run), p50/p99 against the budget, refusals (429/503) and deadline misses (504),
# the mean batch size from the gateway's metrics, and the backend time a row saves in
# batches of that size: by the cost model (n·t(1)/t(n)) and as the gateway's usage
# ledger charged the run (what its rows would have cost alone ÷ what they used; usage.txt
# is `tiergate usage` after the run).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATES=${1:-"1000 2500 4000 4500 5500"}
DURATION=${2:-20s}
MAX_BATCH=${MAX_BATCH:-64}
IN_FLIGHT=${IN_FLIGHT:-2}
BUDGET_MS=${BUDGET_MS:-1000}
PROFILE=${PROFILE:-resnet50-eager}
PER_REQUEST_RATE=${PER_REQUEST_RATE:-200}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/micro_batch}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port); GWA=$(free_port)


"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model "resnet50:$PROFILE" --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/micro_batch.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
[routes.resnet50.flags]
realtime = false
micro_batch = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = $MAX_BATCH
max_wait = "250ms"
max_in_flight = $IN_FLIGHT
queue_capacity = 4096
TOML
# Every request comes from one address (the load generator's), as from behind a load
# balancer: no per-client connection limit (its default, 1,000, would close the
# connections of the overload's queued callers instead of answering them 429).
TIERGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT=0 TIERGATE_LISTEN__ADMIN="127.0.0.1:$GWA" TIERGATE_ADMIN__TOKEN="$ADMIN_TOKEN" \
  "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

mkdir -p "$OUT"
LOAD=(--model resnet50 --rows 1 --cols 16 --binary --warmup 3s --timeout 30s)
batch_rows() { curl -fs "http://127.0.0.1:$GWM/metrics" | awk -v k="$1" '$1 == "tiergate_batch_rows_" k "{route=\"resnet50\"}" {print $2}'; }

echo "per request: the simulator called directly, open loop above its capacity" >&2
"$BIN/loadtest" run --url "http://127.0.0.1:$SIM" --rate "$PER_REQUEST_RATE" --duration "$DURATION" "${LOAD[@]}" \
  --label per_request --json "$OUT/per_request.json" --plot "$OUT/per_request" > "$OUT/per_request.txt"

: > "$WORK/batches"
for RATE in $RATES; do
  echo "micro-batch tier at $RATE/s" >&2
  SUM0=$(batch_rows sum); COUNT0=$(batch_rows count)
  usage_json "$GWA" > "$WORK/usage_before_$RATE.json"
  "$BIN/loadtest" run --url "http://127.0.0.1:$GW" --rate "$RATE" --duration "$DURATION" --budget-ms "$BUDGET_MS" \
    "${LOAD[@]}" --label "micro_batch_$RATE" --json "$OUT/micro_batch_$RATE.json" --plot "$OUT/micro_batch_$RATE" \
    > "$OUT/micro_batch_$RATE.txt"
  echo "$RATE ${SUM0:-0} ${COUNT0:-0} $(batch_rows sum) $(batch_rows count)" >> "$WORK/batches"
  usage_json "$GWA" > "$WORK/usage_after_$RATE.json"
done
# The whole run as the usage ledger tells it (tiergate usage, as an operator reads it).
TIERGATE_ADMIN_TOKEN=$ADMIN_TOKEN "$BIN/tiergate" usage --admin "http://127.0.0.1:$GWA" --since 1h > "$OUT/usage.txt"
cp "$WORK"/usage_*.json "$OUT/"

python3 - "$OUT" "$MAX_BATCH" "$IN_FLIGHT" "$BUDGET_MS" "$WORK/batches" "$PROFILE" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, max_batch, in_flight, budget, batches, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
# The simulator's profiles (src/sim/profile.rs), ms: t(B) = max(floor, a + b x B).
a, b, floor = {"resnet50-eager": (7.5, 0.085, 0), "resnet50-trt": (0.71, 0.056, 0), "bert-base-trt": (0.2, 0.124, 0.67)}[profile]
t = lambda n: max(floor, a + b * n)
theory = max_batch / t(max_batch) * 1000
per = json.load(open(f"{out}/per_request.json"))
# Goodput: responses that ended inside the measured window, times the share that were 200s.
goodput = lambda s: s["achieved_rps"] * s["status_counts"].get("200", 0) / max(s["completed"], 1)
per_rps = goodput(per)
print(f"{profile}, 1 instance: t(B) = max({floor}, {a} ms + {b} ms x B); max_batch {max_batch}, max_in_flight {in_flight}, budget {budget:.0f} ms")
print(f"theoretical maximum B/t(B) = {theory:.0f} rows/s; per request 1/t(1) = {1000 / t(1):.1f}/s")
print(f"per request (direct, offered {per['offered_rps']:.0f}/s): goodput {per_rps:.1f}/s, p99 {per['latency_ms']['p99']:.0f} ms")
print()
points = []
print(f"{'offered/s':>9} {'goodput/s':>9} {'of max':>6} {'gain':>6} {'p50 ms':>7} {'p99 ms':>7} {'429':>5} {'503':>5} {'504':>5} {'other':>5} {'rows/batch':>10} {'model':>6} {'ledger':>6}")
def ledger(rate, when):
    report = json.load(open(f"{out}/usage_{when}_{rate}.json"))
    line = next((l for l in report["rows"] if l.get("tier") == "micro_batch"), None)
    return (line["used_seconds"], line["would_have_seconds"], line["unpriced_rows"]) if line else (0.0, 0.0, 0)
for line in open(batches):
    rate, s0, c0, s1, c1 = line.split()
    s = json.load(open(f"{out}/micro_batch_{rate}.json"))
    counts = s["status_counts"]
    g = goodput(s)
    other = s["failures"] - sum(counts.get(k, 0) for k in ("429", "503", "504"))
    mean = (float(s1) - float(s0)) / max(float(c1) - float(c0), 1)
    # The backend time one row saves in batches of the mean size, by the cost model, and
    # as the usage ledger charged this run: what its rows would have cost alone ÷ used.
    model = mean * t(1) / t(mean)
    (u0, w0, _), (u1, w1, unpriced) = ledger(rate, "before"), ledger(rate, "after")
    charged = (w1 - w0) / max(u1 - u0, 1e-9)
    print(f"{s['offered_rps']:>9.0f} {g:>9.0f} {g / theory:>6.2f} {g / per_rps:>5.1f}x {s['latency_ms']['p50']:>7.1f} "
          f"{s['latency_ms']['p99']:>7.1f} {counts.get('429', 0):>5} {counts.get('503', 0):>5} {counts.get('504', 0):>5} "
          f"{other:>5} {mean:>10.1f} {model:>5.1f}x {charged:>5.1f}x")
    points.append((s["offered_rps"], g, s["latency_ms"]["p99"]))

# gain.svg: goodput and p99 against offered load, with the cost model's maximum, the
# per-request goodput and the budget drawn in.
W, H, L, R, T, B = 640, 360, 60, 60, 30, 40
xmax = max(p[0] for p in points) * 1.05
ymax = max(theory, max(p[1] for p in points)) * 1.1
x = lambda v: L + v / xmax * (W - L - R)
y = lambda v: H - B - v / ymax * (H - T - B)
z = lambda ms: H - B - min(ms, budget * 1.1) / (budget * 1.1) * (H - T - B)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{W - R}" y1="{T}" x2="{W - R}" y2="{H - B}" stroke="#c33"/>',
       f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">offered load (requests/s, 1 row each)</text>',
       f'<text x="{L - 5}" y="{T - 10}">goodput/s</text>',
       f'<text x="{W - R + 5}" y="{T - 10}" fill="#c33">p99 ms</text>']
for frac in (0, 0.25, 0.5, 0.75, 1.0):
    svg.append(f'<text x="{L - 5}" y="{y(ymax * frac) + 4}" text-anchor="end">{ymax * frac:.0f}</text>')
    svg.append(f'<text x="{W - R + 5}" y="{z(budget * 1.1 * frac) + 4}" fill="#c33">{budget * 1.1 * frac:.0f}</text>')
for v in (p[0] for p in points):
    svg.append(f'<text x="{x(v)}" y="{H - B + 14}" text-anchor="middle">{v:.0f}</text>')
def hline(yy, text, color, right=False):
    svg.append(f'<line x1="{L}" y1="{yy}" x2="{W - R}" y2="{yy}" stroke="{color}" stroke-dasharray="4 3"/>')
    at = f'x="{(L + W - R) / 2}" text-anchor="middle" y="{yy + 12}"' if right else f'x="{L + 5}" y="{yy - 4}"'
    svg.append(f'<text {at} fill="{color}">{text}</text>')
hline(y(theory), f"cost model maximum B/t(B) = {theory:.0f}/s", "#555")
hline(y(per_rps), f"per request, measured: {per_rps:.0f}/s", "#555")
hline(z(budget), f"budget {budget:.0f} ms", "#c33", right=True)
svg.append(f'<text x="{L + 5}" y="{T + 40}" fill="#1f5fbf">goodput (200s/s)</text>')
svg.append(f'<text x="{L + 5}" y="{T + 54}" fill="#c33">p99 latency</text>')
def series(pts, color):
    svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')
    svg.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts)
series([(x(o), y(g)) for o, g, _ in points], "#1f5fbf")
series([(x(o), z(p)) for o, _, p in points], "#c33")
svg.append('</svg>')
open(f"{out}/gain.svg", "w").write("\n".join(svg))
PY
