//! The Prometheus endpoint counts requests by route, tier and outcome.

use crate::common;

use common::*;

#[tokio::test]
async fn requests_are_counted_by_route_tier_and_outcome() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    for _ in 0..3 {
        assert_eq!(infer(gw.http_addr(), "m", &[], BODY).await.status, 200);
    }
    assert_eq!(infer(gw.http_addr(), "m", &[], "{bad").await.status, 400);
    let scrape = get(gw.metrics_addr(), "/metrics").await;
    assert_eq!(scrape.status, 200);
    let text = scrape.text();
    let line = |needles: &[&str]| {
        text.lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no line with {needles:?} in\n{text}"))
            .to_owned()
    };
    // The recorder is process-wide, so other tests in this binary may add to these.
    let ok = line(&[
        "tiergate_requests_total{",
        "route=\"r\"",
        "tier=\"realtime\"",
        "outcome=\"ok\"",
    ]);
    let count: f64 = ok.rsplit(' ').next().expect("value").parse().expect("number");
    assert!(count >= 3.0, "{ok}");
    line(&[
        "tiergate_requests_total{",
        "route=\"r\"",
        "tier=\"none\"",
        "outcome=\"bad_request\"",
    ]);
    line(&["tiergate_decisions_total{", "route=\"r\"", "reason=\"budget_realtime\""]);
    line(&[
        "tiergate_request_duration_seconds_bucket{",
        "route=\"r\"",
        "tier=\"realtime\"",
    ]);
    line(&["tiergate_backend_duration_seconds_count{", "route=\"r\""]);
    gw.stop().await.expect("stops");
}
