//! The usage ledger and the capacity signal end to end: a batch's measured time split
//! over its callers' tenants by rows (adding up to the batch), the per-request
//! equivalent at the learned `t(1)`, rows still unpriced while the pool learns, cache
//! hits and coalesced followers counted as saved and never as used, the ledger read
//! back after a restart, the capacity signal following a step in the arrival rate to
//! rate × cost ÷ target on a simulator of known cost, and offline work counted one
//! request a job when it ends (Batch API lines too).

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::sim::{ModelSpec, Profile};
use tokio::task::JoinHandle;

const TOKEN: &str = "usage-admin-token";

/// A gateway with the admin API on serving `policy` (one file in a directory of its own).
async fn started(policy: &str) -> (Gateway, tiergate::config::Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("usage.toml"), policy).expect("policy");
    let (gw, config) = admin_gateway(dir.path(), TOKEN).await;
    (gw, config, dir)
}

/// `GET /admin/usage?QUERY`, as JSON.
async fn usage(gw: &Gateway, query: &str) -> Value {
    let answer = admin_call(gw, TOKEN, ("GET", &format!("/admin/usage?{query}")), &[], "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

/// The row of `report` whose `key` is `value`.
fn line<'a>(report: &'a Value, key: &str, value: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|l| l[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {report:#}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A micro-batch route `name` on `batch` (one batch slot, a 3 s window so the callers
/// queued behind a held slot share one batch).
fn batched(name: &str, batch: &str, extra: &str) -> String {
    format!(
        r#"
[defaults]
realtime_below = "10ms"
[routes.{name}]
models = ["m"]
[routes.{name}.flags]
realtime = false
micro_batch = true
[routes.{name}.micro_batch]
endpoints = ["{batch}"]
max_batch = 64
max_wait = "3s"
max_in_flight = 1
queue_capacity = 1000
{extra}
"#
    )
}

/// A KServe v2 body of `rows` rows.
fn rows(id: &str, rows: u32) -> String {
    let data: Vec<f32> = (0..rows * 2).map(|i| i as f32).collect();
    json!({"id": id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 2], "data": data}]}).to_string()
}

fn spawn_as(gw: &Gateway, tenant: &'static str, body: String) -> JoinHandle<Answer> {
    let addr = gw.http_addr();
    tokio::spawn(async move {
        infer(
            addr,
            "m",
            &[("x-tiergate-budget-ms", "5000"), ("x-api-key", tenant)],
            &body,
        )
        .await
    })
}

#[tokio::test]
async fn a_batch_of_two_tenants_charges_each_its_rows_share_of_the_measured_time() {
    let profile = Profile {
        a: Duration::from_millis(20),
        b: Duration::from_millis(1),
        ..Profile::default()
    };
    let batch = backend_with(vec![ModelSpec::new("m", profile)]).await;
    let (gw, _config, _dir) = started(&batched("split", &batch.url(), "")).await;
    // The only slot held by a first caller, two tenants queue behind it: one batch.
    batch.sim.hold();
    let busy = spawn_as(&gw, "first", rows("busy", 1));
    wait_for(&batch, |s| s.requests == 1).await;
    let a = spawn_as(&gw, "a", rows("a", 3));
    queued(&gw, "split", 3).await;
    let b = spawn_as(&gw, "b", rows("b", 1));
    queued(&gw, "split", 4).await;
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let (a, b) = (a.await.expect("task"), b.await.expect("task"));
    assert_eq!((a.status, b.status), (200, 200), "{} {}", a.text(), b.text());
    assert_eq!(
        a.header("x-tiergate-batch-id"),
        b.header("x-tiergate-batch-id"),
        "one batch"
    );
    // Server-Timing's backend part is the batch's measured time, to the microsecond.
    let batch_ms = part(&a.timing(), "backend");
    assert_eq!(batch_ms, part(&b.timing(), "backend"));
    let report = usage(&gw, "by=tenant").await;
    let (used_a, used_b) = (
        f(&line(&report, "tenant", "a")["used_seconds"]),
        f(&line(&report, "tenant", "b")["used_seconds"]),
    );
    assert!(
        (used_a + used_b - batch_ms / 1e3).abs() < 2e-6,
        "the shares add up to the batch: {used_a} + {used_b} vs {batch_ms} ms"
    );
    assert!(
        (used_a - 3.0 * used_b).abs() < 1e-8,
        "by rows: {used_a} vs 3 × {used_b}"
    );
    assert_eq!(line(&report, "tenant", "a")["rows"], 3);
    assert!((f(&line(&report, "tenant", "a")["backend_calls"]) - 0.75).abs() < 1e-6);
    // Two batches are no learned cost: the rows are unpriced, nothing is claimed saved.
    assert_eq!(line(&report, "tenant", "a")["unpriced_rows"], 3);
    assert!(f(&line(&report, "tenant", "a")["saved_batching_seconds"]).abs() < 1e-9);
    // The CSV form has the same table.
    let csv = admin_call(&gw, TOKEN, ("GET", "/admin/usage?by=tenant&format=csv"), &[], "").await;
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    assert!(
        csv.text().lines().any(|l| l.starts_with("a,") || l.starts_with(",,a,")),
        "{}",
        csv.text()
    );
    // A query that names nothing the ledger groups by is refused, saying what is.
    let bad = admin_call(&gw, TOKEN, ("GET", "/admin/usage?by=model"), &[], "").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("route, tier or tenant"), "{}", bad.text());
}

