//! A refusal names the setting whose limit refused it, the value it measured and the
//! limit, and is counted in `tiergate_refusals_total{knob}`, one series per setting.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::app::Gateway;
use tiergate::sim::{ModelSpec, Profile};

/// A request of one row for model `m`.
const ONE_ROW: &str = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}"#;

/// The count of `route`'s refusals by `knob` in `tier`.
async fn refused(gw: &Gateway, route: &str, tier: &str, knob: &str) -> u64 {
    let series = format!("tiergate_refusals_total{{route=\"{route}\",tier=\"{tier}\",knob=\"{knob}\"}}");
    metric(gw, &series).await as u64
}

/// The error message of `answer`.
fn message(answer: &Answer) -> String {
    answer.json()["error"].as_str().expect("an error message").to_owned()
}

#[tokio::test]
async fn a_full_pool_a_full_queue_and_an_unmeetable_deadline_name_their_setting_value_and_limit() {
    let profile = Profile {
        a: Duration::from_millis(20),
        ..Profile::default()
    };
    let (rt, batch) = (
        backend_with(vec![ModelSpec::new("m", profile)]).await,
        backend(&["m"]).await,
    );
    let toml = Route::new("knobs")
        .model("m")
        .only(&["realtime", "micro_batch"])
        .set("realtime.endpoints", vec![rt.url()])
        .set("realtime.max_concurrency", 1)
        .set("micro_batch.endpoints", vec![batch.url()])
        .set("micro_batch.max_batch", 1)
        .set("micro_batch.max_in_flight", 1)
        .set("micro_batch.queue_capacity", 1)
        .toml();
    let gw = gateway(&toml).await;
    let addr = gw.http_addr();
    let ask =
        |budget: &'static str| async move { infer(addr, "m", &[("x-tiergate-budget-ms", budget)], ONE_ROW).await };

    // The learned cost: 20 ms calls; then a 5 ms budget is refused before it is sent.
    for _ in 0..25 {
        assert_eq!(ask("250").await.status, 200);
    }
    let hopeless = ask("5").await;
    assert_eq!(hopeless.status, 503, "{}", hopeless.text());
    let text = message(&hopeless);
    assert!(text.starts_with("deadline unmeetable: learned cost "), "{text}");
    assert!(text.contains(" ms left of the budget"), "{text}");
    assert_eq!(refused(&gw, "knobs", "realtime", "deadline").await, 1);

    // One call in flight on a pool of one: the next is shed, naming the setting.
    rt.sim.hold();
    let held = tokio::spawn(ask("250"));
    wait_for(&rt, |s| s.in_flight == 1).await;
    let shed = ask("250").await;
    assert_eq!(shed.status, 503, "{}", shed.text());
    let text = message(&shed);
    assert!(
        text.starts_with("max_concurrency 1 reached on route knobs's realtime pool (1 calls in flight)"),
        "{text}"
    );
    assert_eq!(refused(&gw, "knobs", "realtime", "max_concurrency").await, 1);
    rt.sim.release();
    assert_eq!(held.await.expect("answered").status, 200);

    // One batch in flight, one row queued: a queue of one row refuses the next.
    batch.sim.hold();
    let sent = tokio::spawn(ask("3000"));
    wait_for(&batch, |s| s.in_flight == 1).await;
    let waiting = tokio::spawn(ask("3000"));
    queued(&gw, "knobs", 1).await;
    let full = ask("3000").await;
    assert_eq!(full.status, 429, "{}", full.text());
    let text = message(&full);
    assert!(text.starts_with("queue_capacity 1 reached (1 rows waiting"), "{text}");
    assert_eq!(refused(&gw, "knobs", "micro_batch", "queue_capacity").await, 1);
    batch.sim.release();
    assert_eq!(sent.await.expect("answered").status, 200);
    assert_eq!(waiting.await.expect("answered").status, 200);
}
