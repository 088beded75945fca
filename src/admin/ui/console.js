// tiergate's console: the admin API in a browser. No framework, no build step, no
// cookie: the admin token is kept in this tab's sessionStorage and sent as
// `Authorization: Bearer` on every call, so a page elsewhere cannot act with it.
"use strict";

const TOKEN_KEY = "tiergate-admin-token";
const POLL_MS = 2000;
const $ = (sel) => document.querySelector(sel);

// ---- the admin API ------------------------------------------------------------

/** Calls the admin API; a refused token shows the login form. */
async function api(method, path, { body, headers = {}, raw = false } = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) { showLogin(""); throw new Error("not logged in"); }
  const init = { method, headers: { Authorization: `Bearer ${token}`, ...headers } };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = typeof body === "string" ? "text/plain" : "application/json";
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("The token was refused: give the admin token (admin.token or TIERGATE_ADMIN__TOKEN).");
    throw new Error("unauthenticated");
  }
  if (raw) return res;
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = { text }; }
  return { status: res.status, etag: res.headers.get("ETag"), json };
}

/** The last thing an action said, kept beside the pages' "updated" for 10 s. */
let said = { text: "", cls: "", at: 0 };

function say(text, cls = "") {
  said = { text, cls, at: Date.now() };
  const s = $("#status");
  s.textContent = text;
  s.className = cls;
}

/** A page's poll: when it read the gateway, after what the last action said. */
function updated() {
  const s = $("#status"), when = `updated ${new Date().toLocaleTimeString()}`;
  const recent = Date.now() - said.at < 10000;
  s.textContent = recent ? `${said.text} · ${when}` : when;
  s.className = recent ? said.cls : "";
}

// ---- log in -------------------------------------------------------------------

function showLogin(why) {
  stopPolling();
  $("#page").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  $("#login-why").textContent = why || "The console reads and changes the running gateway through its admin API: give the admin token.";
  $("#token").focus();
}

async function login(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  try {
    const r = await api("GET", "/admin/policy");
    if (r.status === 200) {
      $("#login").hidden = true;
      showPage();
    }
  } catch (_) { /* the login form says why */ }
}

// ---- the stats history: GET /admin/stats ----------------------------------------

const stats = { names: [], last: new Map(), samples: [], lastAt: 0, replica: null };

/** Splits `name{a="x",b="y"}` into the name and its labels. */
function parseSeries(series) {
  const at = series.indexOf("{");
  if (at < 0) return { name: series, labels: {} };
  const labels = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  let m;
  while ((m = re.exec(series.slice(at))) !== null) labels[m[1]] = m[2].replace(/\\(.)/g, "$1");
  return { name: series.slice(0, at), labels };
}

/** Reads what came since the last sample (and the policy's version); keeps 15 minutes
 * of whole snapshots. */
async function pollStats() {
  const policy = await api("GET", "/admin/policy");
  if (policy.status === 200) stats.policyVersion = policy.json.version;
  const r = await api("GET", `/admin/stats?since=${stats.lastAt}`);
  if (r.status !== 200) throw new Error(`stats: ${r.status}`);
  const answer = r.json;
  stats.replica = answer.replica;
  stats.names = answer.series.map(parseSeries);
  for (const sample of answer.samples) {
    for (const [i, v] of sample.values) stats.last.set(i, v);
    stats.samples.push({ at: sample.at_ms, values: new Map(stats.last) });
    stats.lastAt = sample.at_ms;
  }
  if (stats.samples.length > 900) stats.samples.splice(0, stats.samples.length - 900);
  const replica = stats.replica;
  if (replica) {
    const version = stats.policyVersion === undefined ? "" : ` · policy v${stats.policyVersion}`;
    const since = new Date(replica.started_ms).toISOString().replace(".000", "");
    $("#replica").textContent = `replica ${replica.name} · ${replica.address} · up since ${since}${version}`;
  }
}

/** The sample closest to `secondsAgo` before the newest one. */
function sampleAgo(secondsAgo) {
  const s = stats.samples;
  if (!s.length) return null;
  const want = s[s.length - 1].at - secondsAgo * 1000;
  for (let i = s.length - 1; i >= 0; i--) if (s[i].at <= want) return s[i];
  return s[0];
}

/** Sums of `family`'s series in a sample, grouped by `key(labels)` (filtered by `keep`). */
function grouped(sample, family, key, keep = () => true) {
  const out = new Map();
  if (!sample) return out;
  stats.names.forEach((s, i) => {
    if (s.name !== family || !keep(s.labels)) return;
    const v = sample.values.get(i);
    if (v === undefined || v === null) return;
    const k = key(s.labels);
    out.set(k, (out.get(k) || 0) + v);
  });
  return out;
}

/** `family`'s increase by group between `secondsAgo` and now. */
function increase(family, key, secondsAgo, keep) {
  const now = grouped(stats.samples[stats.samples.length - 1], family, key, keep);
  const then = grouped(sampleAgo(secondsAgo), family, key, keep);
  const out = new Map();
  for (const [k, v] of now) out.set(k, Math.max(0, v - (then.get(k) || 0)));
  return out;
}

/** A latency quantile (ms) from a histogram's bucket increases, per group. */
function quantiles(family, key, secondsAgo, q) {
  const buckets = new Map();
  const now = stats.samples[stats.samples.length - 1], then = sampleAgo(secondsAgo);
  if (!now) return new Map();
  stats.names.forEach((s, i) => {
    if (s.name !== `${family}_bucket`) return;
    const k = key(s.labels), le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    const d = (now.values.get(i) || 0) - ((then && then.values.get(i)) || 0);
    if (!buckets.has(k)) buckets.set(k, new Map());
    const b = buckets.get(k);
    b.set(le, (b.get(le) || 0) + d);
  });
  const out = new Map();
  for (const [k, b] of buckets) {
    const les = [...b.keys()].sort((x, y) => x - y);
    const total = b.get(Infinity) || 0;
    if (total <= 0) continue;
    let prev = 0, prevCount = 0;
    for (const le of les) {
      const c = b.get(le);
      if (c >= q * total) {
        const hi = le === Infinity ? prev : le;
        const frac = c === prevCount ? 1 : (q * total - prevCount) / (c - prevCount);
        out.set(k, (prev + (hi - prev) * frac) * 1000);
        break;
      }
      prev = le; prevCount = c;
    }
  }
  return out;
}

/** Per-second rates of `family` by group over the last 5 minutes, for a sparkline. */
function rateSeries(family, key, wanted) {
  const s = stats.samples.slice(-150);
  const points = [];
  for (let i = 1; i < s.length; i++) {
    const a = grouped(s[i - 1], family, key).get(wanted) || 0;
    const b = grouped(s[i], family, key).get(wanted) || 0;
    points.push(Math.max(0, (b - a) / ((s[i].at - s[i - 1].at) / 1000 || 1)));
  }
  return points;
}

