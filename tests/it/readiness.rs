//! Readiness tells the truth: `/v2/health/ready` (and gRPC `ServerReady`) answers 503,
//! with the reason, while every endpoint of a route's pool is ejected, and 200 again once
//! a check passes; `tiergate_ready` and `tiergate_not_ready{reason}` say the same. (The
//! drain's 503 is in shutdown.rs; a store that cannot commit, in `front::ready`'s tests.)
//! The readiness gauges are the process's, so the gateway whose gauges are read is a
//! `tiergate serve` child of its own.

use crate::common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn readiness_is_503_while_every_endpoint_of_a_pool_is_ejected_and_says_which() {
    let mut sim = sim_process(0, None);
    let port = sim.http.port();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("policies")).expect("dir");
    let toml = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:{port}\"]\n\
         [routes.r.realtime.health]\neject_after = 1\neject_for = \"300ms\"\ncheck_interval = \"100ms\"\n"
    );
    std::fs::write(dir.path().join("policies/ready.toml"), toml).expect("policy");
    let gw = common::served::serve(dir.path(), &[]);
    assert_eq!(
        infer(gw.http, "m", &[("x-tiergate-budget-ms", "250")], BODY)
            .await
            .status,
        200
    );
    assert_eq!(get(gw.http, "/v2/health/ready").await.status, 200);

    sim.kill();
    // No traffic: the pool's checks eject it, and readiness says so.
    let ready = poll_ready(gw.http, 503).await;
    assert_eq!(
        ready.json()["reasons"],
        serde_json::json!(["pool_ejected"]),
        "{}",
        ready.text()
    );
    assert!(ready.text().contains("route r's realtime pool"), "{}", ready.text());
    let scrape = get(gw.metrics, "/metrics").await.text();
    assert!(scrape.contains("tiergate_ready 0"), "{scrape}");
    assert!(
        scrape.contains("tiergate_not_ready{reason=\"pool_ejected\"} 1"),
        "{scrape}"
    );
    assert!(scrape.contains("tiergate_not_ready{reason=\"draining\"} 0"), "{scrape}");

    // Back on the same port: a passing check ends the ejection, and readiness follows.
    let _back = sim_process(port, None);
    poll_ready(gw.http, 200).await;
    assert!(get(gw.metrics, "/metrics").await.text().contains("tiergate_ready 1"));
}

/// Polls `/v2/health/ready` until it answers `status` (10 s at most), as a load balancer does.
async fn poll_ready(addr: std::net::SocketAddr, status: u16) -> Answer {
    let what = format!("readiness answers {status}");
    eventually(Duration::from_secs(10), &what, || async {
        Some(get(addr, "/v2/health/ready").await).filter(|a| a.status == status)
    })
    .await
}

/// Model metadata and readiness go to the route's control pool, which has its own
/// connections and circuits and writes nothing on the tiers' series: asking for a
/// model's readiness while the real-time endpoint is ejected (it stalls on inference,
/// and still answers metadata) leaves that endpoint shown as ejected and adds no
/// real-time backend latency.
#[tokio::test]
async fn metadata_calls_never_show_on_the_real_time_pool_series() {
    let backend = backend(&["m"]).await;
    backend.sim.hold(); // inference stalls; metadata is still answered
    let toml = format!(
        "[routes.meta]\nmodels = [\"m\"]\n[routes.meta.realtime]\nendpoints = [\"{}\"]\n\
         [routes.meta.realtime.health]\neject_after = 1\neject_for = \"1m\"\nslow_call = \"50ms\"\ncheck_path = \"\"\n",
        backend.url()
    );
    let gw = gateway(&toml).await;
    let budget = [("x-tiergate-budget-ms", "250")];
    assert_eq!(infer(gw.http_addr(), "m", &budget, BODY).await.status, 504, "stalled");
    let ejected = format!(
        "tiergate_backend_circuit_state{{route=\"meta\",tier=\"realtime\",endpoint=\"{}\"}} 1",
        backend.addr
    );
    let latency = "tiergate_backend_duration_seconds_count{route=\"meta\",tier=\"realtime\"} ";
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(scrape.contains(&ejected), "{ejected} in\n{scrape}");
    let calls_before = count_after(&scrape, latency);

    for _ in 0..3 {
        let ready = get(gw.http_addr(), "/v2/models/m/ready").await;
        assert_eq!(ready.status, 200, "metadata is answered: {}", ready.text());
    }
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape.contains(&ejected),
        "still shown ejected after metadata calls:\n{scrape}"
    );
    assert_eq!(
        count_after(&scrape, latency),
        calls_before,
        "metadata calls are not real-time calls"
    );
    assert_eq!(
        infer(gw.http_addr(), "m", &budget, BODY).await.status,
        503,
        "and it is still ejected"
    );
    backend.sim.release();
}

/// The number that follows `prefix` on its line of `scrape`.
fn count_after(scrape: &str, prefix: &str) -> u64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{scrape}"))
}
