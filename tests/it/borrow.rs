//! Borrowing rules (off by default): real-time overflow served by the micro-batch tier
//! when the real-time pool is full, visible in the reason header and in metrics.

use crate::common;

use common::*;

fn policy(rt: &str, batch: &str, borrow: bool) -> String {
    Route::new("borrow")
        .model("m")
        .flags(&["realtime", "micro_batch"])
        .realtime(rt)
        .set("realtime.max_concurrency", 1)
        .batch(batch)
        .set("borrow.realtime_overflow", borrow)
        .toml()
}

#[tokio::test]
async fn real_time_overflow_goes_to_the_micro_batch_tier_only_when_the_route_allows() {
    for borrow in [false, true] {
        let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
        rt.sim.hold(); // the one real-time slot stays busy
        let gw = gateway(&policy(&rt.url(), &batch.url(), borrow)).await;
        let addr = gw.http_addr();
        let first = tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await });
        wait_for(&rt, |s| s.requests == 1).await;
        let second = infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        if borrow {
            assert_eq!(second.status, 200, "{}", second.text());
            assert_eq!(second.tier(), (Some("micro_batch"), Some("realtime_overflow")));
            assert_eq!(batch.sim.stats("m").expect("stats").requests, 1);
            let scrape = get(gw.metrics_addr(), "/metrics").await.text();
            assert!(
                scrape.contains("tiergate_borrowed_total{route=\"borrow\",from=\"micro_batch\",to=\"realtime\"} 1"),
                "{scrape}"
            );
        } else {
            assert_eq!(second.status, 503, "off by default: shed as before");
            assert_eq!(batch.sim.stats("m").expect("stats").requests, 0);
        }
        rt.sim.release();
        assert_eq!(first.await.expect("task").status, 200);
    }
}

fn offline_policy(rt: &str, batch: &str) -> String {
    Route::new("borrow")
        .model("m")
        .flags(&["realtime", "offline"])
        .realtime(rt)
        .batch(batch)
        .set("borrow.offline_on_realtime", true)
        .toml()
}

/// Submits a job with `Prefer: respond-async` and polls it (as a client would) until done.
async fn run_job(addr: std::net::SocketAddr) -> Answer {
    let accepted = infer(addr, "m", &[("prefer", "respond-async")], BODY).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let location = accepted.header("location").expect("Location").to_owned();
    eventually(std::time::Duration::from_secs(10), "the job finishes", || async {
        Some(get(addr, &location).await).filter(|answer| answer.status != 202)
    })
    .await
}

#[tokio::test]
async fn offline_work_uses_an_idle_real_time_pool_and_leaves_a_busy_one_alone() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&offline_policy(&rt.url(), &batch.url())).await;
    let addr = gw.http_addr();
    for _ in 0..3 {
        assert_eq!(run_job(addr).await.status, 200);
    }
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        3,
        "the idle real-time pool served them"
    );
    assert_eq!(batch.sim.stats("m").expect("stats").requests, 0);
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape.contains("tiergate_borrowed_total{route=\"borrow\",from=\"realtime\",to=\"offline\"} 3"),
        "{scrape}"
    );

    // A real-time caller is in flight: offline work goes to the batch pool.
    rt.sim.hold();
    let busy = tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await });
    wait_for(&rt, |s| s.requests == 4).await;
    assert_eq!(run_job(addr).await.status, 200);
    assert_eq!(
        batch.sim.stats("m").expect("stats").requests,
        1,
        "the batch pool served it"
    );
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        4,
        "the busy real-time pool was left alone"
    );
    rt.sim.release();
    busy.await.expect("task");
}