function sparkline(points) {
  const w = 120, h = 24, max = Math.max(1, ...points);
  const step = points.length > 1 ? w / (points.length - 1) : w;
  const d = points.map((p, i) => `${(i * step).toFixed(1)},${(h - (p / max) * (h - 2) - 1).toFixed(1)}`).join(" ");
  return `<svg class="spark" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="rate over the last 5 minutes, up to ${max.toFixed(1)}/s"><polyline fill="none" stroke="#0b62c4" stroke-width="1.5" points="${d}"/></svg>`;
}

/** A chart's frame with nothing to draw yet. */
const noChart = (title) => `<figure class="chart"><figcaption>${esc(title)}</figcaption><p class="muted">nothing yet</p></figure>`;

/** A line chart over time: `series` is [{name, color, points: [[ms, value or null]]}];
 * `ref` ({value, label}) draws a dashed level (a gate, say). */
function lineChart(title, series, { ref, unit = "", yMax } = {}) {
  const all = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] !== undefined));
  if (!all.length) return noChart(title);
  const w = 320, h = 110, left = 40, bottom = 16;
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = yMax ?? (Math.max(...all.map((p) => p[1]), ref ? ref.value : 0) * 1.1 || 1);
  const x = (t) => (left + (t1 === t0 ? (w - left) / 2 : ((t - t0) / (t1 - t0)) * (w - left - 6))).toFixed(1);
  const y = (v) => (h - bottom - (Math.min(v, top) / top) * (h - bottom - 6)).toFixed(1);
  const hhmm = (t) => new Date(t).toISOString().slice(11, 16);
  const lines = series.map((s) => {
    const pts = s.points.filter((p) => p[1] !== null && p[1] !== undefined);
    const dots = pts.length === 1 ? `<circle cx="${x(pts[0][0])}" cy="${y(pts[0][1])}" r="2.5" fill="${s.color}"/>` : "";
    return `<polyline fill="none" stroke="${s.color}" stroke-width="1.5" points="${pts.map((p) => `${x(p[0])},${y(p[1])}`).join(" ")}"/>${dots}`;
  }).join("");
  const level = ref ? `<line x1="${left}" x2="${w}" y1="${y(ref.value)}" y2="${y(ref.value)}" stroke="#24292f" stroke-dasharray="3 3"/><text x="${w - 2}" y="${Number(y(ref.value)) + (Number(y(ref.value)) < 20 ? 10 : -3)}" text-anchor="end">${esc(ref.label)}</text>` : "";
  const legend = series.map((s) => `<svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" fill="${s.color}"/></svg> ${esc(s.name)}`).join(" ");
  return `<figure class="chart"><figcaption>${esc(title)} ${legend}</figcaption>
<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(title)}">
<line x1="${left}" x2="${left}" y1="4" y2="${h - bottom}" stroke="#8c959f"/><line x1="${left}" x2="${w}" y1="${h - bottom}" y2="${h - bottom}" stroke="#8c959f"/>
<text x="${left - 4}" y="12" text-anchor="end">${esc(num(top < 10 ? 2 : 0)(top))}${esc(unit)}</text><text x="${left - 4}" y="${h - bottom}" text-anchor="end">0</text>
<text x="${left}" y="${h - 3}">${hhmm(t0)}</text><text x="${w - 2}" y="${h - 3}" text-anchor="end">${hhmm(t1)}</text>
${level}${lines}</svg></figure>`;
}

/** Vertical bars of `buckets` ([{label, value}]), for a distribution. */
function barChart(title, buckets) {
  const total = buckets.reduce((s, b) => s + b.value, 0);
  if (!total) return noChart(title);
  const w = 320, h = 110, bottom = 16, max = Math.max(...buckets.map((b) => b.value)), step = w / buckets.length;
  const bars = buckets.map((b, i) => {
    const bh = (b.value / max) * (h - bottom - 14);
    return `<rect x="${(i * step + 2).toFixed(1)}" y="${(h - bottom - bh).toFixed(1)}" width="${(step - 4).toFixed(1)}" height="${bh.toFixed(1)}" fill="#0b62c4"><title>${esc(b.label)}: ${b.value}</title></rect>
<text x="${(i * step + step / 2).toFixed(1)}" y="${(h - bottom - bh - 2).toFixed(1)}" text-anchor="middle">${b.value ? ((100 * b.value) / total).toFixed(0) + "%" : ""}</text>
<text x="${(i * step + step / 2).toFixed(1)}" y="${h - 3}" text-anchor="middle">${esc(b.label)}</text>`;
  }).join("");
  return `<figure class="chart"><figcaption>${esc(title)}</figcaption><svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(title)}">${bars}</svg></figure>`;
}

// ---- tables with CSV and JSON export -----------------------------------------------

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

/** A table of `rows` (objects) under `columns` ([key, title, format?]), with exports. */
function table(id, columns, rows) {
  // Columns of numbers line up on the right, the rest on the left.
  const n = columns.map(([k]) => rows.length > 0 && rows.every((r) => r[k] === null || r[k] === undefined || typeof r[k] === "number"));
  const cls = (i) => (n[i] ? ' class="n"' : "");
  const head = columns.map(([, title], i) => `<th scope="col"${cls(i)}>${esc(title)}</th>`).join("");
  const body = rows.map((r) => `<tr>${columns.map(([k, , f], i) => `<td${cls(i)}>${f ? f(r[k], r) : esc(r[k])}</td>`).join("")}</tr>`).join("");
  tables[id] = { columns, rows };
  return `<div class="exports"><button type="button" data-export="${id}" data-as="csv">CSV</button><button type="button" data-export="${id}" data-as="json">JSON</button></div>
<div class="scroll"><table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body || `<tr><td colspan="${columns.length}" class="muted">nothing yet</td></tr>`}</tbody></table></div>`;
}
const tables = {};

