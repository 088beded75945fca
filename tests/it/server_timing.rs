//! Every answer says where its time went in `Server-Timing` (the gRPC door in its
//! metadata): the backend call, the micro-batch queue, the cache, retries and hedges
//! (tests/it/retries.rs, tests/it/hedging.rs), and the gateway's own work, adding up to
//! the total; an error says its total only.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::sim::{ModelSpec, Profile};
use tokio::time::Instant;

/// A simulator serving `m` whose every call takes at least 20 ms.
async fn twenty_ms() -> Backend {
    let profile = Profile {
        a: Duration::from_millis(20),
        ..Profile::default()
    };
    backend_with(vec![ModelSpec::new("m", profile)]).await
}

/// `budget` ms for model `m` on `gw`: the answer, and the time the client saw, in ms.
async fn timed(addr: std::net::SocketAddr, budget: &str) -> (Answer, f64) {
    let started = Instant::now();
    let answer = infer(addr, "m", &[("x-tiergate-budget-ms", budget)], BODY).await;
    (answer, started.elapsed().as_secs_f64() * 1e3)
}

#[tokio::test]
async fn real_time_and_micro_batch_answers_say_where_their_time_went_and_the_parts_add_up() {
    let (rt, batch) = (twenty_ms().await, twenty_ms().await);
    // One batch at a time, so a second request waits for the first's batch.
    let toml = route_r(&rt.url(), &batch.url())
        .flags(&["realtime", "micro_batch"])
        .set("micro_batch.max_in_flight", 1)
        .toml();
    let gw = gateway(&toml).await;
    for _ in 0..3 {
        let (answer, seen) = timed(gw.http_addr(), "250").await;
        assert_eq!(
            (answer.status, answer.tier().0),
            (200, Some("realtime")),
            "{}",
            answer.text()
        );
        let parts = answer.timing();
        assert_eq!(part_names(&parts), ["backend", "gateway", "total"]);
        assert!(
            part(&parts, "backend") >= 20.0,
            "the backend's 20 ms are the backend's: {parts:?}"
        );
        assert!(part(&parts, "gateway") < 5.0, "{parts:?}");
        assert!(
            part(&parts, "total") <= seen,
            "no more than the client saw ({seen} ms): {parts:?}"
        );
    }
    for _ in 0..3 {
        let (answer, seen) = timed(gw.http_addr(), "2000").await;
        assert_eq!(
            (answer.status, answer.tier()),
            (200, (Some("micro_batch"), Some("budget_micro_batch"))),
            "{:?}",
            answer.headers
        );
        let parts = answer.timing();
        assert_eq!(part_names(&parts), ["queue", "backend", "gateway", "total"]);
        assert!(part(&parts, "backend") >= 20.0, "{parts:?}");
        assert!(part(&parts, "total") <= seen, "{parts:?}");
    }
    // A request that waits for its batch: the batch pool is held with another batch,
    // the request is queued behind it, and the hold lasts 50 ms more (a wait measured,
    // not a synchronisation): all of it the queue's.
    batch.sim.hold();
    let first = tokio::spawn(timed(gw.http_addr(), "2000"));
    wait_for(&batch, |s| s.in_flight == 1).await;
    let second = tokio::spawn(timed(gw.http_addr(), "2000"));
    queued(&gw, "r", 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    batch.sim.release();
    let (first, _) = first.await.expect("answered");
    let (second, _) = second.await.expect("answered");
    assert_eq!((first.status, second.status), (200, 200));
    let parts = second.timing();
    assert!(part(&parts, "queue") >= 50.0, "{parts:?}");
    assert!(
        part(&parts, "backend") >= 20.0 && part(&parts, "backend") < 50.0,
        "its own batch's call: {parts:?}"
    );
}

#[tokio::test]
async fn a_cached_answer_an_error_and_a_grpc_answer_say_where_their_time_went() {
    let rt = twenty_ms().await;
    let toml = Route::new("timing_cache")
        .model("m")
        .only(&["realtime", "cache"])
        .set("realtime.endpoints", vec![rt.url()])
        .table("cache")
        .toml();
    let gw = gateway(&toml).await;
    let (miss, _) = timed(gw.http_addr(), "250").await;
    assert_eq!((miss.status, miss.header("x-tiergate-cache")), (200, Some("miss")));
    assert_eq!(part_names(&miss.timing()), ["cache", "backend", "gateway", "total"]);
    let (hit, _) = timed(gw.http_addr(), "250").await;
    assert_eq!((hit.status, hit.header("x-tiergate-cache")), (200, Some("hit")));
    let parts = hit.timing();
    assert_eq!(part_names(&parts), ["cache", "gateway", "total"], "no backend call");
    assert!(part(&parts, "total") < 20.0, "{parts:?}");

    let dead = Route::new("timing_dead")
        .model("m")
        .only(&["realtime"])
        .set("realtime.endpoints", vec![format!("http://{}", dead_addr().await)])
        .toml();
    let gw = gateway(&dead).await;
    let (failed, _) = timed(gw.http_addr(), "250").await;
    assert_eq!(failed.status, 502, "{}", failed.text());
    assert_eq!(part_names(&failed.timing()), ["total"], "an error says its total only");

    let gw = gateway(&route_r(&rt.url(), &rt.url()).toml()).await;
    let mut c = common::grpc::client(gw.grpc_addr()).await;
    let answer = c
        .model_infer(common::grpc::with_budget(
            common::grpc::fp32_request("t", &[[1.0, 2.0]]),
            "250",
        ))
        .await
        .expect("served");
    let value = answer.metadata().get("server-timing").expect("in the metadata");
    let parts = timing_parts(value.to_str().expect("ascii"));
    assert_eq!(part_names(&parts), ["backend", "gateway", "total"]);
    assert!(part(&parts, "backend") >= 20.0, "{parts:?}");
}
