"""The current figures table of docs/performance.md, from the summaries that
loadtest/scenarios/current.sh left in OUT (one directory per scenario, each with the
command that ran it and its date).

    current.py OUT docs/performance.md

Rewrites the lines between `<!-- current:begin -->` and `<!-- current:end -->` and
prints the table. A scenario that did not run (or failed) is left out, and said so.
"""

import json
import re
import sys
from pathlib import Path

OUT, DOC = Path(sys.argv[1]), Path(sys.argv[2])
rows, missing = [], []


def scenario(name):
    """(summary text, command, date) of a scenario, or None when it has no summary."""
    d = OUT / name
    summary = d / "summary.txt"
    if not summary.exists():
        return None
    return summary.read_text(), (d / "command").read_text().strip(), (d / "date").read_text().strip()


# Each figure reads its scenario's summary text (and any results file beside it) and
# gives the row's (what, figure, target); the scenario is the one of its name.
def overhead(text):
    targets = {t["name"]: t for t in json.load(open(OUT / "overhead/results.json"))["targets"]}
    added = lambda name: (targets[name]["added_p50_us"], targets[name]["added_p99_us"])
    tg, bare, nginx, haproxy = added("tiergate"), added("bare_hyper"), added("nginx"), added("haproxy")
    p99 = targets["direct"]["summary"]["latency_ms"]["p99"]
    large = []
    for size in ("1MiB", "16MiB"):
        path = OUT / f"overhead/large-{size}.json"
        if path.exists():
            by = {t["name"]: t["added_p99_us"] / 1000 for t in json.load(open(path))["targets"]}
            large.append(f"{size} each way, added p99: tiergate +{by['tiergate']:.1f}, nginx +{by['nginx']:.1f}, "
                         f"HAProxy +{by['haproxy']:.1f} ms")
    return ("real-time overhead: added p50 / p99 over calling the backend directly",
        f"tiergate +{tg[0]} / +{tg[1]} µs; bare hyper proxy +{bare[0]} / +{bare[1]} µs; nginx +{nginx[0]} / +{nginx[1]} µs; "
        f"HAProxy +{haproxy[0]} / +{haproxy[1]} µs (direct p99 {p99:.2f} ms)" + "".join(f"; {l}" for l in large),
        "added p50 no worse than nginx's; large tensors' added p99 no worse than the better of nginx and HAProxy")


def instructions(text):
    found = re.findall(r"^(\w+) (\d+) instructions/request, (\d+) of them the path's own", text, re.M)
    count = {name: int(whole) for name, whole, _ in found}
    own = {name: int(path) for name, _, path in found}
    return ("instructions per proxied request (callgrind): all / the path's own (idle background subtracted)",
        f"tiergate {count['tiergate']:,} / {own['tiergate']:,}; HAProxy {count['haproxy']:,}; "
        f"bare hyper proxy {count['bare_hyper']:,} (inline client {count['bare_inline']:,}); nginx {count['nginx']:,}",
        "the path's own ≤ 40,000 (stretch: ≤ HAProxy's); no more than the build before a change")


def micro_batch(text):
    theory = float(re.search(r"B/t\(B\) = (\d+) rows/s", text).group(1))
    points = []
    for m in re.finditer(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)", text, re.M):
        offered, goodput, of_max, gain, p50, p99, q429, q503, q504 = m.groups()
        points.append((float(of_max), float(gain), float(p99), int(q504), int(offered), int(goodput)))
    best = max(points)
    # The usage ledger's savings per row beside the cost model's (the last two columns).
    apart = [abs(float(l) / float(m) - 1) for m, l in re.findall(r"([\d.]+)x\s+([\d.]+)x\s*$", text, re.M)]
    ledger = f"; the usage ledger's savings within {max(apart) * 100:.1f}% of the model's at every rate" if apart else ""
    return ("micro-batch: sustained goodput as a share of the cost model's maximum, gain over per request",
        f"{best[0]:.2f} of {theory:,.0f} rows/s ({best[5]:,}/s at {best[4]:,}/s offered), {best[1]:.1f}× per request; "
        f"p99 ≤ {max(p[2] for p in points):,.0f} ms at every rate, {sum(p[3] for p in points)} past the budget (504)"
        f"{ledger}",
        "≥ 0.9 of the maximum, ≥ 20×, p99 within the 1 s budget; the ledger within 5%")