#[tokio::test]
async fn the_per_request_equivalent_is_the_learned_cost_of_one_row() {
    let profile = Profile {
        a: Duration::from_millis(4),
        b: Duration::from_micros(500),
        ..Profile::default()
    };
    let batch = backend_with(vec![ModelSpec::new("m", profile)]).await;
    let policy = batched("alone", &batch.url(), "").replace("max_wait = \"3s\"", "max_wait = \"1ms\"");
    let (gw, _config, _dir) = started(&policy).await;
    // Batches of several sizes, one at a time: the pool learns its line.
    for (i, n) in [1, 2, 4, 8, 3, 6, 1, 5, 2, 7].into_iter().enumerate() {
        let answer = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "5000")],
            &rows(&format!("w{i}"), n),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let api = gw.admin_api().expect("admin").clone();
    let learned = api
        .micro_batch
        .pool_state("alone")
        .and_then(|s| s.cost)
        .expect("a learned cost");
    // The ledger's t(1), from the batches' service times (one at a time: their
    // measured times), agrees with the scheduler's line through the same batches.
    let one_row = || {
        api.micro_batch
            .pool_state("alone")
            .and_then(|s| s.one_row)
            .expect("the ledger's t(1)")
            .as_secs_f64()
    };
    let one = one_row();
    let scheduler = learned.predict(1).as_secs_f64();
    assert!((one - scheduler).abs() < 0.05 * scheduler, "{one} s vs {scheduler} s");
    // Explain shows the same t(1).
    let explained = admin_call(&gw, TOKEN, ("POST", "/admin/explain"), &[], r#"{"model": "m"}"#).await;
    assert_eq!(explained.status, 200, "{}", explained.text());
    let shown = f(&explained.json()["micro_batch"]["one_row_ms"]);
    assert!((shown - one * 1e3).abs() < 1e-6, "{shown} ms vs {one} s");
    let before = usage(&gw, "by=route").await;
    let answer = infer(
        gw.http_addr(),
        "m",
        &[("x-tiergate-budget-ms", "5000")],
        &rows("last", 4),
    )
    .await;
    assert_eq!(answer.status, 200);
    let after = usage(&gw, "by=route").await;
    let now = one_row();
    let alone = |r: &Value| f(&line(r, "route", "alone")["would_have_seconds"]);
    let added = alone(&after) - alone(&before);
    // The 4 rows at t(1) as learned before their batch; the rows the pool sent before
    // it could tell t(1) (at most the 39 of the first batches) are priced at its t(1)
    // when the table is read, which the last batch may have moved.
    let moved = 39.0 * (now - one).abs();
    assert!(
        (added - 4.0 * one).abs() <= moved + 1e-8,
        "4 rows at t(1) = {one} s: {added} s"
    );
    for table in [&before, &after] {
        assert_eq!(
            line(table, "route", "alone")["unpriced_rows"],
            0,
            "priced now: {table:#}"
        );
    }
    // Batches of 4 rows at a + b·4 cost less than 4 × (a + b): batching saved.
    assert!(
        f(&line(&after, "route", "alone")["saved_batching_seconds"]) > 0.0,
        "{after:#}"
    );
}