function download(id, as) {
  const t = tables[id];
  if (!t) return;
  let text, type;
  if (as === "json") {
    text = JSON.stringify(t.rows, null, 2); type = "application/json";
  } else {
    const cell = (v) => { const s = String(v ?? ""); return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s; };
    text = [t.columns.map(([k]) => k).join(","), ...t.rows.map((r) => t.columns.map(([k]) => cell(r[k])).join(","))].join("\n") + "\n";
    type = "text/csv";
  }
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = `tiergate-${id}.${as}`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

/** A horizontal bar of `v` (0–1) with its percentage; green at or above `good`, with
 * a tick there. */
function bar(v, good) {
  if (v === null || v === undefined) return "–";
  const tick = good === undefined ? "" : `<rect x="${(good * 100).toFixed(1)}" width="1.5" height="10" fill="#24292f"/>`;
  return `<svg width="100" height="10" role="img" aria-label="${pct(v)}"><rect width="100" height="10" fill="#eef1f4"/><rect width="${(v * 100).toFixed(1)}" height="10" fill="${good === undefined || v >= good ? "#1a7f37" : "#9a6700"}"/>${tick}</svg> ${pct(v)}`;
}

/** How full something is against its limit: green, amber from 80%, red when at it. */
function fullness(v) {
  const c = v >= 1 ? "#cf222e" : v >= 0.8 ? "#9a6700" : "#1a7f37";
  const w = Math.min(1, Math.max(0, v)) * 100;
  return `<svg width="100" height="10" role="img" aria-label="${pct(v)}"><rect width="100" height="10" fill="#eef1f4"/><rect width="${w.toFixed(1)}" height="10" fill="${c}"/></svg>`;
}

const num = (d) => (v) => (v === undefined || v === null || Number.isNaN(v) ? "–" : Number(v).toFixed(d));
const pct = (v) => (v === undefined || v === null ? "–" : `${(v * 100).toFixed(2)}%`);

// ---- pages ----------------------------------------------------------------------

let timer = null;
function stopPolling() { if (timer) { clearInterval(timer); timer = null; } }
function every(fn) { stopPolling(); fn(); timer = setInterval(fn, POLL_MS); }

const pages = {
  async overview(page) {
    const draw = async () => {
      try { await pollStats(); } catch (e) { say(`could not read the gateway: ${e.message}`, "bad"); return; }
      const rt = (l) => `${l.route}/${l.tier}`;
      const requests = increase("tiergate_requests_total", rt, 10);
      // The seconds those 10 s span in the history (less while it is younger).
      const newest = stats.samples[stats.samples.length - 1], oldest = sampleAgo(10);
      const span = newest && oldest ? Math.max(1, (newest.at - oldest.at) / 1000) : 1;
      const slo = increase("tiergate_slo_requests_total", (l) => `${rt(l)}/${l.result}`, 60);
      const refused = increase("tiergate_refusals_total", (l) => `${rt(l)}/${l.knob}`, 60);
      const outcomes = increase("tiergate_requests_total", (l) => `${rt(l)}/${l.outcome}`, 60);
      const status = { shed: "shed (503)", queue_full: "queue full (429)", rate_limited: "rate limit (429)", deadline_unmeetable: "deadline unmeetable", deadline: "deadline (504)", backend_error: "backend (502)", unavailable: "unavailable (503)" };
      const inFlight = grouped(stats.samples[stats.samples.length - 1], "tiergate_in_flight_requests", rt);
      const p50 = quantiles("tiergate_request_duration_seconds", rt, 60, 0.5);
      const p99 = quantiles("tiergate_request_duration_seconds", rt, 60, 0.99);
      const keys = new Set([...grouped(stats.samples[stats.samples.length - 1], "tiergate_requests_total", rt).keys(), ...inFlight.keys()]);
      const rows = [...keys].sort().map((k) => {
        const [route, tier] = k.split("/");
        const met = slo.get(`${k}/met`) || 0, missed = slo.get(`${k}/missed`) || 0;
        const reasons = [...refused].filter(([rk, v]) => rk.startsWith(`${k}/`) && v > 0).map(([rk, v]) => `${rk.slice(k.length + 1)} ${v}`);
        return {
          route, tier,
          rate: (requests.get(k) || 0) / span,
          p50_ms: p50.get(k), p99_ms: p99.get(k),
          slo: met + missed ? met / (met + missed) : null,
          refused_60s: reasons.join(", "),
          not_served_60s: [...outcomes].filter(([ok, v]) => ok.startsWith(`${k}/`) && v > 0 && !ok.endsWith("/ok"))
            .map(([ok, v]) => { const o = ok.slice(k.length + 1); return `${status[o] || o} ${v}`; }).join(", "),
          in_flight: inFlight.get(k) || 0,
          trend: k,
        };
      });
      page.innerHTML = `<h1>Overview</h1>
<p class="muted">Rates over the last 10 s, latency and SLO attainment over the last 60 s, from the gateway's own history (${stats.samples.length} samples, one a second; no Prometheus needed).</p>
${table("overview", [
        ["route", "route"], ["tier", "tier"], ["rate", "requests/s", num(1)],
        ["p50_ms", "p50 ms", num(1)], ["p99_ms", "p99 ms", num(1)], ["slo", "SLO met", (v) => (v === null ? "–" : `<span class="${v >= 0.99 ? "ok" : v >= 0.95 ? "warn" : "bad"}">${pct(v)}</span>`)],
        ["not_served_60s", "not served (60 s, by outcome)"], ["refused_60s", "refused (60 s, by setting)"], ["in_flight", "in flight", num(0)],
        ["trend", "last 5 min", (k) => sparkline(rateSeries("tiergate_requests_total", rt, k))],
      ], rows)}`;
      updated();
    };
    every(draw);
  },

  async policy(page) {
    const [flags, history] = await Promise.all([api("GET", "/admin/flags"), api("GET", "/admin/policy/history")]);
    const rows = [];
    for (const [route, f] of Object.entries(flags.json.flags)) {
      for (const flag of ["realtime", "micro_batch", "offline", "shadow", "cache"]) {
        if (typeof f[flag] === "boolean") rows.push({ route, flag, on: f[flag] });
      }
    }
    // Each route's rollout percentage and budget thresholds, as they run.
    const settings = [];
    for (const route of Object.keys(flags.json.flags)) {
      const r = await api("GET", `/admin/routes/${encodeURIComponent(route)}`);
      if (r.status !== 200) continue;
      const e = r.json.effective;
      settings.push({ route, micro_batch_percent: e.flags.micro_batch_percent, realtime_below_ms: e.realtime_below_ms, offline_from_ms: e.offline_from_ms, default_budget_ms: e.default_budget_ms });
    }
    page.innerHTML = `<h1>Policy</h1>
<p class="muted">Version ${esc(flags.json.version)}. Every change is validated, shown as a dry run first (the requests it would serve differently, the diff, any problem), then applied against the route's ETag, audited and reversible.</p>
<h2>Flags</h2>
${table("flags", [["route", "route"], ["flag", "flag"], ["on", "state", (v) => (v ? '<span class="ok">on</span>' : '<span class="muted">off</span>')],
      ["toggle", "change", (_, r) => `<button type="button" data-toggle="${esc(r.route)}" data-flag="${esc(r.flag)}" data-to="${!r.on}">turn ${r.on ? "off" : "on"}…</button>`]], rows)}
<h2>Rollout and thresholds</h2>
${table("settings", [["route", "route"], ["micro_batch_percent", "micro_batch_percent", num(0)], ["realtime_below_ms", "realtime_below (ms)", num(0)],
      ["offline_from_ms", "offline_from (ms)", num(0)], ["default_budget_ms", "default_budget (ms)", num(0)]], settings)}
<form id="setting-form" class="grid">
<label for="set-route">route</label><select id="set-route">${settings.map((r) => `<option>${esc(r.route)}</option>`).join("")}</select>
<label for="set-key">setting</label><select id="set-key">
<option value="micro_batch_percent">micro_batch_percent: the share of keys the micro-batch tier takes (0–100)</option>
<option value="realtime_below">realtime_below: budgets below it go real-time (e.g. 300ms)</option>
<option value="offline_from">offline_from: budgets from it go offline (e.g. 5s)</option>
<option value="default_budget">default_budget: the budget of a request that names none</option>
</select>
<label for="set-value">value</label><input id="set-value" required placeholder="50, or 300ms">
<span></span><button type="submit">Dry run…</button>
</form>
<div id="dryrun" class="panel" hidden></div>
<h2>History</h2>
${table("history", [["version", "version"], ["time", "time", (v) => esc(v)], ["who", "who"], ["action", "action"],
      ["files", "files", (v) => esc((v || []).join(" "))],
      ["do", "", (_, r) => `<button type="button" data-diff="${r.version}">diff</button> ${r.version === history.json.current ? '<span class="muted">running</span>' : `<button type="button" data-rollback="${r.version}">roll back to it…</button>`}`]],
      history.json.versions)}
<pre id="diff" hidden></pre>`;
  },

  async batching(page) {
    const draw = async () => {
      try { await pollStats(); } catch (e) { say(`could not read the gateway: ${e.message}`, "bad"); return; }
      // Over the last 60 s from the history; the queue, limit and learned cost now from
      // GET /admin/batching.
      const byRoute = (l) => l.route;
      const rowsSum = increase("tiergate_batch_rows_sum", byRoute, 60), rowsCount = increase("tiergate_batch_rows_count", byRoute, 60);
      const fillSum = increase("tiergate_batch_fill_ratio_sum", byRoute, 60), fillCount = increase("tiergate_batch_fill_ratio_count", byRoute, 60);
      const flushes = increase("tiergate_batch_flushes_total", (l) => `${l.route}|${l.reason}`, 60);
      const bands = increase("tiergate_batch_priority_requests_total", (l) => `${l.route}|${l.priority}|${l.outcome}`, 60);
      const now = await api("GET", "/admin/batching");
      const pools = new Map(((now.json && now.json.routes) || []).map((r) => [r.route, r]));
      const routes = [...pools.keys()].sort();
      const of = (m, route) => [...m].filter(([k, n]) => k.startsWith(`${route}|`) && n > 0).map(([k, n]) => `${k.slice(route.length + 1).replace("|", " ")} ${n}`).join(", ");
      const rows = routes.map((route) => {
        const p = pools.get(route), c = p.learned_cost;
        return {
          route,
          queued_rows: p.queued_rows,
          batches_60s: rowsCount.get(route) || 0,
          rows_per_batch: rowsCount.get(route) ? rowsSum.get(route) / rowsCount.get(route) : null,
          fill: fillCount.get(route) ? fillSum.get(route) / fillCount.get(route) : null,
          size_limit: p.batch_limit,
          max_batch: p.max_batch,
          cost: c ? `${c.fixed_ms.toFixed(2)} ms + ${c.per_row_ms.toFixed(3)} ms/row ± ${c.rms_error_ms.toFixed(2)} ms (${c.samples} batches)` : "not learned yet",
          one_row_ms: p.one_row_ms,
          flushes_60s: of(flushes, route),
          bands_60s: of(bands, route),
        };
      });
      const queue = [...pools.values()].flatMap((p) => p.queue.map((q) => ({ route: p.route, ...q })));
      const shares = [...pools.values()].flatMap((p) => p.served_15m.map((t) => ({ route: p.route, ...t })));
      page.innerHTML = `<h1>Batching</h1>
<p class="muted">Each route's micro-batch queue and batches over the last 60 s: rows per batch and fill against <code>max_batch</code>, why batches went (full, the backend idle, a deadline, <code>max_wait</code>), requests by priority band queued or shed, the learned cost <code>t(n) = a + b·n</code> and the progressive size limit.</p>
${table("batching", [["route", "route"], ["queued_rows", "rows queued", num(0)], ["batches_60s", "batches (60 s)", num(0)],
        ["rows_per_batch", "rows/batch", num(1)], ["fill", "fill", (v) => (v === null ? "–" : pct(v))], ["size_limit", "size limit", (v, r) => `${num(0)(v)} of ${r.max_batch}`],
        ["cost", "learned cost t(n) = a + b·n"], ["one_row_ms", "one row alone (ms)", num(2)], ["flushes_60s", "flushes by reason (60 s)"], ["bands_60s", "bands (60 s)"]], rows)}
<h2>Waiting now, by band and tenant</h2>
${table("queue", [["route", "route"], ["band", "band"], ["tenant", "tenant"], ["weight", "weight", num(0)], ["rows", "rows", num(0)]], queue)}
<h2>Tenants' shares of the rows served (15 min) against their weights</h2>
${table("shares", [["route", "route"], ["tenant", "tenant"], ["weight", "weight", num(0)], ["rows", "rows served", num(0)],
        ["share", "share", (v, r) => `${bar(v, r.weight_share)}`], ["weight_share", "weight's share", pct]], shares)}`;
      updated();
    };
    every(draw);
  },

  async backends(page) {
    const draw = async () => {
      try { await pollStats(); } catch (e) { say(`could not read the gateway: ${e.message}`, "bad"); return; }
      const newest = stats.samples[stats.samples.length - 1];
      const ep = (l) => `${l.route}|${l.tier}|${l.endpoint}`;
      const ejections = grouped(newest, "tiergate_backend_ejections_total", (l) => `${ep(l)}|${l.reason}`);
      const recent = increase("tiergate_backend_ejections_total", (l) => `${ep(l)}|${l.reason}`, 60);
      const now = await api("GET", "/admin/backends");
      const ago = (at) => `${Math.max(0, (Date.now() - Date.parse(at)) / 1000).toFixed(0)} s ago`;
      const endpoints = ((now.json && now.json.pools) || []).flatMap((p) => p.endpoints.map((e) => {
        const k = `${p.route}|${p.tier}|${e.endpoint}`;
        const reasons = (m) => [...m].filter(([rk, n]) => rk.startsWith(`${k}|`) && n > 0).map(([rk, n]) => `${rk.split("|")[3]} ${n}`).join(", ");
        return {
          route: p.route, tier: p.tier, endpoint: e.endpoint,
          circuit: e.circuit === "open" && e.ejected_for_ms ? `open (${(e.ejected_for_ms / 1000).toFixed(1)} s more)` : e.circuit,
          failures: e.failures_in_a_row, in_flight: e.in_flight, latency_ms: e.latency_ms,
          last_check: e.last_check ? `${e.last_check.passed ? "passed" : "failed"} ${ago(e.last_check.at)}` : (p.checks ? "not yet" : "no checks"),
          ejections: reasons(ejections), ejections_60s: reasons(recent),
        };
      }));
      const pool = (l) => `${l.route}|${l.tier}`;
      const healthy = grouped(newest, "tiergate_endpoints_healthy", pool);
      const needed = grouped(newest, "tiergate_endpoints_needed", pool);
      const p50 = quantiles("tiergate_backend_duration_seconds", pool, 60, 0.5);
      const p99 = quantiles("tiergate_backend_duration_seconds", pool, 60, 0.99);
      const pools = [...new Set([...healthy.keys(), ...p99.keys()])].sort().map((k) => {
        const [route, tier] = k.split("|");
        return { route, tier, healthy: healthy.get(k), needed: needed.get(k), p50_ms: p50.get(k), p99_ms: p99.get(k) };
      });
      page.innerHTML = `<h1>Backends</h1>
<p class="muted">Each pool's endpoints healthy against the capacity signal's need, its calls' latency over the last 60 s; each endpoint's circuit, failures in a row, calls in flight, what its calls take lately, its last active check and why it was ejected.</p>
<h2>Pools</h2>
${table("pools", [["route", "route"], ["tier", "tier"], ["healthy", "endpoints healthy", num(0)], ["needed", "endpoints needed", num(2)], ["p50_ms", "call p50 ms", num(1)], ["p99_ms", "call p99 ms", num(1)]], pools)}
<h2>Endpoints</h2>
${table("endpoints", [["route", "route"], ["tier", "tier"], ["endpoint", "endpoint"],
        ["circuit", "circuit", (v) => `<span class="${v === "closed" ? "ok" : v === "unused" ? "muted" : "bad"}">${esc(v)}</span>`],
        ["failures", "failures in a row", num(0)], ["in_flight", "in flight", num(0)], ["latency_ms", "latency ms (recent)", num(1)],
        ["last_check", "last check", (v) => `<span class="${v.startsWith("failed") ? "bad" : ""}">${esc(v)}</span>`],
        ["ejections_60s", "ejections (60 s)"], ["ejections", "ejections since start"]], endpoints)}`;
      updated();
    };
    every(draw);
  },

  async offline(page) {
    const draw = async () => {
      const r = await api("GET", "/admin/offline?limit=100");
      if (r.status !== 200) { say(`could not read the offline queue: ${(r.json.error || {}).message || r.status}`, "bad"); return; }
      const o = r.json;
      const states = Object.entries(o.jobs).map(([state, jobs]) => ({ state, jobs }));
      const progress = (_, b) => {
        const t = b.request_counts.total || 0, done = b.request_counts.completed, bad = b.request_counts.failed;
        const w = (n) => (t ? (100 * n) / t : 0).toFixed(1);
        return `<svg width="100" height="10" role="img" aria-label="${done} done, ${bad} failed of ${t}"><rect width="100" height="10" fill="#eef1f4"/><rect width="${w(done)}" height="10" fill="#1a7f37"/><rect x="${w(done)}" width="${w(bad)}" height="10" fill="#cf222e"/></svg> ${done + bad}/${t}`;
      };
      const batches = o.batches.map((b) => ({
        id: b.id, tenant: b.tenant || "–", endpoint: b.endpoint, status: b.status,
        created: new Date(b.created_at * 1000).toISOString().replace(".000", ""),
        total: b.request_counts.total, completed: b.request_counts.completed, failed: b.request_counts.failed,
        waiting: b.quota_wait ? `${b.quota_wait.requests}: ${b.quota_wait.reason}` : "",
        cancellable: b.cancellable, request_counts: b.request_counts,
      }));
      const age = o.oldest_queued_age_s;
      page.innerHTML = `<h1>Offline</h1>
<p class="muted">The durable queue across every tenant: jobs by state, how long the oldest queued job has waited, and the Batch API's batches with their progress (newest first). Cancelling a batch does what its owner's <code>POST /v1/batches/{id}/cancel</code> does: queued jobs are cancelled, running ones finish.</p>
<p>Oldest queued job: <strong id="oldest">${age === null ? "none queued" : `${num(1)(age)} s ago`}</strong></p>
<h2>Jobs</h2>
${table("jobs", [["state", "state"], ["jobs", "jobs", num(0)]], states)}
<h2>Batches</h2>
${table("batches", [["id", "batch", (v) => `<code>${esc(v)}</code>`], ["tenant", "tenant"], ["endpoint", "endpoint"], ["status", "status", (v) => `<span class="${v === "completed" ? "ok" : v === "in_progress" ? "" : "warn"}">${esc(v)}</span>`],
        ["created", "created"], ["progress", "progress", progress], ["total", "requests", num(0)], ["completed", "completed", num(0)], ["failed", "failed", num(0)], ["waiting", "waiting (quota)"],
        ["do", "", (_, b) => (b.cancellable ? `<button type="button" class="danger" data-cancel-batch="${esc(b.id)}">cancel…</button>` : "")]], batches)}
${o.has_more ? '<p class="muted">Only the newest 100 batches are shown; <code>GET /admin/offline?after=ID</code> pages on.</p>' : ""}`;
      updated();
    };
    every(draw);
  },

  async explain(page) {
    page.innerHTML = `<h1>Explain</h1>
<p class="muted">What the gateway would do with a request, without sending it: tier, reason, the batch pool's learned cost, whether the cache would answer.</p>
<form id="explain-form" class="grid">
<label for="ex-model">model</label><input id="ex-model" placeholder="resnet50">
<label for="ex-path">or path</label><input id="ex-path" placeholder="/v1/models/x:predict">
<label for="ex-budget">budget (ms)</label><input id="ex-budget" type="number" min="1" placeholder="route default">
<label for="ex-headers">headers</label><textarea id="ex-headers" rows="3" placeholder="prefer: respond-async"></textarea>
<label for="ex-body">body (JSON)</label><textarea id="ex-body" rows="4" placeholder='{"inputs": [...]}'></textarea>
<span></span><button class="primary" type="submit">Explain</button>
</form>
<div id="explained"></div>`;
  },

  async rollouts(page) {
    let drawn = false;
    const draw = async () => {
      // Not while a change waits in the dry-run panel this page drew.
      if (drawn && $("#dryrun") && !$("#dryrun").hidden) return;
      drawn = true;
      const routes = await api("GET", "/admin/routes");
      const reports = [];
      for (const r of routes.json.routes || []) {
        const rep = await api("GET", `/admin/shadow/${encodeURIComponent(r.name)}`);
        if (rep.status === 200) reports.push(rep.json);
      }
      try { await pollStats(); } catch (_) { /* the reports still show */ }
      const canary = increase("tiergate_canary_requests_total", (l) => `${l.route}/${l.variant}/${l.result}`, 60);
      const rows = reports.map((r) => ({
        route: r.route, candidate: (r.candidate || []).map((e) => e.replace(/^[a-z]+:\/\//, "").replace(/\/$/, "")).join(" "), percent: r.percent, compared: r.compared, agreement: r.agreement,
        candidate_to_primary: r.latency ? r.latency.candidate_to_primary : null,
        gate: r.gate.met ? "met" : `unmet: ${r.gate.unmet.join("; ")}`,
        canary_60s: ["primary", "candidate"].map((v) => `${v} ${[...canary].filter(([k]) => k.startsWith(`${r.route}/${v}/`)).reduce((s, [, n]) => s + n, 0)}`).join(", "),
      }));
      const worst = reports.flatMap((r) => (r.worst || []).map((w) => ({ route: r.route, ...w })));
      page.innerHTML = `<h1>Rollouts</h1>
  <p class="muted">Each route's shadow candidate: how often it agrees with the primary, how fast it is beside it, its gate; promote (the gate shown; refused below it unless forced) or stop its canary.</p>
  ${table("rollouts", [["route", "route"], ["candidate", "candidate"], ["percent", "shadow %"], ["compared", "compared"],
        ["agreement", "agreement", (v) => bar(v, 0.99)], ["candidate_to_primary", "latency ÷ primary", num(2)], ["gate", "gate", (v) => `<span class="${v === "met" ? "ok" : "warn"}">${esc(v)}</span>`],
        ["canary_60s", "canary (60 s)"],
        ["do", "", (_, r) => `<button type="button" data-promote="${esc(r.route)}">promote…</button> <button type="button" data-abort="${esc(r.route)}">stop canary…</button>`]], rows)}
  <div id="dryrun" class="panel" hidden></div>
  <h2>Over time</h2>
  ${reports.map((r) => {
        const at = (m) => Date.parse(m.at);
        const minutes = r.minutes || [];
        const outputs = Object.entries(r.outputs || {}).map(([name, o]) => barChart(`${r.route}: ${name}, values by |candidate − primary|`,
          (o.abs_diff_histogram || []).map((b) => ({ label: b.le === "0" ? "=" : b.le === "+Inf" ? ">1" : `≤${b.le}`, value: b.values }))));
        return `<section class="charts" aria-label="${esc(r.route)}"><h3>${esc(r.route)}</h3>
  ${lineChart("agreement by minute", [{ name: "rows within tolerance", color: "#1a7f37", points: minutes.map((m) => [at(m), m.agreement]) }], { yMax: 1, ref: { value: r.gate.min_agreement, label: "gate" } })}
  ${lineChart("mean latency by minute", [{ name: "primary", color: "#0b62c4", points: minutes.map((m) => [at(m), m.primary_mean_ms]) }, { name: "candidate", color: "#9a6700", points: minutes.map((m) => [at(m), m.candidate_mean_ms]) }], { unit: " ms" })}
  ${outputs.join("")}</section>`;
      }).join("")}
  <h2>Worst disagreements</h2>
  ${table("worst", [["route", "route"], ["at", "at"], ["request_id", "request id"], ["output", "output"], ["row", "row"], ["primary", "primary", num(4)], ["candidate", "candidate", num(4)], ["abs_diff", "difference", num(4)]], worst)}`;
      updated();
    };
    every(draw);
  },

  async cache(page) {
    const draw = async () => {
      const routes = await api("GET", "/admin/routes");
      const rows = [];
      for (const r of routes.json.routes || []) {
        const c = await api("GET", `/admin/cache/${encodeURIComponent(r.name)}`);
        if (c.status === 200) rows.push({ route: r.name, on: c.json.on, entries: c.json.entries, bytes: c.json.bytes, max_bytes: c.json.max_bytes, ttl: c.json.ttl });
      }
      try { await pollStats(); } catch (_) { /* the table still shows */ }
      const looked = increase("tiergate_cache_lookups_total", (l) => `${l.route}/${l.result}`, 60);
      for (const row of rows) {
        const hits = looked.get(`${row.route}/hit`) || 0;
        const all = [...looked].filter(([k]) => k.startsWith(`${row.route}/`)).reduce((s, [, v]) => s + v, 0);
        row.hit_ratio_60s = all ? hits / all : null;
      }
      page.innerHTML = `<h1>Cache</h1>
  ${table("cache", [["route", "route"], ["on", "on", (v) => (v ? "on" : "off")], ["entries", "entries"], ["bytes", "bytes"], ["max_bytes", "max bytes"], ["ttl", "ttl"],
        ["hit_ratio_60s", "hit ratio (60 s)", (v) => (v === null ? "–" : pct(v))],
        ["do", "", (_, r) => `<button type="button" class="danger" data-invalidate="${esc(r.route)}">invalidate…</button>`]], rows)}`;
      updated();
    };
    every(draw);
  },

  async usage(page) {
    const draw = async () => {
      const r = await api("GET", "/admin/usage?since=1h&by=route,tier");
      if (r.status !== 200) { say(`could not read the usage ledger: ${r.status}`, "bad"); return; }
      const money = (c) => (c ? `${Number(c.used).toFixed(4)} ${esc(c.currency)}` : "–");
      const saved = (c) => (c ? `${Number(c.saved).toFixed(4)} ${esc(c.currency)}` : "–");
      const rows = (r.json.rows || []).map((l) => ({
        route: l.route, tier: l.tier, requests: l.requests, used_s: l.used_seconds, alone_s: l.would_have_seconds,
        saved_s: l.saved_seconds, cost: l.cost, cost_saved: l.cost, prompt_tokens: l.prompt_tokens,
        completion_tokens: l.completion_tokens, token_cost: l.token_cost, token_saved: l.token_cost,
      }));
      const t = r.json.total || {};
      page.innerHTML = `<h1>Usage</h1>
<p class="muted">The usage ledger over the last hour, by route and tier: backend seconds used, what the same answers would have cost served one by one, and what batching, the cache and precomputed answers saved; in money where the pools name a <code>cost_per_hour</code>, and LLM tokens at their tiers' prices against the real-time price where <code>[usage.prices]</code> names them (docs/operations.md, "What the usage ledger counts").</p>
${table("usage", [["route", "route"], ["tier", "tier"], ["requests", "requests"], ["used_s", "used s", num(3)], ["alone_s", "one by one s", num(3)],
        ["saved_s", "saved s", num(3)], ["cost", "cost", money], ["cost_saved", "cost saved", saved], ["prompt_tokens", "prompt tokens"],
        ["completion_tokens", "output tokens"], ["token_cost", "tokens' cost", money], ["token_saved", "tokens saved", saved]], rows)}
<p id="usage-total">All: ${num(3)(t.used_seconds)} s used, ${num(3)(t.saved_seconds)} s saved${t.cost ? `; ${money(t.cost)} used, ${saved(t.cost)} saved` : ""}${t.token_cost ? `; tokens ${money(t.token_cost)}, ${saved(t.token_cost)} saved against real time` : ""}.</p>`;
      updated();
    };
    every(draw);
  },

  async llm(page) {
    const draw = async () => {
      try { await pollStats(); } catch (e) { say(`could not read the gateway: ${e.message}`, "bad"); return; }
      // Streams over the last 60 s (tokens/s over 10 s) from the history; the windows
      // and tenants' tokens from GET /admin/tokens; cost from GET /admin/usage.
      const rt = (l) => `${l.route}/${l.tier}`;
      const ttft = [0.5, 0.99].map((q) => quantiles("tiergate_time_to_first_token_seconds", rt, 60, q));
      const tpot = [0.5, 0.99].map((q) => quantiles("tiergate_time_per_output_token_seconds", rt, 60, q));
      const tokens = increase("tiergate_tokens_total", rt, 10);
      const newest = stats.samples[stats.samples.length - 1], oldest = sampleAgo(10);
      const span = newest && oldest ? Math.max(1, (newest.at - oldest.at) / 1000) : 1;
      const open = grouped(newest, "tiergate_streams_open", rt);
      const keys = [...new Set([...ttft[0].keys(), ...tokens.keys(), ...open.keys()])].sort();
      const streams = keys.map((k) => {
        const [route, tier] = k.split("/");
        return {
          route, tier,
          ttft_p50: ttft[0].get(k), ttft_p99: ttft[1].get(k), tpot_p50: tpot[0].get(k), tpot_p99: tpot[1].get(k),
          tokens_per_s: (tokens.get(k) || 0) / span, open: open.get(k) || 0,
        };
      });
      const held = await api("GET", "/admin/tokens");
      const adapted = increase("tiergate_window_adapted_total", (l) => `${l.route}|${l.direction}`, 60);
      const windows = ((held.json && held.json.windows) || []).map((w) => ({
        ...w,
        adapted_60s: [...adapted].filter(([k, n]) => k.startsWith(`${w.route}|`) && n > 0).map(([k, n]) => `${k.split("|")[1]} ${n}`).join(", "),
      }));
      const tenants = (held.json && held.json.tenants) || [];
      const against = (p) => (p.limit === null ? `${p.used} (no limit)` : `${fullness(p.used / p.limit)} ${p.used} of ${p.limit}`);
      const usage = await api("GET", "/admin/usage?since=1h&by=route,tier");
      const money = (c) => (c ? `${Number(c.used).toFixed(4)} ${esc(c.currency)}` : "–");
      const saved = (c) => (c ? `${Number(c.saved).toFixed(4)} ${esc(c.currency)}` : "–");
      const cost = ((usage.json && usage.json.rows) || []).filter((l) => l.prompt_tokens + l.completion_tokens > 0)
        .map((l) => ({ route: l.route, tier: l.tier, prompt: l.prompt_tokens, completion: l.completion_tokens, cost: l.token_cost, saved: l.token_cost }));
      page.innerHTML = `<h1>LLM</h1>
<p class="muted">Streams by route and tier: time to first token and per output token over the last 60 s, tokens a second over the last 10 s, streams open now. The batch pools' admission windows now (docs/policy.md, "The admission window for LLM calls"), each tenant's tokens against its token limits as the usage ledger counts them, and the tokens' cost over the last hour against the real-time price.</p>
${table("llm", [["route", "route"], ["tier", "tier"], ["ttft_p50", "TTFT p50 ms", num(1)], ["ttft_p99", "TTFT p99 ms", num(1)],
        ["tpot_p50", "TPOT p50 ms", num(2)], ["tpot_p99", "TPOT p99 ms", num(2)], ["tokens_per_s", "tokens/s", num(1)], ["open", "streams open", num(0)]], streams)}
<h2>Batch pools' windows</h2>
${table("windows", [["route", "route"], ["sequences", "sequences", (v, r) => `${fullness(r.max_sequences ? v / r.max_sequences : 1)} ${v} of ${r.max_sequences}`],
        ["tokens", "tokens held", (v, r) => (r.max_tokens === null ? `${v} (no limit)` : `${fullness(v / r.max_tokens)} ${v} of ${r.max_tokens}`)],
        ["adapted_60s", "moved (60 s)"]], windows)}
<h2>Tenants' tokens against their limits</h2>
${table("token-limits", [["route", "route"], ["tenant", "tenant (* the route's)"], ["minute", "last minute", against], ["day", "today (UTC)", against], ["month", "this month", against]], tenants)}
<h2>Tokens' cost (last hour)</h2>
${table("token-cost", [["route", "route"], ["tier", "tier"], ["prompt", "prompt tokens", num(0)], ["completion", "output tokens", num(0)],
        ["cost", "cost", money], ["saved", "saved against real time", saved]], cost)}`;
      updated();
    };
    every(draw);
  },
};

/** Shows a change's dry run, then applies it with the same ETag when asked. */
async function dryRun(title, method, path, body, etag) {
  const panel = $("#dryrun");
  const headers = etag ? { "If-Match": etag } : {};
  const dry = await api(method, `${path}?dry_run=true`, { body, headers });
  panel.hidden = false;
  if (dry.status !== 200) {
    const problems = (dry.json.error && dry.json.error.problems) || [];
    panel.innerHTML = `<h2>${esc(title)}: refused</h2><p class="bad">${esc(dry.json.error ? dry.json.error.message : dry.status)}</p>
<ul>${problems.map((p) => `<li><code>${esc(p.path)}</code>: ${esc(p.message)}</li>`).join("")}</ul>`;
    return;
  }
  const d = dry.json;
  const gate = d.gate ? `<p class="${d.gate.met ? "ok" : "warn"}">Gate: ${d.gate.met ? "met" : `unmet: ${esc(d.gate.unmet.join("; "))}`}</p>` : "";
  panel.innerHTML = `<h2>Dry run: ${esc(title)}</h2>${gate}
<p>${d.changed ? `Version ${d.version_before} → a new version; files: ${esc(d.files.join(", "))}.` : "Nothing would change."}</p>
<h3>Requests served differently (${d.decisions.length})</h3>
${table("decisions", [["request", "request", (v) => esc(v)], ["before", "before"], ["after", "after"]], d.decisions)}
<pre>${esc(d.diff)}</pre>
<button type="button" class="primary" id="apply" ${d.changed ? "" : "disabled"}>Apply</button> <button type="button" id="cancel-change">Cancel</button>`;
  $("#apply").focus();
  $("#apply").onclick = async () => {
    const done = await api(method, path, { body, headers });
    if (done.status === 200) {
      say(`applied: version ${done.json.version_after}`, "ok");
      showPage();
    } else {
      const forced = done.json.error && done.json.error.code === "gate_not_met" && path.endsWith("/promote");
      const route = path.split("/")[3];
      panel.innerHTML = `<p class="bad" id="refused">Not applied (${done.status}): ${esc(done.json.error ? done.json.error.message : "")}</p>
${forced ? `<button type="button" class="danger" data-force="${esc(decodeURIComponent(route))}">promote anyway, past the gate…</button>` : ""}`;
    }
  };
  $("#cancel-change").onclick = () => { panel.hidden = true; };
}

document.addEventListener("click", async (event) => {
  const b = event.target.closest("button");
  if (!b) return;
  try {
    if (b.dataset.export) download(b.dataset.export, b.dataset.as);
    if (b.dataset.toggle) {
      const route = await api("GET", `/admin/routes/${encodeURIComponent(b.dataset.toggle)}`);
      await dryRun(`turn ${b.dataset.flag} ${b.dataset.to === "true" ? "on" : "off"} on ${b.dataset.toggle}`, "PUT",
        `/admin/routes/${encodeURIComponent(b.dataset.toggle)}/flags/${b.dataset.flag}`, b.dataset.to, route.etag);
    }
    if (b.dataset.promote) {
      const path = `/admin/shadow/${encodeURIComponent(b.dataset.promote)}/promote`;
      const route = await api("GET", `/admin/routes/${encodeURIComponent(b.dataset.promote)}`);
      await dryRun(`promote ${b.dataset.promote}'s candidate`, "POST", path, undefined, route.etag);
    }
    if (b.dataset.abort) {
      const route = await api("GET", `/admin/routes/${encodeURIComponent(b.dataset.abort)}`);
      await dryRun(`stop ${b.dataset.abort}'s canary`, "PATCH", `/admin/routes/${encodeURIComponent(b.dataset.abort)}`,
        { shadow: { canary_percent: 0 } }, route.etag);
    }
    if (b.dataset.force) {
      const route = await api("GET", `/admin/routes/${encodeURIComponent(b.dataset.force)}`);
      const done = await api("POST", `/admin/shadow/${encodeURIComponent(b.dataset.force)}/promote?force=true`, { headers: { "If-Match": route.etag } });
      say(done.status === 200 ? `promoted past the gate: version ${done.json.version_after}` : `not promoted (${done.status})`, done.status === 200 ? "ok" : "bad");
      if (done.status === 200) showPage();
    }
    if (b.dataset.rollback) {
      const policy = await api("GET", "/admin/policy");
      await dryRun(`roll back to version ${b.dataset.rollback}`, "POST", "/admin/policy/rollback", { version: Number(b.dataset.rollback) }, policy.etag);
    }
    if (b.dataset.diff) {
      const d = await api("GET", `/admin/policy/history/${b.dataset.diff}/diff`);
      const pre = $("#diff");
      pre.hidden = false;
      pre.textContent = d.status === 200 ? d.json.diff || "(no change in the files)" : (d.json.error || {}).message;
    }
    if (b.dataset.cancelBatch) {
      if (!confirm(`Cancel batch ${b.dataset.cancelBatch}? Its queued requests will not run.`)) return;
      const r = await api("POST", `/admin/batches/${encodeURIComponent(b.dataset.cancelBatch)}/cancel`);
      say(r.status === 200 ? `batch ${b.dataset.cancelBatch}: ${r.json.status}` : `not cancelled (${r.status}): ${(r.json.error || {}).message || ""}`, r.status === 200 ? "ok" : "bad");
      showPage();
    }
    if (b.dataset.invalidate) {
      if (!confirm(`Drop every entry of ${b.dataset.invalidate}'s cache?`)) return;
      const r = await api("POST", `/admin/cache/${encodeURIComponent(b.dataset.invalidate)}/invalidate`);
      say(r.status === 200 ? `invalidated ${b.dataset.invalidate}: ${r.json.invalidated} entries` : `not invalidated (${r.status})`, r.status === 200 ? "ok" : "bad");
      showPage();
    }
  } catch (e) { say(e.message, "bad"); }
});

document.addEventListener("submit", async (event) => {
  if (event.target.id === "login-form") return login(event);
  if (event.target.id === "setting-form") {
    event.preventDefault();
    const route = $("#set-route").value, key = $("#set-key").value, value = $("#set-value").value.trim();
    const path = `/admin/routes/${encodeURIComponent(route)}`;
    const current = await api("GET", path);
    // The percentage is a flag (a number); a threshold is a duration, patched into the route.
    if (key === "micro_batch_percent") await dryRun(`set ${key} to ${value} on ${route}`, "PUT", `${path}/flags/${key}`, value, current.etag);
    else await dryRun(`set ${key} to ${value} on ${route}`, "PATCH", path, { [key]: value }, current.etag);
    return;
  }
  if (event.target.id !== "explain-form") return;
  event.preventDefault();
  const ask = {};
  if ($("#ex-model").value) ask.model = $("#ex-model").value.trim();
  if ($("#ex-path").value) ask.path = $("#ex-path").value.trim();
  if ($("#ex-budget").value) ask.budget_ms = Number($("#ex-budget").value);
  const headers = {};
  for (const line of $("#ex-headers").value.split("\n")) {
    const at = line.indexOf(":");
    if (at > 0) headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  ask.headers = headers;
  if ($("#ex-body").value.trim()) {
    try { ask.body = JSON.parse($("#ex-body").value); } catch (e) { say(`the body is not JSON: ${e.message}`, "bad"); return; }
  }
  const r = await api("POST", "/admin/explain", { body: ask });
  const out = $("#explained");
  if (r.status !== 200) { out.innerHTML = `<p class="bad">${esc((r.json.error || {}).message || r.status)}</p>`; return; }
  const e = r.json, res = e.result || {}, batch = e.micro_batch, cost = batch && batch.learned_cost;
  out.innerHTML = `<div class="panel"><p>Route <strong>${esc(e.route)}</strong> (policy v${esc(e.policy_version)}): <strong id="explained-tier">${esc(res.tier || res.status)}</strong>, reason <code>${esc(res.reason)}</code>${res.budget_ms ? `, budget ${num(0)(res.budget_ms)} ms from ${esc(res.budget_source)}` : ""}.</p>
${cost ? `<p>Batch pool: ${num(2)(cost.fixed_ms)} ms + ${num(3)(cost.per_row_ms)} ms/row (${cost.samples} batches); a full batch ~ ${num(1)(cost.full_batch_ms)} ms; ${batch.queued_rows} rows queued.</p>` : batch ? "<p>Batch pool: cost not learned yet.</p>" : ""}
${e.cache ? `<p>Cache: ${esc(e.cache.would)}.</p>` : ""}
<details><summary>The whole answer</summary><pre>${esc(JSON.stringify(e, null, 2))}</pre></details></div>`;
});

// ---- navigation -------------------------------------------------------------------

async function showPage() {
  stopPolling();
  if (!sessionStorage.getItem(TOKEN_KEY)) return showLogin("");
  const name = (location.hash || "#overview").slice(1);
  const page = $("#page");
  $("#login").hidden = true;
  $("#logout").hidden = false;
  page.hidden = false;
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.getAttribute("href") === `#${name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  try {
    await (pages[name] || pages.overview)(page);
  } catch (e) { if (e.message !== "unauthenticated" && e.message !== "not logged in") say(e.message, "bad"); }
}

window.addEventListener("hashchange", showPage);
$("#logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showLogin("Logged out."); });
showPage();