def isolation(text):
    r = json.load(open(OUT / "isolation/results.json"))
    sep, shared = r["separate"], r["shared"]
    return ("isolation: real-time p99 with a batch flood ÷ alone",
        f"separate pools {sep['ratio']:.2f} ({sep['rt_p99_alone_ms']:.2f} → {sep['rt_p99_flood_ms']:.2f} ms; "
        f"rounds {sep['ratio_min']:.2f}–{sep['ratio_max']:.2f}, stdev {sep['ratio_stdev']:.2f}); "
        f"one shared pool {shared['ratio']:.2f} ({shared['rt_p99_alone_ms']:.2f} → {shared['rt_p99_flood_ms']:.2f} ms); "
        f"the control, calls straight to the real-time GPU beside the same flood, {r['direct']['ratio']:.2f} "
        f"(rounds {r['direct']['ratio_min']:.2f}–{r['direct']['ratio_max']:.2f}); the machine's own wake-up p99 with the "
        f"other CPU busy ÷ idle {r['machine']['ratio_min']:.2f}–{r['machine']['ratio_max']:.2f}",
        "≤ 1.10 in every round")


def burst(text):
    within = re.search(r"served within the 1 s budget: (\d+) of (\d+) = ([\d.]+)%", text)
    peak = re.search(r"resident memory: peak ([\d.]+) MiB", text).group(1)
    shed = re.search(r"shed (\{[^}]*\})", text).group(1)
    return ("bursts: 20× spikes, admitted requests served within their budget",
        f"{within.group(3)}% ({within.group(1)} of {within.group(2)}); shed with 429/503: {shed}; peak memory {peak} MiB",
        "100% of admitted requests within budget, memory bounded")


def offline_backlog(text):
    ratio = re.search(r"mean p99: alone ([\d.]+) ms, with backlog ([\d.]+) ms: ratio ([\d.]+)", text)
    ack = re.search(r"achieved (\d+)/s, ack p50 ([\d.]+) ms, p99 ([\d.]+) ms", text)
    drained = [int(x) for x in re.findall(r"^backlog\S*\s+.*\s(\d+)$", text, re.M)]
    return ("offline backlog: micro-batch p99 with a backlog draining ÷ alone; durable acknowledgements",
        f"{ratio.group(3)} ({ratio.group(1)} → {ratio.group(2)} ms), backlog drained at {min(drained):,}–{max(drained):,} jobs/s; "
        f"{ack.group(1)} acknowledged jobs/s, p99 {ack.group(3)} ms",
        "micro-batch callers first; acknowledged only once durable")


def shadow(text):
    r = json.load(open(OUT / "shadow/results.json"))
    return ("shadow scoring: real-time p99 and micro-batch goodput with 100% shadow to a 3× slower candidate ÷ shadow off",
        f"p99 {r['rt_p99_ratio']:.3f} ({r['rt_p99_off_ms']:.2f} → {r['rt_p99_on_ms']:.2f} ms); "
        f"goodput {r['batch_goodput_ratio']:.3f} ({r['batch_goodput_off']:,.0f} → {r['batch_goodput_on']:,.0f}/s)",
        "p99 ≤ 1.05, goodput ≥ 0.95")


def cache(text):
    calls = re.search(r"backend calls: cache off (\d+), on (\d+): ([\d.]+)x fewer", text)
    hits = re.search(r"hit ratio ([\d.]+)", text)
    p99 = re.search(r"p99: cache off ([\d.]+) ms, on ([\d.]+) ms: ratio ([\d.]+)", text)
    hit = re.search(r"a hit \(cache on, p50\) ([\d.]+) ms against the bare proxy's pass-through p50 ([\d.]+) ms", text)
    return ("prediction cache at a 90% hit ratio: backend calls, p99, a hit against a pass-through",
        f"{calls.group(3)}× fewer backend calls ({int(calls.group(1)):,} → {int(calls.group(2)):,}; hit ratio {hits.group(1)}); "
        f"p99 {p99.group(3)} ({p99.group(1)} → {p99.group(2)} ms); a hit p50 {hit.group(1)} ms, the bare proxy's pass-through {hit.group(2)} ms",
        "≥ 9× fewer calls, p99 falls, a hit faster than a pass-through")


def capacity(text):
    level = re.search(r"signal at the peak: ([\d.]+) endpoints \(rate x t\(1\) / 0.7 = ([\d.]+)\)", text)
    shown = re.search(r"signal showed the new need (\d+) s after the step", text)
    p99 = re.search(r"p99 within the budget (\d+) s after the step", text)
    used = re.search(r"endpoints: (\d+) at the peak; (\d+) endpoint-seconds against (\d+) for a fixed pool of \d+ \((\d+)% saved\)", text)
    reqs = re.search(r"200: (\d+) \((\d+) past the budget\), refused: (.*), transport errors", text)
    return ("capacity signal: a 5× load step, the pool scaled on it as KEDA would",
        f"signal {level.group(1)} endpoints at the peak (rate × t(1) ÷ 0.7 = {level.group(2)}), shown {shown.group(1)} s "
        f"after the step; p99 within the budget {p99.group(1)} s after it; {used.group(1)} endpoints at the peak, "
        f"{used.group(4)}% fewer endpoint-seconds than a fixed pool of that size; {reqs.group(2)} answers past the "
        f"budget, refused {reqs.group(3)}",
        "the signal within its window; no answer past its budget; fewer endpoint-seconds than a pool sized for the peak")


