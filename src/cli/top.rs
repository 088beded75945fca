//! `tiergate top`: a live view of a running gateway in the terminal, read from its
//! metrics endpoint, for a box without Grafana, in 80 columns. Per route and tier that
//! served something over the last interval (the idle ones with `--all`): request rate,
//! p50/p99 latency (from the histogram buckets), SLO attainment, shed rate, queue depth
//! and mean batch size; then, per route that has them, its cache's hit ratio, its
//! shadow's comparisons, its canary's split and errors, and its priority bands.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;

use crate::cli::client;

/// Outcomes counted as shed (429/503 refusals).
const SHED: [&str; 6] = [
    "shed",
    "queue_full",
    "deadline_unmeetable",
    "store_full",
    "rate_limited",
    "overloaded",
];

/// Arguments of `tiergate top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The gateway's metrics endpoint (`host:port` or a URL, with or without `/metrics`).
    #[arg(long, default_value = "http://127.0.0.1:8002", env = "TIERGATE_METRICS_URL")]
    metrics_url: String,
    /// Time between frames (rates and percentiles are over this interval; more than 0s).
    #[arg(long, default_value = "2s", value_parser = interval)]
    interval: Duration,
    /// Print one frame (two scrapes an interval apart) and exit.
    #[arg(long)]
    once: bool,
    /// Show the routes and tiers that served nothing in the interval too.
    #[arg(long)]
    all: bool,
}

/// A frame interval: a duration of more than zero (rates are per second of it).
fn interval(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be more than 0s: rates are counted over it".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// One scrape: (metric name, sorted labels) → value.
type Samples = BTreeMap<(String, Vec<(String, String)>), f64>;

/// Runs the view until interrupted (or one frame with `--once`).
pub async fn run(args: TopArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut before = scrape(&args.metrics_url).await?;
    loop {
        tokio::time::sleep(args.interval).await;
        let now = scrape(&args.metrics_url).await?;
        let frame = render(
            &before,
            &now,
            (args.interval.as_secs_f64(), args.all),
            &args.metrics_url,
        );
        if args.once {
            print!("{frame}");
            return Ok(std::process::ExitCode::SUCCESS);
        }
        print!("\x1b[2J\x1b[H{frame}");
        before = now;
    }
}

async fn scrape(url: &str) -> anyhow::Result<Samples> {
    let (status, _, body) = client::request(url, "GET", "/metrics", &[], Bytes::new())
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the metrics endpoint at {url}: {e}"))?;
    anyhow::ensure!(status == 200, "{url}/metrics answered {status}");
    Ok(parse(&String::from_utf8_lossy(&body)))
}

/// Parses the Prometheus text format (the subset the gateway writes).
fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        out.insert((name.to_owned(), labels), value);
    }
    out
}

fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(',').trim().to_owned(), value));
        rest = &after[end..];
    }
    out.sort();
    out
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Sum over series of `name` whose labels pass `keep`, grouped by (route, tier).
fn by_route_tier(
    samples: &Samples,
    name: &str,
    keep: impl Fn(&[(String, String)]) -> bool,
) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for ((n, l), v) in samples {
        if n == name && keep(l) {
            let key = (
                label(l, "route").unwrap_or("-").to_owned(),
                label(l, "tier").unwrap_or("-").to_owned(),
            );
            *out.entry(key).or_insert(0.0) += v;
        }
    }
    out
}

/// [`by_route_tier`] on both scrapes.
type Pair = (BTreeMap<(String, String), f64>, BTreeMap<(String, String), f64>);

fn both(before: &Samples, now: &Samples, name: &str, keep: impl Fn(&[(String, String)]) -> bool + Copy) -> Pair {
    (by_route_tier(before, name, keep), by_route_tier(now, name, keep))
}

fn delta(
    before: &BTreeMap<(String, String), f64>,
    now: &BTreeMap<(String, String), f64>,
    key: &(String, String),
) -> f64 {
    (now.get(key).copied().unwrap_or(0.0) - before.get(key).copied().unwrap_or(0.0)).max(0.0)
}

