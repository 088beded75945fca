//! The console's data on the admin port: the history of the gateway's series, sampled
//! once a second from the recorder the metrics endpoint renders, behind the admin token.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const TOKEN: &str = "console-admin-token";

/// Each series' value as of the last sample of a `GET /admin/stats` answer.
fn values(answer: &Value) -> std::collections::HashMap<String, f64> {
    let names: Vec<&str> = answer["series"]
        .as_array()
        .expect("series")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut out = std::collections::HashMap::new();
    for sample in answer["samples"].as_array().expect("samples") {
        for pair in sample["values"].as_array().expect("values") {
            let i = pair[0].as_u64().expect("index") as usize;
            if let Some(v) = pair[1].as_f64() {
                out.insert(names[i].to_owned(), v);
            }
        }
    }
    out
}

/// The route's answered real-time requests in a series map (or a scrape's lines).
fn answered<'a>(series: impl Iterator<Item = (&'a str, f64)>) -> f64 {
    series
        .filter(|(name, _)| {
            name.starts_with("tiergate_requests_total{")
                && name.contains("route=\"console\"")
                && name.contains("tier=\"realtime\"")
        })
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test]
async fn the_history_follows_the_metrics_endpoint_second_by_second() {
    let backend = backend(&["m"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let policy = format!(
        "[routes.console]\nmodels = [\"m\"]\n[routes.console.realtime]\nendpoints = [\"{}\"]\n",
        backend.url()
    );
    std::fs::write(dir.path().join("r.toml"), policy).expect("policy");
    let (gw, _config) = admin_gateway(dir.path(), TOKEN).await;
    for _ in 0..5 {
        let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    // Sampled once a second: the five requests appear within a few samples.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let answer = loop {
        let got = admin_call(&gw, TOKEN, ("GET", "/admin/stats"), &[], "").await;
        assert_eq!(got.status, 200, "{}", got.text());
        let answer = got.json();
        if answered(values(&answer).iter().map(|(k, v)| (k.as_str(), *v))) >= 5.0 {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no sample shows the requests: {answer:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The same count the metrics endpoint shows, the replica named beside it.
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    let scraped = answered(scrape.lines().filter_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        Some((name, v.parse().ok()?))
    }));
    assert_eq!(answered(values(&answer).iter().map(|(k, v)| (k.as_str(), *v))), scraped);
    assert_eq!(answer["replica"]["address"], gw.http_addr().to_string());
    assert!(answer["replica"]["name"].as_str().is_some_and(|n| !n.is_empty()));
    assert_eq!(answer["every_ms"], 1000);
    // Since the last sample: only what came after, the first of them whole.
    let samples = answer["samples"].as_array().expect("samples");
    let last = samples.last().expect("a sample")["at_ms"].as_i64().expect("at");
    let later = admin_call(&gw, TOKEN, ("GET", &format!("/admin/stats?since={last}")), &[], "").await;
    assert!(later.json()["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .all(|s| s["at_ms"].as_i64() > Some(last)));
    // A since it cannot read says what to send; no token, nothing.
    let bad = admin_call(&gw, TOKEN, ("GET", "/admin/stats?since=yesterday"), &[], "").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("unix milliseconds"), "{}", bad.text());
    let refused = admin_call(&gw, "wrong-token", ("GET", "/admin/stats"), &[], "").await;
    assert_eq!(refused.status, 401);
}

/// A gateway with the admin API on, serving `policy` from a directory of its own.
async fn serving(policy: &str) -> (tiergate::app::Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("r.toml"), policy).expect("policy");
    let (gw, _config) = admin_gateway(dir.path(), TOKEN).await;
    (gw, dir)
}

/// `GET path` on the admin API, as JSON.
async fn read(gw: &tiergate::app::Gateway, path: &str) -> Value {
    let answer = admin_call(gw, TOKEN, ("GET", path), &[], "").await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.text());
    answer.json()
}

/// A KServe v2 body of `rows` rows, sent as tenant `tenant` on its own task.
fn send_as(gw: &tiergate::app::Gateway, tenant: &'static str, rows: u32) -> tokio::task::JoinHandle<Answer> {
    let data: Vec<f32> = (0..rows * 2).map(|i| i as f32).collect();
    let body =
        serde_json::json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 2], "data": data}]});
    let addr = gw.http_addr();
    tokio::spawn(async move {
        let headers = [("x-tiergate-budget-ms", "5000"), ("x-api-key", tenant)];
        infer(addr, "m", &headers, &body.to_string()).await
    })
}