/// A real-time route `name` with its cache on, on `backend`.
fn cached(name: &str, backend: &str) -> String {
    format!(
        "[routes.{name}]\nmodels = [\"m\"]\n[routes.{name}.flags]\ncache = true\n\
         [routes.{name}.realtime]\nendpoints = [\"{backend}\"]\nmax_concurrency = 16\n[routes.{name}.cache]\n"
    )
}

fn question(i: u32) -> String {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i + 1]}]}).to_string()
}

#[tokio::test]
async fn cache_hits_and_coalesced_followers_are_saved_not_used() {
    let profile = Profile {
        a: Duration::from_millis(30),
        ..Profile::default()
    };
    let sim = backend_with(vec![ModelSpec {
        instances: 4,
        ..ModelSpec::new("m", profile)
    }])
    .await;
    let (gw, _config, _dir) = started(&cached("saved", &sim.url())).await;
    let budget = [("x-tiergate-budget-ms", "250")];
    let miss = infer(gw.http_addr(), "m", &budget, &question(1)).await;
    assert_eq!(miss.header("x-tiergate-cache"), Some("miss"));
    let first = usage(&gw, "by=tier").await;
    let call = f(&line(&first, "tier", "realtime")["used_seconds"]);
    assert!(call >= 0.030, "the miss used its call: {call}");
    let hit = infer(gw.http_addr(), "m", &budget, &question(1)).await;
    assert_eq!(hit.header("x-tiergate-cache"), Some("hit"));
    // Two identical questions at once: one call, the other follows it.
    let twice = question(2);
    let (one, two) = tokio::join!(
        infer(gw.http_addr(), "m", &budget, &twice),
        infer(gw.http_addr(), "m", &budget, &twice)
    );
    let mut how = [one.header("x-tiergate-cache"), two.header("x-tiergate-cache")];
    how.sort();
    assert_eq!(how, [Some("coalesced"), Some("miss")]);
    let report = usage(&gw, "by=tier").await;
    let cache = line(&report, "tier", "cache");
    assert_eq!(cache["requests"], 2);
    assert_eq!(f(&cache["used_seconds"]), 0.0, "a hit and a follower use nothing");
    assert_eq!(f(&cache["backend_calls"]), 0.0);
    // What they saved: the route's recent cost of a request each.
    let (saved_cache, saved_dedupe) = (f(&cache["saved_cache_seconds"]), f(&cache["saved_dedupe_seconds"]));
    assert!(
        (saved_cache - call).abs() < 1e-6,
        "a hit saved the cost of the call it avoided: {saved_cache} vs {call}"
    );
    assert!(saved_dedupe >= 0.030, "{saved_dedupe}");
    let realtime = line(&report, "tier", "realtime");
    assert_eq!(realtime["requests"], 2, "the miss and the leader");
    assert_eq!(f(&realtime["backend_calls"]), 2.0);
    assert_eq!(sim.sim.stats("m").expect("stats").requests, 2);
    assert!(
        (f(&report["total"]["requests_per_call"]) - 2.0).abs() < 1e-9,
        "4 answered on 2 calls"
    );
    // The Prometheus totals by route and tier.
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape.contains("tiergate_usage_saved_seconds{route=\"saved\",tier=\"cache\",cause=\"cache\"}"),
        "{scrape}"
    );
}

#[tokio::test]
async fn the_ledger_survives_a_restart() {
    let sim = backend(&["m"]).await;
    let policy = format!(
        "[routes.kept]\nmodels = [\"m\"]\n[routes.kept.realtime]\nendpoints = [\"{}\"]\n",
        sim.url()
    );
    let (gw, config, dir) = started(&policy).await;
    for i in 0..7 {
        assert_eq!(
            infer(gw.http_addr(), "m", &[("x-api-key", "t")], &question(i))
                .await
                .status,
            200
        );
    }
    let before = usage(&gw, "by=route,tenant").await;
    assert_eq!(before["total"]["requests"], 7);
    gw.stop().await.expect("stops");
    let gw = Gateway::start(&config, tiergate::policy::Policy::load_dir(dir.path()).expect("valid"))
        .await
        .expect("starts again");
    let after = usage(&gw, "by=route,tenant").await;
    assert_eq!(after["rows"], before["rows"], "the same table after the restart");
    assert_eq!(after["total"]["requests"], 7);
}