def console_overhead(text):
    targets = {t["name"]: t for t in json.load(open(OUT / "console_overhead/results.json"))["targets"]}
    p99 = lambda name: targets[name]["summary"]["latency_ms"]["p99"]
    closed, opened = p99("console_closed"), p99("console_open")
    polls = re.search(r"console polls answered: (\d+)", text)
    return ("the console: real-time p99 with it open on every page and polling ÷ nobody looking (one run, rounds interleaved)",
        f"{opened / closed:.3f} ({closed:.2f} → {opened:.2f} ms; {polls.group(1)} polls of every page's calls answered)",
        "within noise (≤ 1.05)")


def fairness(text):
    rounds = re.findall(
        r"round \d+: B's p99 flood / alone ([\d.]+), flood / A at its share ([\d.]+); "
        r"B's attainment flood / alone ([\d.]+); as one tenant ([\d.]+)", text)
    p99 = re.findall(r"^(alone|at_share|flood) +\d+ +[\d.]+ +([\d.]+)", text, re.M)
    if not rounds:
        raise ValueError("no rounds")
    per = lambda i: ", ".join(r[i] for r in rounds)
    alone = "/".join(v for k, v in p99 if k == "alone")
    flood = "/".join(v for k, v in p99 if k == "flood")
    return ("fairness: tenant B's deadline attainment and p99 with tenant A flooding at 10× its share ÷ B alone",
        f"attainment {per(2)} (rounds); p99 {per(0)} ({alone} → {flood} ms), {per(1)} against A at its share; "
        f"the same flood as B's own tenant: attainment {per(3)}",
        "attainment and p99 within 10% of alone")


def bands(text):
    tenants = re.findall(r"^this +(critical_\d+) +(\w) [\w ]+? +([\d.]+) +([\d.]+) +([\d.]+) ", text, re.M)
    batches = dict(re.findall(r"^this +(critical_\d+) +batches: \d+, ([\d.]+ rows each, \d+% of them full)", text, re.M))
    if not tenants:
        raise ValueError("no phases")
    at = lambda phase: {t: (float(sent), float(served), budget) for p, t, sent, served, budget in tenants if p == phase}
    low, high = at("critical_40"), at("critical_80")
    return ("priority bands: tenants below a critical tenant at 40% and 80% of a batch pool's capacity",
        f"at 40%: within budget A {low['a'][2]}, B {low['b'][2]}, C {low['c'][2]}, D {low['d'][2]} "
        f"({batches['critical_40']}); at 80%: A {high['a'][2]}, the rest served B {high['b'][1]:.1f}, "
        f"C {high['c'][1]:.1f}, D {high['d'][1]:.1f} rows/s (B and C weights 2:1) in batches of "
        f"{batches['critical_80']}",
        "lower bands within budget at 40%; at 80% what is left, in full batches")


def streams(text):
    results = json.load(open(OUT / "streams/results.json"))
    parts = []
    for n in ("100", "1000"):
        r = results[n]
        parts.append(f"{int(n):,} streams: +{r['added_ttft_us'][0] / 1000:.1f} / +{r['added_ttft_us'][1] / 1000:.1f} ms, "
                     f"{r['events_per_second']:,.0f} events/s, {r['rss_per_stream_bytes'] / 1024:.1f} KiB a stream, "
                     f"{r['failed']} failed")
    return ("LLM streams: time to first token tiergate adds over calling the simulator directly (p50 / p99), "
            "events relayed per second, memory per open stream",
        "; ".join(parts),
        "the first token's added p50 within a few ms at 1,000 streams; none failed; memory per stream bounded")


def stream_overhead(text):
    results = json.load(open(OUT / "stream_overhead/results.json"))
    parts = []
    for n, by in results.items():
        def one(name):
            r = by.get(name)
            if not r:
                return None
            added = r["added_ttft_us"]
            ttft = f"+{added[0]} / +{added[1]} µs" if added else \
                f"+{r['added_ttft_from_sending_ms'][0]:.1f} / +{r['added_ttft_from_sending_ms'][1]:.1f} ms from sending"
            cpu = r["cpu_seconds_per_1000_tokens"]
            return (f"{name} {ttft}, {cpu * 1000:.1f} ms CPU per 1k tokens, {r['rss_mib']:.0f} MiB, "
                    f"{r['failed']} of {r['streams'] + r['failed']} failed")
        parts.append(f"{int(n):,} streams: " + "; ".join(filter(None, map(one, ("tiergate", "nginx", "litellm")))))
    return ("the relay's cost beside nginx and LiteLLM: added TTFT (p50 / p99), CPU per 1,000 tokens relayed, "
            "RSS with every stream open",
        " — ".join(parts),
        "added TTFT p50 within 100 µs of nginx's; CPU per token ≤ 1.5× nginx's; ≥ 10× less CPU per stream than LiteLLM")


