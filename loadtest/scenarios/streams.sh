#!/usr/bin/env bash
# LLM streams through tiergate against the same streams straight from the simulator, side
# by side in one run, at 100 and 1,000 streams open at once: what tiergate adds to the
# time to first token (p50, p99), the events it relays per second, and its memory per
# open stream.
#
# The simulator's `llm-relay` model gives every stream a token every 100 ms however many
# run, and stamps each event with when it wrote it; `loadtest streams` keeps N chat
# streams of 50 tokens open (each read to its end, then the next opened) and reads each
# event's delivery (its arrival less that stamp). The first content event's delivery
# through tiergate less the same straight from the simulator is the time to first token
# tiergate adds, free of the backend's own variance (a new stream waits up to a step to
# join the running ones). RSS per open stream is tiergate's resident memory halfway
# through a phase, less its memory before the phase, over N.
#
#   loadtest/scenarios/streams.sh [DURATION]      (default 20s a phase)
#
# CONCURRENCY="100 1000" (default) sets the phases; TIERGATE=/path/to/an/older/tiergate
# measures that build instead (how a change to the relay is compared with the build
# before it). Writes to $OUT (default
# target/loadtest/streams): summary.txt, results.json, each phase's JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-20s}
CONCURRENCY=${CONCURRENCY:-"100 1000"}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/streams}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
TIERGATE=${TIERGATE:-$BIN/tiergate}

. loadtest/scenarios/lib.sh
# A thousand streams are a thousand connections on each side.
ulimit -n 65536 2>/dev/null || ulimit -n 16384 2>/dev/null || true

SIM=$(free_port); GW=$(free_port); GWM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model "llama:llm-relay" 2>"$WORK/sim.log" & PIDS+=($!)
# A thousand streams opened at once open as many connections to the simulator, past its
# listen backlog: the kernel sends a dropped SYN again after 1 s, tiergate's default
# connect timeout, so tiergate is given 5 s (as in stream_overhead.sh).
relay_policy "$SIM" 4096 'connect_timeout = "5s"'
TIERGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT=0 "$TIERGATE" serve --policy-dir "$WORK/gw/policy" \
  --data-dir "$WORK/gw/data" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$GWM" \
  2>"$WORK/gw/gw.log" & PIDS+=($!)
GW_PID=$!
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
SECS=${DURATION%s}
mkdir -p "$OUT"
: > "$WORK/phases"
for N in $CONCURRENCY; do
  for target in direct tiergate; do
    url="http://127.0.0.1:$SIM"; [ "$target" = direct ] || url="http://127.0.0.1:$GW"
    echo "$N streams, $target" >&2
    before=$(rss_kib "$GW_PID")
    "$BIN/loadtest" streams --url "$url" --model llama --concurrency "$N" --tokens 50 --duration "$DURATION" \
      --json "$OUT/${target}_$N.json" > "$WORK/${target}_$N.txt" &
    load=$!
    sleep "$((SECS / 2))" # halfway through the phase: every stream is open (load shaping, not synchronisation)
    during=$(rss_kib "$GW_PID")
    wait "$load"
    curl -s "http://127.0.0.1:$GWM/metrics" > "$OUT/metrics_after_${target}_$N.txt"
    echo "$N $target $before $during" >> "$WORK/phases"
  done
done

python3 - "$OUT" "$WORK/phases" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases = sys.argv[1], sys.argv[2]
rows = {}
for line in open(phases):
    n, target, before, during = line.split()
    rows[(int(n), target)] = (json.load(open(f"{out}/{target}_{n}.json")), int(before), int(during))
print("streams of 50 tokens, a token every 100 ms; each phase's figures from loadtest streams")
print(f"{'streams':>7} {'target':<9} {'read whole':>10} {'failed':>6} {'events/s':>9} {'TTFT p50/p99 ms':>16} "
      f"{'1st event delivery p50/p99 µs':>30} {'every event p50/p99 µs':>23}")
results = {}
for (n, target), (r, before, during) in sorted(rows.items()):
    ttft = f"{r['ttft_us'][0] / 1e3:.1f}/{r['ttft_us'][1] / 1e3:.1f}"
    first = f"{r['first_delivery_us'][0]}/{r['first_delivery_us'][1]}"
    every = f"{r['delivery_us'][0]}/{r['delivery_us'][1]}"
    print(f"{n:>7} {target:<9} {r['streams']:>10} {r['failed']:>6} {r['events_per_second']:>9.0f} {ttft:>16} "
          f"{first:>30} {every:>23}")
    if r["failed"]:
        print(f"        failed: {r['failed_by']}")
for n in sorted({n for n, _ in rows}):
    if (n, "direct") not in rows or (n, "tiergate") not in rows:
        continue
    d, (t, before, during) = rows[(n, "direct")][0], rows[(n, "tiergate")]
    added = [t["first_delivery_us"][i] - d["first_delivery_us"][i] for i in (0, 1)]
    per_stream = (during - before) * 1024 / n
    results[n] = {"added_ttft_us": added, "events_per_second": t["events_per_second"],
                  "rss_per_stream_bytes": per_stream, "failed": t["failed"]}
    print(f"{n} streams: tiergate adds {added[0]} µs (p50) and {added[1]} µs (p99) to the first token; relays "
          f"{t['events_per_second']:.0f} events/s; {per_stream / 1024:.1f} KiB of memory per open stream "
          f"({before / 1024:.1f} → {during / 1024:.1f} MiB)")
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
PY