#[tokio::test]
async fn the_capacity_signal_follows_a_step_to_rate_times_cost_over_target() {
    // 20 ms a call, never queued (more instances than calls at once).
    let profile = Profile {
        a: Duration::from_millis(20),
        ..Profile::default()
    };
    let sim = backend_with(vec![ModelSpec {
        instances: 16,
        ..ModelSpec::new("m", profile)
    }])
    .await;
    let policy = format!(
        "[routes.cap]\nmodels = [\"m\"]\n[routes.cap.realtime]\nendpoints = [\"{}\"]\nmax_concurrency = 64\n\
         [routes.cap.realtime.capacity]\ntarget_utilisation = 0.5\nwindow = \"5s\"\ncalls_per_endpoint = 4\n",
        sim.url()
    );
    let (gw, _config, _dir) = started(&policy).await;
    let need = |gw: &Gateway| {
        let api = gw.admin_api().expect("admin").clone();
        async move {
            let answer = admin_call_on(&api, "/admin/capacity").await;
            answer["pools"]
                .as_array()
                .expect("pools")
                .iter()
                .find(|p| p["route"] == "cap" && p["tier"] == "realtime")
                .map(|p| p["signal"].clone())
        }
    };
    // 25 requests a second for a window: 25 × 0.020 ÷ (0.5 × 4 calls an endpoint) = a
    // quarter of an endpoint, and what the gateway adds to the simulator's 20 ms (more
    // on a machine busy with other work).
    paced(&gw, 25, Duration::from_secs(9)).await;
    let low = need(&gw).await.expect("a signal");
    let (rate, cost, needed) = (
        f(&low["arrivals_per_second"]),
        f(&low["cost_seconds"]),
        f(&low["needed"]),
    );
    assert!((rate - 25.0).abs() <= 2.5, "{low}");
    assert!(
        (0.020..0.030).contains(&cost),
        "the simulator's cost and a little: {low}"
    );
    assert!((needed - rate * cost / 2.0).abs() < 1e-9, "rate × cost ÷ target: {low}");
    assert!((0.2..0.4).contains(&needed), "{low}");
    assert_eq!(low["healthy"], 1);
    // The rate steps up 4×: within the window the signal has risen, by its end to 4× as many.
    paced(&gw, 100, Duration::from_secs(2)).await;
    let rising = f(&need(&gw).await.expect("a signal")["needed"]);
    assert!(
        rising > 1.2 * needed,
        "rising within the window: {rising} from {needed}"
    );
    paced(&gw, 100, Duration::from_secs(6)).await;
    let high = need(&gw).await.expect("a signal");
    let stepped = f(&high["arrivals_per_second"]) * f(&high["cost_seconds"]) / 2.0;
    assert!((f(&high["arrivals_per_second"]) - 100.0).abs() <= 10.0, "{high}");
    assert!((f(&high["needed"]) - stepped).abs() < 1e-9, "{high}");
    assert!((0.85..1.6).contains(&f(&high["needed"])), "{high}");
    let gauge = metric(&gw, "tiergate_endpoints_needed{route=\"cap\",tier=\"realtime\"}").await;
    assert!((gauge - f(&high["needed"])).abs() < 0.5, "exported: {gauge}");
    assert_eq!(
        metric(&gw, "tiergate_endpoints_healthy{route=\"cap\",tier=\"realtime\"}").await,
        1.0
    );
}

