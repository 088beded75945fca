#!/usr/bin/env bash
# The relay's cost, side by side in one run: the same simulator's LLM streams read
# straight from it (direct), through tiergate, through nginx (`proxy_buffering off`: the
# lower bound of a relay) and through LiteLLM's proxy (from PyPI: the gateway most teams
# run), at 1,000 and 5,000 streams open at once. For each relay: the time to first token
# it adds (p50, p99), the CPU seconds it spends per 1,000 tokens relayed and per 1,000
# streams, and its resident memory with every stream open.
#
# The simulator's `llm-relay` model gives every stream a token every 100 ms however many
# run, and stamps each event with when it wrote it (`x_sent_us`); `loadtest streams`
# keeps N chat streams of 50 tokens open. The added time to first token is the first
# content event's delivery (its arrival less that stamp) through the relay less the same
# read directly. LiteLLM rebuilds every chunk and drops the stamp, so for it (and, for
# comparison, for every relay) the added time is also given as the time to first token
# (from sending) less direct's, which carries the backend's step (up to 100 ms) as noise.
# CPU is the relay's processes' user and system time over the phase (nginx's worker;
# LiteLLM's process and its children); memory is their RSS halfway through the phase.
# Everything shares this machine's cores; each relay runs alone in its phase.
#
#   loadtest/scenarios/stream_overhead.sh [DURATION]     (default 20s a phase)
#
# CONCURRENCY="1000 5000" (default) sets the phases; TARGETS="tiergate nginx litellm"
# the relays; TIERGATE=/path/to/an/older/tiergate the tiergate relaying (before and after). Installs nginx with apt and LiteLLM into a virtual environment
# (tests/conformance/venv.sh litellm, kept outside the clone) when missing. Writes to
# $OUT (default target/loadtest/stream_overhead): summary.txt, results.json, each
# phase's JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-20s}
CONCURRENCY=${CONCURRENCY:-"1000 5000"}
TARGETS=${TARGETS:-"tiergate nginx litellm"}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/stream_overhead}

if ! command -v nginx >/dev/null; then
  scripts/apt-install.sh nginx-light
fi
cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
TIERGATE=${TIERGATE:-$BIN/tiergate}
LITELLM_VENV=""
case " $TARGETS " in *" litellm "*) LITELLM_VENV=$(tests/conformance/venv.sh litellm) ;; esac

. loadtest/scenarios/lib.sh
ulimit -n 65536 2>/dev/null || ulimit -n 16384 2>/dev/null || true
MAX=$(echo "$CONCURRENCY" | tr ' ' '\n' | sort -n | tail -1)

SIM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model "llama:llm-relay" 2>"$WORK/sim.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready

declare -A PORT PID
for target in $TARGETS; do
  case $target in
    tiergate)
      PORT[tiergate]=$(free_port)
      # Thousands of streams opened at once open as many connections to the simulator,
      # past its listen backlog: the kernel sends a dropped SYN again after 1 s, tiergate's
      # default connect timeout. nginx waits 60 s (proxy_connect_timeout); tiergate is given 5 s.
      relay_policy "$SIM" $((MAX * 2)) 'connect_timeout = "5s"'
      TIERGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT=0 TIERGATE_LIMITS__MAX_IN_FLIGHT_REQUESTS=$((MAX * 4)) \
        "$TIERGATE" serve --policy-dir "$WORK/gw/policy" --data-dir "$WORK/gw/data" \
        --http "127.0.0.1:${PORT[tiergate]}" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$(free_port)" \
        2>"$WORK/gw/gw.log" & PIDS+=($!)
      PID[tiergate]=$!
      wait_ready "${PORT[tiergate]}" /v2/health/ready ;;
    nginx)
      PORT[nginx]=$(free_port)
      NGINX_CONNECTIONS=$((MAX * 3)) start_nginx "${PORT[nginx]}" "$SIM" http
      wait_port "${PORT[nginx]}"
      PID[nginx]=$(nginx_worker) ;;
    litellm)
      PORT[litellm]=$(free_port)
      cat > "$WORK/litellm.yaml" <<YAML
model_list:
  - model_name: llama
    litellm_params:
      model: openai/llama
      api_base: http://127.0.0.1:$SIM/v1
      api_key: none
YAML
      LITELLM_KEY="sk-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
      LITELLM_MASTER_KEY=$LITELLM_KEY LITELLM_LOG=ERROR "$LITELLM_VENV/bin/litellm" --config "$WORK/litellm.yaml" --host 127.0.0.1 \
        --port "${PORT[litellm]}" --num_workers 1 >"$WORK/litellm.log" 2>&1 & PIDS+=($!)
      PID[litellm]=$!
      wait_ready "${PORT[litellm]}" /health/liveliness 120 || { tail -20 "$WORK/litellm.log" >&2; exit 1; } ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
done