/// The `q` quantile of the latency observed between two scrapes, from the buckets.
fn quantile(before: &Samples, now: &Samples, route: &str, tier: &str, q: f64) -> Option<f64> {
    let bucket = |s: &Samples| -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = s
            .iter()
            .filter(|((n, l), _)| {
                n == "tiergate_request_duration_seconds_bucket"
                    && label(l, "route") == Some(route)
                    && label(l, "tier") == Some(tier)
            })
            .filter_map(|((_, l), v)| {
                let le = label(l, "le")?;
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((le, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    };
    let (b, n) = (bucket(before), bucket(now));
    let counts: Vec<(f64, f64)> = n
        .iter()
        .map(|(le, v)| (*le, v - b.iter().find(|(l, _)| l == le).map_or(0.0, |(_, v)| *v)))
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in counts {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            // Linear inside the bucket, as Prometheus's histogram_quantile does.
            let share = if count > lower.1 {
                (rank - lower.1) / (count - lower.1)
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * share);
        }
        lower = (le, count);
    }
    None
}

/// One frame: a row per route and tier that has served requests (every one with
/// `all`), and per route whose offline jobs ended (Batch API work, which no door counts:
/// its rate is jobs ended); then a line per route and feature in use.
fn render(before: &Samples, now: &Samples, (secs, all): (f64, bool), url: &str) -> String {
    let any = |_: &[(String, String)]| true;
    let requests = both(before, now, "tiergate_requests_total", any);
    let is_shed = |l: &[(String, String)]| label(l, "outcome").is_some_and(|o| SHED.contains(&o));
    let shed = both(before, now, "tiergate_requests_total", is_shed);
    let met = |l: &[(String, String)]| label(l, "result") == Some("met");
    let slo_met = both(before, now, "tiergate_slo_requests_total", met);
    let slo_all = both(before, now, "tiergate_slo_requests_total", any);
    let in_flight = by_route_tier(now, "tiergate_in_flight_requests", any);
    let queued = by_route_tier(now, "tiergate_batch_queue_rows", any);
    let rows = both(before, now, "tiergate_batch_rows_sum", any);
    let batches = both(before, now, "tiergate_batch_rows_count", any);
    let offline_queued = now
        .iter()
        .filter(|((n, l), _)| n == "tiergate_offline_jobs" && label(l, "state") == Some("queued"))
        .map(|(_, v)| *v)
        .fold(0.0, |a, b| a + b);
    let version = now
        .iter()
        .find(|((n, _), _)| n == "tiergate_policy_version")
        .map_or(0.0, |(_, v)| *v);

    let mut out = format!(
        "tiergate top: {url}, policy v{version}, last {secs:.1} s; offline queued: {offline_queued}\n\n\
         {:<14} {:<11} {:>7} {:>7} {:>7} {:>6} {:>7} {:>6} {:>6}\n",
        "route", "tier", "req/s", "p50 ms", "p99 ms", "SLO %", "shed/s", "queue", "rows/b"
    );
    let mut keys: std::collections::BTreeSet<&(String, String)> = requests.1.keys().collect();
    keys.extend(slo_all.1.keys());
    let mut idle = 0;
    for key in keys.into_iter().filter(|(_, tier)| tier != "none") {
        let (route, tier) = key;
        let rate = match requests.1.contains_key(key) {
            true => delta(&requests.0, &requests.1, key),
            false => delta(&slo_all.0, &slo_all.1, key),
        } / secs;
        let route_only = (route.clone(), "-".to_owned());
        let queue = match tier.as_str() {
            "micro_batch" => queued.get(&route_only).copied().unwrap_or(0.0),
            _ => in_flight.get(key).copied().unwrap_or(0.0),
        };
        if rate == 0.0 && queue == 0.0 && !all {
            idle += 1;
            continue;
        }
        let ms = |q| quantile(before, now, route, tier, q).map_or("-".to_owned(), |s| format!("{:.1}", s * 1000.0));
        let slo_n = delta(&slo_all.0, &slo_all.1, key);
        let slo = if slo_n > 0.0 {
            format!("{:.1}", 100.0 * delta(&slo_met.0, &slo_met.1, key) / slo_n)
        } else {
            "-".to_owned()
        };
        let batch = match (tier.as_str(), delta(&batches.0, &batches.1, &route_only)) {
            ("micro_batch", n) if n > 0.0 => format!("{:.1}", delta(&rows.0, &rows.1, &route_only) / n),
            _ => "-".to_owned(),
        };
        out.push_str(&format!(
            "{:<14} {:<11} {:>7.1} {:>7} {:>7} {:>6} {:>7.1} {:>6} {:>6}\n",
            clip(route, 14),
            tier,
            rate,
            ms(0.5),
            ms(0.99),
            slo,
            delta(&shed.0, &shed.1, key) / secs,
            queue,
            batch
        ));
    }
    if idle > 0 {
        out.push_str(&format!("({idle} idle, not shown: --all shows them)\n"));
    }
    let features = features(before, now, secs);
    if !features.is_empty() {
        out.push('\n');
        out.push_str(&features);
    }
    out
}

/// `text`, cut to `width` characters (a `~` marks the cut).
fn clip(text: &str, width: usize) -> String {
    match text.chars().count() > width {
        true => text.chars().take(width - 1).chain(['~']).collect(),
        false => text.to_owned(),
    }
}

/// Per route, over the interval: a series' increase by one label's values.
fn increase_by(before: &Samples, now: &Samples, name: &str, key: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for ((n, l), v) in now {
        if n != name {
            continue;
        }
        let old = before.get(&(n.clone(), l.clone())).copied().unwrap_or(0.0);
        let k = (
            label(l, "route").unwrap_or("-").to_owned(),
            label(l, key).unwrap_or("-").to_owned(),
        );
        *out.entry(k).or_insert(0.0) += (v - old).max(0.0);
    }
    out
}

/// The lines of the features in use, one per route and feature: the cache's hit ratio,
/// the shadow's comparisons, the canary's split and errors, the priority bands.
fn features(before: &Samples, now: &Samples, secs: f64) -> String {
    let mut out = String::new();
    let per = |map: &BTreeMap<(String, String), f64>, route: &str, value: &str| {
        map.get(&(route.to_owned(), value.to_owned())).copied().unwrap_or(0.0)
    };
    let routes = |map: &BTreeMap<(String, String), f64>| {
        map.iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|((r, _), _)| r.clone())
            .collect::<std::collections::BTreeSet<String>>()
    };
    let lookups = increase_by(before, now, "tiergate_cache_lookups_total", "result");
    for route in routes(&lookups) {
        let (hit, miss, coalesced, bypass) = (
            per(&lookups, &route, "hit"),
            per(&lookups, &route, "miss"),
            per(&lookups, &route, "coalesced"),
            per(&lookups, &route, "bypass"),
        );
        let total = hit + miss + coalesced + bypass;
        out.push_str(&format!(
            "cache   {}: {:.1}% hits of {:.1}/s ({:.1}/s coalesced, {:.1}/s bypass)\n",
            clip(&route, 14),
            100.0 * hit / total,
            total / secs,
            coalesced / secs,
            bypass / secs
        ));
    }
    let compared = increase_by(before, now, "tiergate_shadow_compared_total", "tier");
    let outside = increase_by(before, now, "tiergate_shadow_rows_total", "verdict");
    for route in routes(&compared) {
        let n: f64 = compared.iter().filter(|((r, _), _)| *r == route).map(|(_, v)| v).sum();
        out.push_str(&format!(
            "shadow  {}: {:.1} compared/s, {} rows outside tolerance\n",
            clip(&route, 14),
            n / secs,
            per(&outside, &route, "outside")
        ));
    }
    let canary = increase_by(before, now, "tiergate_canary_requests_total", "variant");
    let errors = both(before, now, "tiergate_canary_requests_total", |l| {
        label(l, "result") == Some("error")
    });
    for route in routes(&canary) {
        let (candidate, primary) = (per(&canary, &route, "candidate"), per(&canary, &route, "primary"));
        let failed: f64 = errors
            .1
            .keys()
            .filter(|(r, _)| *r == route)
            .map(|k| delta(&errors.0, &errors.1, k))
            .sum();
        out.push_str(&format!(
            "canary  {}: candidate {:.1}/s, primary {:.1}/s, {:.1}% errors\n",
            clip(&route, 14),
            candidate / secs,
            primary / secs,
            100.0 * failed / (candidate + primary)
        ));
    }
    let bands = increase_by(before, now, "tiergate_batch_priority_requests_total", "priority");
    for route in routes(&bands) {
        out.push_str(&format!(
            "bands   {}: critical {:.1}/s, standard {:.1}/s, sheddable {:.1}/s\n",
            clip(&route, 14),
            per(&bands, &route, "critical") / secs,
            per(&bands, &route, "standard") / secs,
            per(&bands, &route, "sheddable") / secs
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE tiergate_requests_total counter
tiergate_requests_total{route="r",tier="realtime",outcome="ok"} 100
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="0.001"} 0
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="0.01"} 50
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="+Inf"} 100
"#;
    const NOW: &str = r#"tiergate_requests_total{route="r",tier="realtime",outcome="ok"} 280
tiergate_requests_total{route="r",tier="realtime",outcome="shed"} 20
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="0.001"} 100
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="0.01"} 250
tiergate_request_duration_seconds_bucket{route="r",tier="realtime",le="+Inf"} 300
tiergate_slo_requests_total{route="r",tier="realtime",result="met"} 180
tiergate_slo_requests_total{route="r",tier="realtime",result="missed"} 20
tiergate_in_flight_requests{route="r",tier="realtime"} 3
"#;

    #[test]
    fn labels_with_escapes_parse() {
        let samples = parse(r#"m{a="x\"y",b="z"} 1.5"#);
        let ((name, labels), value) = samples.iter().next().expect("one sample");
        assert_eq!(name, "m");
        assert_eq!(
            labels,
            &[("a".to_owned(), "x\"y".to_owned()), ("b".to_owned(), "z".to_owned())]
        );
        assert_eq!(*value, 1.5);
    }

    #[test]
    fn quantiles_come_from_the_buckets_of_the_interval() {
        let (before, now) = (parse(BEFORE), parse(NOW));
        // 200 requests in the interval: 100 under 1 ms, 100 in (1 ms, 10 ms].
        let p50 = quantile(&before, &now, "r", "realtime", 0.5).expect("p50");
        assert!((p50 - 0.001).abs() < 1e-9, "{p50}");
        let p99 = quantile(&before, &now, "r", "realtime", 0.99).expect("p99");
        assert!((p99 - 0.00982).abs() < 1e-6, "{p99}");
        assert_eq!(
            quantile(&now, &now, "r", "realtime", 0.5),
            None,
            "no requests, no percentile"
        );
    }

    #[test]
    fn routes_fed_only_by_the_batch_api_have_a_row() {
        let before = "tiergate_slo_requests_total{route=\"nightly\",tier=\"offline\",result=\"met\"} 10\n";
        let now = "tiergate_slo_requests_total{route=\"nightly\",tier=\"offline\",result=\"met\"} 30\n";
        let frame = render(&parse(before), &parse(now), (2.0, false), "http://x");
        let row = frame
            .lines()
            .find(|l| l.starts_with("nightly "))
            .unwrap_or_else(|| panic!("a row: {frame}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[..3], ["nightly", "offline", "10.0"], "{frame}");
    }

    #[test]
    fn a_zero_interval_is_refused() {
        assert!(interval("0s").expect_err("zero").contains("more than 0s"));
        assert_eq!(interval("250ms"), Ok(Duration::from_millis(250)));
    }

    #[test]
    fn a_frame_shows_rate_slo_shed_and_queue() {
        let frame = render(&parse(BEFORE), &parse(NOW), (2.0, false), "http://x");
        let row = frame.lines().find(|l| l.starts_with("r ")).expect("a row for route r");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["r", "realtime", "100.0", "1.0", "9.8", "90.0", "10.0", "3", "-"],
            "{frame}"
        );
    }

    #[test]
    fn idle_rows_are_hidden_the_features_in_use_shown_and_every_line_fits_80_columns() {
        let idle =
            "tiergate_requests_total{route=\"quiet-route-with-a-long-name\",tier=\"realtime\",outcome=\"ok\"} 5\n";
        let features = r#"tiergate_cache_lookups_total{route="r",result="hit"} 90
tiergate_cache_lookups_total{route="r",result="miss"} 10
tiergate_shadow_compared_total{route="r",tier="realtime"} 20
tiergate_canary_requests_total{route="r",tier="realtime",variant="candidate",result="ok"} 9
tiergate_canary_requests_total{route="r",tier="realtime",variant="candidate",result="error"} 1
tiergate_canary_requests_total{route="r",tier="realtime",variant="primary",result="ok"} 90
tiergate_batch_priority_requests_total{route="r",priority="critical",outcome="queued"} 4
"#;
        let (before, now) = (format!("{BEFORE}{idle}"), format!("{NOW}{idle}{features}"));
        let frame = render(&parse(&before), &parse(&now), (2.0, false), "http://gateway:8002");
        assert!(!frame.contains("quiet-route"), "idle rows hidden: {frame}");
        assert!(frame.contains("(1 idle, not shown"), "{frame}");
        for want in [
            "cache   r: 90.0% hits of 50.0/s",
            "shadow  r: 10.0 compared/s",
            "canary  r: candidate 5.0/s, primary 45.0/s, 1.0% errors",
            "bands   r: critical 2.0/s",
        ] {
            assert!(frame.contains(want), "{want} in {frame}");
        }
        let every = render(&parse(&before), &parse(&now), (2.0, true), "http://gateway:8002");
        assert!(every.contains("quiet-route-w~"), "--all shows it, clipped: {every}");
        for line in every.lines() {
            assert!(line.chars().count() <= 80, "{} columns: {line:?}", line.chars().count());
        }
    }
}