#[tokio::test]
async fn the_batching_view_shows_rows_waiting_by_band_and_tenant_and_shares_against_weights() {
    let batch = backend(&["m"]).await;
    let policy = format!(
        "[defaults]\nrealtime_below = \"10ms\"\n[routes.fair]\nmodels = [\"m\"]\n\
         [routes.fair.flags]\nrealtime = false\nmicro_batch = true\n\
         [routes.fair.micro_batch]\nendpoints = [\"{}\"]\nmax_batch = 64\nmax_wait = \"3s\"\nmax_in_flight = 1\n\
         [routes.fair.micro_batch.tenant_weights]\na = 3\n",
        batch.url()
    );
    let (gw, _dir) = serving(&policy).await;
    // The only slot held by a first caller; tenants a (weight 3) and b wait behind it.
    batch.sim.hold();
    let first = send_as(&gw, "first", 1);
    wait_for(&batch, |s| s.requests == 1).await;
    let a = send_as(&gw, "a", 3);
    queued(&gw, "fair", 3).await;
    let b = send_as(&gw, "b", 1);
    queued(&gw, "fair", 4).await;
    let now = read(&gw, "/admin/batching").await;
    let route = &now["routes"][0];
    assert_eq!(
        (&route["route"], &route["queued_rows"]),
        (&Value::from("fair"), &Value::from(4))
    );
    assert_eq!(route["tenant_weights"], serde_json::json!({"a": 3}));
    let mut queue: Vec<(String, String, f64, u64)> = route["queue"]
        .as_array()
        .expect("queue")
        .iter()
        .map(|q| {
            let text = |k: &str| q[k].as_str().unwrap_or_default().to_owned();
            (
                text("band"),
                text("tenant"),
                q["weight"].as_f64().unwrap_or(0.0),
                q["rows"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    // b is not weighted and has been served nothing yet: the queue knows it by its hash.
    queue.sort_by_key(|q| q.1 != "a");
    assert_eq!(queue.len(), 2, "{now:#}");
    assert_eq!(queue[0], ("standard".to_owned(), "a".to_owned(), 3.0, 3), "{now:#}");
    assert_eq!(
        (queue[1].0.as_str(), queue[1].2, queue[1].3),
        ("standard", 1.0, 1),
        "{now:#}"
    );
    assert!(queue[1].1.starts_with('#'), "{now:#}");
    batch.sim.release();
    for task in [first, a, b] {
        assert_eq!(task.await.expect("task").status, 200);
    }
    // Served: 1 row of first, 3 of a, 1 of b; a's weight is 3 of the 5 of those three.
    let after = read(&gw, "/admin/batching").await;
    let route = &after["routes"][0];
    assert_eq!(route["queue"], serde_json::json!([]));
    let served = route["served_15m"].as_array().expect("served");
    let a = served.iter().find(|t| t["tenant"] == "a").expect("a served");
    assert_eq!(
        (&a["rows"], &a["weight"]),
        (&Value::from(3), &Value::from(3)),
        "{after:#}"
    );
    assert!((a["share"].as_f64().expect("share") - 0.6).abs() < 1e-9, "{after:#}");
    assert!(
        (a["weight_share"].as_f64().expect("share") - 0.6).abs() < 1e-9,
        "{after:#}"
    );
    assert_eq!(served.len(), 3, "{after:#}");
}

#[tokio::test]
async fn the_backends_view_shows_each_endpoint_its_circuit_load_latency_and_last_check() {
    let live = backend(&["m"]).await;
    let dead = format!("http://{}", dead_addr().await);
    let policy = Route::new("r")
        .model("m")
        .set("realtime.endpoints", vec![live.url(), dead.clone()])
        .set("realtime.health.eject_after", 1)
        .set("realtime.health.eject_for", "1m")
        .set("realtime.health.check_path", "/v2/health/ready")
        .set("realtime.health.check_interval", "100ms")
        .toml();
    let (gw, _dir) = serving(&policy).await;
    for _ in 0..4 {
        infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    }
    let endpoint = |view: &Value, at: &str| -> Value {
        let pool = &view["pools"].as_array().expect("pools")[0];
        assert_eq!(
            (&pool["route"], &pool["tier"]),
            (&Value::from("r"), &Value::from("realtime"))
        );
        assert_eq!(pool["checks"], "GET /v2/health/ready");
        pool["endpoints"]
            .as_array()
            .expect("endpoints")
            .iter()
            .find(|e| at.ends_with(e["endpoint"].as_str().unwrap_or("?")))
            .cloned()
            .unwrap_or_else(|| panic!("no {at} in {view:#}"))
    };
    // Both checked: the live endpoint passes and answers; the dead one is ejected.
    let view = eventually(Duration::from_secs(10), "both endpoints checked", || async {
        let view = read(&gw, "/admin/backends").await;
        let checked = |at: &str| !endpoint(&view, at)["last_check"].is_null();
        (checked(&live.url()) && checked(&dead)).then_some(view)
    })
    .await;
    let up = endpoint(&view, &live.url());
    assert_eq!(
        (&up["circuit"], &up["last_check"]["passed"]),
        (&Value::from("closed"), &Value::from(true)),
        "{view:#}"
    );
    assert!(up["latency_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{view:#}");
    let down = endpoint(&view, &dead);
    assert!(
        matches!(down["circuit"].as_str(), Some("open" | "half_open")),
        "{view:#}"
    );
    assert_eq!(down["last_check"]["passed"], false, "{view:#}");
    assert!(down["failures_in_a_row"].as_u64().is_some_and(|n| n >= 1), "{view:#}");
    // A call held by the live endpoint is in flight there.
    let before = live.sim.stats("m").expect("stats").requests;
    live.sim.hold();
    let addr = gw.http_addr();
    let held = tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "5000")], BODY).await });
    wait_for(&live, |s| s.requests > before).await;
    let view = read(&gw, "/admin/backends").await;
    assert_eq!(endpoint(&view, &live.url())["in_flight"], 1, "{view:#}");
    live.sim.release();
    assert_eq!(held.await.expect("task").status, 200);
}