/// `GET path` on the admin API `api`, as JSON.
async fn admin_call_on(api: &std::sync::Arc<tiergate::admin::Admin>, path: &str) -> Value {
    let api = api.clone();
    let auth = format!("Bearer {TOKEN}");
    let answer = oneshot(
        |r| async move { api.answer(r).await },
        "GET",
        path,
        &[("authorization", auth.as_str())],
        String::new(),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

/// Sends `rate` requests a second to model `m` for `how_long`, each at its own time
/// (open loop), and waits for every answer.
async fn paced(gw: &Gateway, rate: u32, how_long: Duration) {
    let mut every = tokio::time::interval(Duration::from_secs(1) / rate);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let n = (how_long.as_secs_f64() * f64::from(rate)) as u32;
    let mut calls = Vec::new();
    for i in 0..n {
        every.tick().await;
        let addr = gw.http_addr();
        calls.push(tokio::spawn(async move {
            infer(addr, "m", &[("x-tiergate-budget-ms", "250")], &question(i)).await
        }));
    }
    for call in calls {
        assert_eq!(call.await.expect("task").status, 200);
    }
}

/// Submits a Batch API batch of `n` lines for model `m` (see [`batch_lines`]); its
/// path, `/v1/batches/{id}`.
async fn batch_of(gw: &Gateway, n: usize) -> String {
    let file = upload_file(gw.http_addr(), &batch_lines("m", n), &[]).await.json();
    let id = create_batch(gw.http_addr(), &file["id"], "m", &[]).await;
    format!("/v1/batches/{id}")
}

#[tokio::test]
async fn a_tenant_past_its_daily_quota_gets_429_until_the_reset_and_its_offline_work_waits() {
    let sim = backend(&["m"]).await;
    let policy = |daily: u32| {
        format!(
            "[routes.quota]\nmodels = [\"m\"]\n[routes.quota.flags]\nrealtime = true\noffline = true\n\
             [routes.quota.realtime]\nendpoints = [\"{0}\"]\n[routes.quota.micro_batch]\nendpoints = [\"{0}\"]\n\
             [routes.quota.quotas.default]\ndaily_requests = {daily}\n",
            sim.url()
        )
    };
    let (gw, _config, _dir) = started(&policy(2)).await;
    let ask = |tenant: &'static str, i: u32| {
        let addr = gw.http_addr();
        async move { infer(addr, "m", &[("x-api-key", tenant)], &question(i)).await }
    };
    // Without data-plane keys a tenant is its header's value; none is the anonymous one.
    for i in 0..2 {
        assert_eq!(ask("", i).await.status, 200);
    }
    // The ledger counts up to its last tick; reading it drains what is pending.
    usage(&gw, "by=tenant").await;
    let refused = ask("", 3).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    let text = refused.text();
    assert!(
        text.contains("daily_requests 2 reached for the anonymous tenant on route quota"),
        "{text}"
    );
    let now = tiergate::usage::unix(std::time::SystemTime::now());
    let midnight = tiergate::usage::quota::day_start(now) + 86_400;
    let reset =
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(midnight as u64)).to_string();
    assert!(text.contains(&reset), "names the reset time {reset}: {text}");
    let after: i64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!(
        (after - (midnight - now)).abs() <= 2,
        "Retry-After {after} s, the reset in {} s",
        midnight - now
    );
    // Another tenant's own quota is untouched.
    assert_eq!(ask("b", 4).await.status, 200);
    let refusals = metric(
        &gw,
        "tiergate_refusals_total{route=\"quota\",tier=\"realtime\",knob=\"quotas.daily_requests\"}",
    )
    .await;
    assert_eq!(refusals, 1.0);
    // Offline work is accepted and waits, saying why; the batch object says so too.
    let job = infer(gw.http_addr(), "m", &[("prefer", "respond-async")], &question(5)).await;
    assert_eq!(job.status, 202, "{}", job.text());
    let location = job.header("location").expect("Location").to_owned();
    let batch_path = batch_of(&gw, 1).await;
    let waiting = eventually(Duration::from_secs(10), "the batch waits for the quota", || async {
        let b = get(gw.http_addr(), &batch_path).await.json();
        (b["quota_wait"]["requests"] == 1).then_some(b)
    })
    .await;
    assert_eq!(waiting["status"], "in_progress");
    assert!(
        waiting["quota_wait"]["reason"]
            .as_str()
            .expect("reason")
            .contains("daily_requests 2 reached"),
        "{waiting}"
    );
    let status = get(gw.http_addr(), &location).await.json();
    assert_eq!(status["status"], "queued", "{status}");
    assert!(
        status.to_string().contains("waiting: daily_requests 2 reached"),
        "{status}"
    );
    assert_eq!(
        sim.sim.stats("m").expect("stats").requests,
        3,
        "nothing past the quota reached the backend"
    );
    // The quota raised through the policy: the waiting work runs (looked at again within 15 s).
    let put = admin_call(&gw, TOKEN, ("PUT", "/admin/policy/files/usage.toml"), &[], &policy(100)).await;
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(ask("", 8).await.status, 200);
    eventually(Duration::from_secs(30), "the waiting work runs", || async {
        // A finished job's location answers with the job's own answer.
        let answered = get(gw.http_addr(), &location).await.json()["outputs"].is_array();
        let b = get(gw.http_addr(), &batch_path).await.json();
        (answered && b["status"] == "completed").then_some(())
    })
    .await;
}