def long_prefill():
    """(c) on an engine prefilling long prompts 48 tokens a step, when that run is there."""
    try:
        r = json.load(open(OUT / "llm_isolation_long48/results.json"))
    except OSError:
        return ""
    c = r["phases"]["shared"]
    return (f"; with the engine prefilling long prompts 48 tokens a step (`LONG_PREFILL=48`): (c) TTFT p99 "
            f"×{c['ttft_p99_ratio']:.2f}, bulk {c['bulk_ratio']:.2f} of that engine's spare, its maximum "
            f"{r['max_tokens_per_second']:,.0f} tokens/s")


def llm_isolation(text):
    r = json.load(open(OUT / "llm_isolation/results.json"))
    alone, p = r["alone"], r["phases"]
    def one(name, label):
        x = p[name]
        of = "spare" if name == "shared" else "max"
        return (f"{label} TTFT p50 ×{x['ttft_p50_ratio']:.2f}, p99 ×{x['ttft_p99_ratio']:.2f}, TPOT p99 ×{x['tpot_p99_ratio']:.2f}, "
                f"bulk {x['bulk_ratio']:.2f} of {of}")
    saved = p["separate"].get("usage", {}).get("token_cost") or {}
    return ("LLM isolation: interactive streams beside a bulk flood at 10× their tokens ÷ alone (TTFT p50/p99, TPOT p99); "
            "bulk tokens/s ÷ the batch pool's maximum (shared: ÷ spare capacity)",
        f"alone TTFT {alone['ttft_us'][0] / 1e3:.1f} / {alone['ttft_us'][1] / 1e3:.1f} ms, maximum {r['max_tokens_per_second']:,.0f} tokens/s; "
        + "; ".join([one("direct", "(a) no gateway, one engine:"), one("separate", "(b) separate pools:"),
                     one("shared", "(c) one pool held back:")])
        + (f"; the Batch API's tokens {saved.get('saved', 0):.4f} {saved.get('currency', '')} saved against real time" if saved else "")
        + long_prefill(),
        "(b) TTFT p99 ≤ 1.10×, bulk ≥ 0.90 of the maximum; (c) TTFT p99 ≤ 1.5×, bulk ≥ 0.7 of spare capacity")


def completions_merge(text):
    def engines(results, streamed):
        by = {(r["engine"], r["phase"]): r for r in json.load(open(results))}
        for engine, label in [("sim", "simulator"), ("llama-server", "llama-server (4 slots, tiny model)")]:
            one, merged = by.get((engine, "one")), by.get((engine, "merged"))
            if not one or not merged:
                continue
            first = (f", first token p99 {one['ttft_p99_ms']:.0f} → {merged['ttft_p99_ms']:.0f} ms" if streamed else "")
            yield (f"{label} at {one['rate']:g}/s: {one['calls_per_request'] / merged['calls_per_request']:.2f}× fewer backend calls, "
                   f"engine CPU a call {one['engine_cpu_ms_per_request']:.2f} → {merged['engine_cpu_ms_per_request']:.2f} ms, "
                   f"p99 {one['p99_ms']:.0f} → {merged['p99_ms']:.0f} ms{first}")
    value = "; ".join(engines(OUT / "completions_merge/results.json", False))
    streamed = OUT / "completions_merge_streamed/results.json"
    if streamed.exists():
        value += "; streamed (`STREAM=1`, one stream cut per caller): " + "; ".join(engines(streamed, True))
    return ("completions coalesced: callers' /v1/completions merged into one call while the batch pool is busy, against one call each",
            value, "fewer calls and no dearer per call; each caller's answer as its own call's")


for figure in (overhead, instructions, micro_batch, isolation, burst, offline_backlog, shadow, cache, fairness, bands,
               streams, stream_overhead, llm_isolation, completions_merge, capacity, console_overhead):
    got = scenario(figure.__name__)
    if not got:
        missing.append(figure.__name__)
        continue
    text, command, date = got
    try:
        what, value, target = figure(text)
    except (KeyError, AttributeError, ValueError, FileNotFoundError) as e:
        missing.append(f"{figure.__name__} (summary unreadable: {e})")
        continue
    rows.append(f"| {what} | {value} | {target} | `{command}` | {date} |")

table = ["| what | figure | target | command | date |", "|---|---|---|---|---|", *rows]
if missing:
    table.append("")
    table.append("Not in this run: " + ", ".join(missing) + ".")
print("\n".join(table))
doc = DOC.read_text()
begin, end = "<!-- current:begin -->", "<!-- current:end -->"
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
DOC.write_text(head + begin + "\n" + "\n".join(table) + "\n" + end + tail)
