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