#[tokio::test]
async fn offline_work_counts_one_request_a_job_when_it_ends_and_its_202_times_the_queues_write() {
    let sim = backend(&["m"]).await;
    let policy = format!(
        "[routes.later]\nmodels = [\"m\"]\n[routes.later.flags]\nrealtime = true\noffline = true\n\
         [routes.later.realtime]\nendpoints = [\"{0}\"]\n[routes.later.micro_batch]\nendpoints = [\"{0}\"]\n",
        sim.url()
    );
    let (gw, _config, _dir) = started(&policy).await;
    // A call sent respond-async: its 202 says the queue's durable write, no backend.
    let job = infer(gw.http_addr(), "m", &[("prefer", "respond-async")], &question(1)).await;
    assert_eq!(job.status, 202, "{}", job.text());
    let timing = job.header("server-timing").expect("Server-Timing").to_owned();
    assert!(
        timing.starts_with("queue;dur=") && !timing.contains("backend") && timing.contains("total;dur="),
        "{timing}"
    );
    // Three Batch API lines.
    let batch_path = batch_of(&gw, 3).await;
    let location = job.header("location").expect("Location").to_owned();
    eventually(Duration::from_secs(30), "the job and the batch end", || async {
        let answered = get(gw.http_addr(), &location).await.json()["outputs"].is_array();
        let b = get(gw.http_addr(), &batch_path).await.json();
        (answered && b["status"] == "completed").then_some(())
    })
    .await;
    // Each job counts once, on the offline tier, when it ends (the call sent
    // respond-async not again at its acceptance; the batch's lines too).
    let report = usage(&gw, "by=tier").await;
    assert_eq!(line(&report, "tier", "offline")["requests"], 4, "{report:#}");
    assert_eq!(report["rows"].as_array().map(Vec::len), Some(1), "{report:#}");
    let exported = metric(&gw, "tiergate_usage_requests_total{route=\"later\",tier=\"offline\"}").await;
    assert_eq!(exported, 4.0);
}

#[tokio::test]
async fn tokens_are_priced_by_tier_and_saved_against_the_real_time_price() {
    let profile = tiergate::sim::LlmProfile::named("llm-tiny").expect("profile");
    let sim = backend_with(vec![ModelSpec::llm("m", profile)]).await;
    let policy = format!(
        "[usage.prices]\ncurrency = \"USD\"\nrealtime = {{ prompt = 2.0, completion = 10.0 }}\n\
         offline = {{ prompt = 1.0, completion = 5.0 }}\n\
         [routes.chat]\nmodels = [\"m\"]\npaths = [\"/v1/chat/completions\"]\ndefault_budget = \"5s\"\n\
         realtime_below = \"10s\"\n[routes.chat.flags]\nrealtime = true\noffline = true\n\
         [routes.chat.realtime]\nendpoints = [\"{0}\"]\n[routes.chat.micro_batch]\nendpoints = [\"{0}\"]\n",
        sim.url()
    );
    let (gw, _config, _dir) = started(&policy).await;
    let body = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "one two three"}]});
    let headers = [("content-type", "application/json")];
    let now = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &headers,
        body.to_string(),
    )
    .await;
    assert_eq!(now.status, 200, "{}", now.text());
    let later = [("content-type", "application/json"), ("prefer", "respond-async")];
    let job = send("POST", gw.http_addr(), "/v1/chat/completions", &later, body.to_string()).await;
    assert_eq!(job.status, 202, "{}", job.text());
    // 3 prompt and 10 completion tokens each: 106 millionths at the real-time price,
    // 53 at the offline one.
    let report = eventually(Duration::from_secs(30), "both calls' tokens counted", || async {
        let report = usage(&gw, "by=tier").await;
        let counted = report["rows"]
            .as_array()
            .is_some_and(|rows| rows.iter().filter(|r| r["completion_tokens"] == 10).count() == 2);
        counted.then_some(report)
    })
    .await;
    let cost = |tier: &str| line(&report, "tier", tier)["token_cost"].clone();
    let (realtime, offline) = (cost("realtime"), cost("offline"));
    assert_eq!(realtime["currency"], "USD", "{report:#}");
    assert!((f(&realtime["used"]) - 106e-6).abs() < 1e-12, "{realtime}");
    assert!(f(&realtime["saved"]).abs() < 1e-12, "{realtime}");
    assert!((f(&offline["used"]) - 53e-6).abs() < 1e-12, "{offline}");
    assert!((f(&offline["saved"]) - 53e-6).abs() < 1e-12, "{offline}");
    assert!(
        (f(&report["total"]["token_cost"]["saved"]) - 53e-6).abs() < 1e-12,
        "{report:#}"
    );
}