# The processes of a relay: its PID and its children's.
procs() { echo "$1"; pgrep -P "$1" || true; }
# CPU ticks (user + system) and RSS (KiB) of a relay's processes.
ticks() { local t=0; for p in $(procs "$1"); do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo "$t"; }
rss_kib() { local r=0; for p in $(procs "$1"); do r=$((r + $(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0))); done; echo "$r"; }
HZ=$(getconf CLK_TCK)
SECS=${DURATION%s}
mkdir -p "$OUT"
: > "$WORK/phases"
for N in $CONCURRENCY; do
  for target in direct $TARGETS; do
    url="http://127.0.0.1:$SIM"; [ "$target" = direct ] || url="http://127.0.0.1:${PORT[$target]}"
    key=(); [ "$target" != litellm ] || key=(--api-key "$LITELLM_KEY")
    echo "$N streams, $target" >&2
    pid=${PID[$target]:-}
    before_ticks=0; before_rss=0
    [ -z "$pid" ] || { before_ticks=$(ticks "$pid"); before_rss=$(rss_kib "$pid"); }
    "$BIN/loadtest" streams --url "$url" --model llama --concurrency "$N" --tokens 50 --duration "$DURATION" \
      "${key[@]}" --json "$OUT/${target}_$N.json" > "$WORK/${target}_$N.txt" &
    load=$!
    sleep "$((SECS / 2))" # halfway through the phase: every stream is open (load shaping, not synchronisation)
    during=0; [ -z "$pid" ] || during=$(rss_kib "$pid")
    wait "$load"
    after_ticks=0; [ -z "$pid" ] || after_ticks=$(ticks "$pid")
    echo "$N $target $before_rss $during $((after_ticks - before_ticks)) $HZ" >> "$WORK/phases"
  done
done
# The relays' logs beside the figures (a failed stream's cause).
for f in "$WORK/gw/gw.log" "$WORK/litellm.log" "$WORK/nginx/error.log"; do [ ! -f "$f" ] || cp "$f" "$OUT/"; done
LITELLM_VERSION=$([ -z "$LITELLM_VENV" ] || "$LITELLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))')
NGINX_VERSION=$(nginx -v 2>&1 | sed 's/.*\///')

python3 - "$OUT" "$WORK/phases" "$LITELLM_VERSION" "$NGINX_VERSION" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases, litellm, nginx = sys.argv[1:5]
rows = {}
for line in open(phases):
    n, target, before, during, ticks, hz = line.split()
    rows[(int(n), target)] = (json.load(open(f"{out}/{target}_{n}.json")), int(before), int(during), int(ticks) / int(hz))
print(f"streams of 50 tokens, a token every 100 ms, through each relay in turn (nginx {nginx}, LiteLLM {litellm or '-'})")
print(f"{'streams':>7} {'relay':<9} {'read whole':>10} {'failed':>6} {'tokens/s':>9} {'+TTFT p50/p99 µs':>18} "
      f"{'+TTFT (sent) p50/p99 ms':>24} {'CPU s/1k tok':>12} {'CPU s/1k streams':>16} {'RSS MiB':>8}")
results = {}
for n in sorted({n for n, _ in rows}):
    d = rows[(n, "direct")][0]
    for (m, target), (r, before, during, cpu) in sorted(rows.items()):
        if m != n or target == "direct":
            continue
        stamped = r["first_delivery_us"][0] > 0
        added = [r["first_delivery_us"][i] - d["first_delivery_us"][i] for i in (0, 1)] if stamped else None
        sent = [(r["ttft_us"][i] - d["ttft_us"][i]) / 1e3 for i in (0, 1)]
        per_ktok = cpu / (r["events"] / 1e3) if r["events"] else None
        per_kstream = cpu / ((r["streams"] + r["failed"]) / 1e3) if r["streams"] + r["failed"] else None
        results.setdefault(str(n), {})[target] = {
            "added_ttft_us": added, "added_ttft_from_sending_ms": sent, "cpu_seconds": cpu,
            "cpu_seconds_per_1000_tokens": per_ktok, "cpu_seconds_per_1000_streams": per_kstream,
            "rss_mib": during / 1024, "streams": r["streams"], "failed": r["failed"], "failed_by": r["failed_by"],
            "tokens_per_second": r["events_per_second"]}
        fmt = lambda v, f: "-" if v is None else format(v, f)
        print(f"{n:>7} {target:<9} {r['streams']:>10} {r['failed']:>6} {r['events_per_second']:>9.0f} "
              f"{(f'{added[0]}/{added[1]}' if added else 'no stamp'):>18} {f'{sent[0]:.1f}/{sent[1]:.1f}':>24} "
              f"{fmt(per_ktok, '.4f'):>12} {fmt(per_kstream, '.3f'):>16} {during / 1024:>8.1f}")
        if r["failed"]:
            print(f"        failed: {r['failed_by']}")
    print(f"{n:>7} {'direct':<9} {d['streams']:>10} {d['failed']:>6} {d['events_per_second']:>9.0f}")
for n, by in results.items():
    t, g, l = by.get("tiergate"), by.get("nginx"), by.get("litellm")
    if t and g and t["added_ttft_us"] and g["added_ttft_us"]:
        print(f"{n} streams: tiergate's added TTFT p50 is {t['added_ttft_us'][0] - g['added_ttft_us'][0]} µs from nginx's "
              f"(goal: within 100 µs)")
    if t and g and t["cpu_seconds_per_1000_tokens"] and g["cpu_seconds_per_1000_tokens"]:
        print(f"{n} streams: tiergate's CPU per token is {t['cpu_seconds_per_1000_tokens'] / g['cpu_seconds_per_1000_tokens']:.2f}× "
              f"nginx's (goal: at most 1.5×)")
    if t and l and t["cpu_seconds_per_1000_streams"] and l["cpu_seconds_per_1000_streams"]:
        print(f"{n} streams: LiteLLM spends {l['cpu_seconds_per_1000_streams'] / t['cpu_seconds_per_1000_streams']:.1f}× "
              f"tiergate's CPU per stream (goal: at least 10×)")
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
PY
