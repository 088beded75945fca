//! Metrics after a mixed workload: every family documented in docs/operations.md is
//! exported, the counts match the requests sent, and every metric the Grafana dashboard
//! and the alerting rules in deploy/ query is one the gateway exports.
//!
//! The gateway is a `tiergate serve` child process: its metrics recorder is its own, so
//! the counts are exactly this workload's.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use tokio::time::Instant;

/// The value of the one series with all of `labels`, or 0 when there is none.
fn value(scrape: &str, name: &str, labels: &[&str]) -> f64 {
    let series: Vec<f64> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number"))
        .collect();
    assert!(series.len() <= 1, "{name}{labels:?} matches {} series", series.len());
    series.first().copied().unwrap_or(0.0)
}

/// Every `tiergate_*` metric name in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tiergate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

/// Families in the scrape (histograms by their base name as well as their series).
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in scrape.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name: String = line.chars().take_while(|c| *c != '{' && *c != ' ').collect();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                out.insert(base.to_owned());
            }
        }
        out.insert(name);
    }
    out
}

#[tokio::test]
async fn a_mixed_workload_shows_in_every_documented_family() {
    let tiny = tiergate::sim::LlmProfile::named("llm-tiny").expect("profile");
    let sim = backend_with(vec![
        tiergate::sim::ModelSpec::new("m", Default::default()),
        tiergate::sim::ModelSpec::new("c", Default::default()),
        tiergate::sim::ModelSpec::llm("llama", tiny),
    ])
    .await;
    let dead = dead_addr().await;
    let redis = common::redis::Redis::start().await; // the cache's shared second level
    let policy = format!(
        r#"
[routes.obs]
models = ["m"]
realtime_below = "300ms"
offline_from = "30s"
[routes.obs.flags]
realtime = true
micro_batch = true
offline = true
shadow = true
[routes.obs.shadow]
tiers = ["realtime"]
[routes.obs.shadow.candidate]
endpoints = ["{live}"]
[routes.obs.borrow]
offline_on_realtime = true
[routes.obs.realtime]
endpoints = ["{live}", "http://{dead}"]
max_concurrency = 8
[routes.obs.realtime.health]
eject_after = 1
[routes.obs.micro_batch]
endpoints = ["{live}"]
max_batch = 8
max_wait = "20ms"
[routes.obscache]
models = ["c"]
[routes.obscache.flags]
cache = true
[routes.obscache.realtime]
endpoints = ["{live}"]
[routes.obscache.cache]
[routes.obsllm]
models = ["llama"]
paths = ["/v1/chat/completions"]
[routes.obsllm.realtime]
endpoints = ["{live}"]
"#,
        live = sim.url()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("policies")).expect("dir");
    std::fs::write(dir.path().join("policies/obs.toml"), policy).expect("policy");
    let env = [
        // Far above use: the gauge is exported, nothing is shed.
        ("TIERGATE_LIMITS__MAX_RSS_BYTES", (64u64 << 30).to_string()),
        ("TIERGATE_CACHE__REDIS", redis.url()),
        ("TIERGATE_METRICS__TENANT_LABELS", "true".to_owned()),
    ];
    let mut gw = common::served::serve(dir.path(), &env.each_ref().map(|(k, v)| (*k, v.as_str())));
    let addr = gw.http;

    // 20 real-time calls, one after another (some first try the dead endpoint, which is
    // ejected; the connect failure moves the call to the live one).
    for _ in 0..20 {
        let a = infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    // A chat call streamed to its end: the stream, its tokens, its TTFT and TPOT.
    let chat =
        r#"{"model": "llama", "stream": true, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}"#;
    let streamed = send(
        "POST",
        addr,
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        chat,
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(streamed.text().ends_with("data: [DONE]\n\n"), "{}", streamed.text());
    // 10 micro-batch calls at once.
    let mut batch = tokio::task::JoinSet::new();
    for _ in 0..10 {
        batch.spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "3000")], BODY).await });
    }
    for a in batch.join_all().await {
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.tier().0, Some("micro_batch"));
    }
    // 3 offline jobs, each waited for.
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let a = infer(addr, "m", &[("prefer", "respond-async")], BODY).await;
        assert_eq!(a.status, 202, "{}", a.text());
        jobs.push(a.header("location").expect("location").to_owned());
    }
    let limit = Instant::now() + Duration::from_secs(20);
    for job in &jobs {
        while get(addr, job).await.status != 200 {
            assert!(Instant::now() < limit, "job {job} did not finish in 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await; // polling the job API, as a client does
        }
    }
    // The same question twice on a route with a cache: a miss, then a hit.
    for how in ["miss", "hit"] {
        let a = infer(addr, "c", &[("x-tiergate-budget-ms", "250")], BODY).await;
        assert_eq!(
            (a.status, a.header("x-tiergate-cache")),
            (200, Some(how)),
            "{}",
            a.text()
        );
    }
    // Two bad bodies and an unknown model.
    for _ in 0..2 {
        assert_eq!(infer(addr, "m", &[], "{bad").await.status, 400);
    }
    assert_eq!(infer(addr, "nope", &[], BODY).await.status, 404);

    // The offline gauges are refreshed every second: wait for the finished jobs there.
    let limit = Instant::now() + Duration::from_secs(10);
    let scrape = loop {
        let scrape = get(gw.metrics, "/metrics").await.text();
        // The usage ledger's totals and the capacity signal too (its ticker's period is
        // 2 s): every family, since a scrape reads the counters before the gauges and the
        // ledger's first tick may register them in between.
        let ticked = [
            "tiergate_usage_requests_total{",
            "tiergate_usage_rows_total{",
            "tiergate_usage_backend_seconds{",
            "tiergate_usage_alone_seconds{",
            "tiergate_usage_saved_seconds{",
            "tiergate_usage_tenant_requests_total{",
            "tiergate_usage_tenant_backend_seconds{",
            "tiergate_endpoints_needed{",
            "tiergate_endpoints_healthy{",
        ]
        .iter()
        .all(|family| scrape.contains(family));
        if value(&scrape, "tiergate_offline_jobs", &["state=\"succeeded\""]) >= 3.0 && ticked {
            break scrape;
        }
        assert!(
            Instant::now() < limit,
            "the offline gauges did not show 3 jobs, or the usage ledger never ticked:\n{scrape}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // the sweep's period is 1 s
    };
    let r = "route=\"obs\"";
    let count = |name: &str, labels: &[&str]| value(&scrape, name, &[&[r][..], labels].concat());

    // Requests by tier and outcome: exactly what was sent.
    assert_eq!(
        count("tiergate_requests_total", &["tier=\"realtime\"", "outcome=\"ok\""]),
        20.0
    );
    assert_eq!(
        count("tiergate_requests_total", &["tier=\"micro_batch\"", "outcome=\"ok\""]),
        10.0
    );
    assert_eq!(
        count("tiergate_requests_total", &["tier=\"offline\"", "outcome=\"ok\""]),
        3.0
    );
    assert_eq!(
        count("tiergate_requests_total", &["tier=\"none\"", "outcome=\"bad_request\""]),
        2.0
    );
    assert_eq!(
        value(&scrape, "tiergate_unmatched_requests_total", &["door=\"http\""]),
        1.0
    );
    assert_eq!(
        count(
            "tiergate_decisions_total",
            &["tier=\"realtime\"", "reason=\"budget_realtime\""]
        ),
        20.0
    );
    assert_eq!(
        count("tiergate_request_duration_seconds_count", &["tier=\"realtime\""]),
        20.0
    );
    assert_eq!(
        count("tiergate_request_duration_seconds_count", &["tier=\"micro_batch\""]),
        10.0
    );
    assert_eq!(count("tiergate_in_flight_requests", &["tier=\"realtime\""]), 0.0);

    // SLO: every classified real-time and micro-batch request, and every finished job.
    for (tier, n) in [("realtime", 20.0), ("micro_batch", 10.0), ("offline", 3.0)] {
        let tier = format!("tier=\"{tier}\"");
        let met = count("tiergate_slo_requests_total", &[&tier, "result=\"met\""]);
        let missed = count("tiergate_slo_requests_total", &[&tier, "result=\"missed\""]);
        assert_eq!(met + missed, n, "{tier}: met {met} + missed {missed}");
        assert!(met > 0.0, "{tier}: some requests met their budget");
    }
    assert_eq!(count("tiergate_offline_attempts_total", &["result=\"succeeded\""]), 3.0);
    assert_eq!(value(&scrape, "tiergate_offline_oldest_queued_seconds", &[]), 0.0);

    // Micro-batch: the 10 callers' rows (2 each) and any offline rows went out in batches.
    let rows = count("tiergate_batch_rows_sum", &[]);
    assert!((20.0..=26.0).contains(&rows), "rows batched: {rows}");
    let batches = count("tiergate_batch_rows_count", &[]);
    assert!(
        (3.0..10.0).contains(&batches),
        "10 callers with max_batch 8 rows go in a few batches: {batches}"
    );
    assert_eq!(count("tiergate_batch_queue_rows", &[]), 0.0);
    for learned in [
        "tiergate_batch_cost_fixed_seconds",
        "tiergate_batch_cost_per_row_seconds",
    ] {
        let series = format!("{learned}{{{r}}} ");
        let line = scrape.lines().find(|l| l.starts_with(&series));
        let cost: Option<f64> = line.and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert!(
            cost.is_some_and(|c| c >= 0.0),
            "{learned} is exported for the route: {line:?}"
        );
    }

    // Backends: the dead endpoint is ejected as unreachable; the live one is closed.
    let dead_label = format!("endpoint=\"{dead}\"");
    assert_eq!(count("tiergate_backend_circuit_state", &[&dead_label]), 1.0);
    assert!(
        count(
            "tiergate_backend_ejections_total",
            &[&dead_label, "reason=\"unreachable\""]
        ) >= 1.0
    );
    assert!(count("tiergate_backend_duration_seconds_count", &["tier=\"realtime\""]) >= 20.0);

    // The shadow compared the real-time calls (the candidate is the same model).
    assert_eq!(count("tiergate_shadow_compared_total", &["tier=\"realtime\""]), 20.0);
    assert_eq!(count("tiergate_shadow_rows_total", &["verdict=\"outside\""]), 0.0);
    assert_eq!(count("tiergate_shadow_latency_ratio_count", &[]), 20.0);

    // The cache kept one answer and gave it once.
    for (result, n) in [("hit", 1.0), ("miss", 1.0), ("bypass", 0.0)] {
        let labels = ["route=\"obscache\"", &format!("result=\"{result}\"")];
        assert_eq!(value(&scrape, "tiergate_cache_lookups_total", &labels), n, "{result}");
    }
    assert_eq!(value(&scrape, "tiergate_cache_entries", &["route=\"obscache\""]), 1.0);
    assert!(value(&scrape, "tiergate_cache_bytes", &["route=\"obscache\""]) > 0.0);
    // The miss looked in Redis first and found nothing; Redis in use, without an error.
    let redis_at = format!("redis=\"{}\"", redis.addr);
    assert_eq!(
        value(
            &scrape,
            "tiergate_cache_redis_lookups_total",
            &["route=\"obscache\"", "result=\"miss\""]
        ),
        1.0
    );
    assert_eq!(value(&scrape, "tiergate_cache_redis_up", &[&redis_at]), 1.0);
    assert_eq!(
        value(&scrape, "tiergate_cache_redis_errors_total", &[&redis_at, "op=\"get\""]),
        0.0
    );

    // The stream: five tokens, exactly as its backend counted them.
    let llm = ["route=\"obsllm\"", "tier=\"realtime\""];
    assert_eq!(
        value(
            &scrape,
            "tiergate_tokens_total",
            &[llm[0], llm[1], "kind=\"completion\""]
        ),
        5.0
    );
    assert_eq!(
        value(
            &scrape,
            "tiergate_streams_ended_total",
            &[llm[0], llm[1], "reason=\"done\""]
        ),
        1.0
    );
    assert_eq!(value(&scrape, "tiergate_streams_open", &llm), 0.0);

    // Policy and admission, at their start values.
    assert_eq!(value(&scrape, "tiergate_policy_routes", &[]), 3.0);
    assert_eq!(value(&scrape, "tiergate_policy_last_reload_ok", &[]), 1.0);
    assert_eq!(
        value(&scrape, "tiergate_admission_refusals_total", &["reason=\"requests\""]),
        0.0
    );
    assert!(value(&scrape, "tiergate_process_resident_bytes", &[]) > 1e6);

    // Every family has its help text, and the scrape passes promtool's lint.
    let typed: Vec<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    assert!(typed.len() >= 30, "{} families", typed.len());
    for family in &typed {
        let help = format!("# HELP {family} ");
        assert!(
            scrape.lines().any(|l| l.starts_with(&help) && l.len() > help.len() + 8),
            "{family} has no help text"
        );
    }
    let promtool =
        std::env::var("PROMTOOL").expect("PROMTOOL names promtool (scripts/test sets it from scripts/promtool.sh)");
    let mut check = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), scrape.as_bytes()).expect("scrape written");
    let checked = check.wait_with_output().expect("promtool ends");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // Every documented family is exported.
    let have = exported(&scrape);
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).expect("docs");
    let documented: BTreeSet<String> = docs
        .lines()
        // Kafka source metrics exist only while sources run (tests/it/kafka.rs checks them),
        // canary metrics while a canary runs (tests/it/shadow.rs checks them), refusals
        // by a limit once one refused (tests/it/refusals.rs and tests/it/token_limits.rs
        // check them), a batch pool's window where one is set (tests/it/llm_window.rs).
        .filter(|l| {
            l.starts_with("| `tiergate_")
                && !l.starts_with("| `tiergate_kafka_")
                && !l.starts_with("| `tiergate_canary_")
                && !l.starts_with("| `tiergate_refusals_")
                && !l.starts_with("| `tiergate_token_limited_")
                && !l.starts_with("| `tiergate_window_")
        })
        .flat_map(names)
        .collect();
    assert!(
        documented.len() >= 30,
        "the metrics table lists {} families",
        documented.len()
    );
    let missing: Vec<_> = documented.difference(&have).collect();
    assert!(missing.is_empty(), "documented but not exported: {missing:?}\n{scrape}");
    let undocumented: Vec<_> = have
        .iter()
        .filter(|n| n.starts_with("tiergate_") && !["_bucket", "_sum", "_count"].iter().any(|s| n.ends_with(s)))
        .filter(|n| !documented.contains(*n))
        .collect();
    assert!(undocumented.is_empty(), "exported but not documented: {undocumented:?}");

    // Every metric the dashboard and the alerts query is exported (or, for a canary's,
    // documented: they exist only while a canary runs).
    let canary: BTreeSet<String> = docs
        .lines()
        .filter(|l| l.starts_with("| `tiergate_canary_"))
        .flat_map(names)
        .collect();
    let known = |n: &String| {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| n.strip_suffix(s))
            .unwrap_or(n);
        have.contains(n) || canary.contains(base)
    };
    for file in [
        "deploy/grafana/dashboards/tiergate.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).expect("deploy file");
        if file.ends_with(".json") {
            serde_json::from_str::<serde_json::Value>(&text).expect("the dashboard is JSON");
        }
        let queried = names(&text);
        assert!(queried.len() >= 6, "{file} queries {queried:?}");
        let unknown: Vec<_> = queried.iter().filter(|n| !known(n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} queries metrics the gateway does not export: {unknown:?}"
        );
    }

    // `tiergate top` shows a row per route and tier from the same endpoint (the idle
    // ones too, with --all: the workload is over), given the address as it is written
    // on a command line, without a scheme and with the path.
    let top = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["top", "--once", "--all", "--interval", "200ms", "--metrics-url"])
        .arg(format!("{}/metrics", gw.metrics))
        .output()
        .await
        .expect("tiergate top runs");
    let frame = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{frame}{}", String::from_utf8_lossy(&top.stderr));
    for tier in ["realtime", "micro_batch", "offline"] {
        let row = frame
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["obs", tier]))
            .unwrap_or_else(|| panic!("no row for obs {tier} in\n{frame}"));
        assert_eq!(row.split_whitespace().count(), 9, "{row}");
    }
    gw.terminate();
    let (status, _) = gw.exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
}
