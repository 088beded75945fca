//! The micro-batch tier's order end to end over the HTTP door, against the simulator:
//! a contended pool serves the critical band first, refuses sheddable requests past
//! `shed_above` with 429 and `Retry-After`, counts every band, and answers a priority it
//! does not know with 400 saying what to send.
//!
//! The simulated batch backend is held so the first request occupies the pool's only
//! slot; the rest queue in the gateway (waiting for the queue-depth gauge, never for
//! time) until it is released.

use crate::common;

use common::*;
use serde_json::json;
use tiergate::app::Gateway;
use tokio::task::JoinHandle;

/// A route `name` serving model `m` on its micro-batch tier only: batches of 2 rows,
/// one slot, 8 rows of queue, sheddable requests refused past 2 rows waiting.
fn policy(name: &str, rt: &str, batch: &str) -> String {
    format!(
        r#"
[defaults]
realtime_below = "10ms"
[routes.{name}]
models = ["m"]
[routes.{name}.flags]
realtime = true
micro_batch = true
[routes.{name}.realtime]
endpoints = ["{rt}"]
[routes.{name}.micro_batch]
endpoints = ["{batch}"]
max_batch = 2
max_in_flight = 1
queue_capacity = 8
shed_above = 0.25
max_priority = "critical"
"#
    )
}

fn body(id: &str) -> String {
    json!({"id": id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]})
        .to_string()
}

fn call(gw: &Gateway, id: &'static str, priority: Option<&'static str>) -> JoinHandle<Answer> {
    let addr = gw.http_addr();
    tokio::spawn(async move {
        let mut headers = vec![("x-tiergate-budget-ms", "5000")];
        headers.extend(priority.map(|p| ("x-tiergate-priority", p)));
        infer(addr, "m", &headers, &body(id)).await
    })
}

#[tokio::test]
async fn a_contended_pool_serves_bands_in_order_and_sheds_the_lowest() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("bands", &rt.url(), &batch.url())).await;
    batch.sim.hold();
    let busy = call(&gw, "busy", None);
    wait_for(&batch, |s| s.requests == 1).await;

    let standard = call(&gw, "standard", None);
    queued(&gw, "bands", 1).await;
    let sheddable = call(&gw, "sheddable", Some("sheddable"));
    queued(&gw, "bands", 2).await;
    let refused = call(&gw, "refused", Some("Sheddable")).await.expect("task");
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert!(refused.text().contains("shed_above 2 reached"), "{}", refused.text());
    let critical = call(&gw, "critical", Some("critical"));
    queued(&gw, "bands", 3).await;

    let unknown = infer(
        gw.http_addr(),
        "m",
        &[("x-tiergate-budget-ms", "5000"), ("x-tiergate-priority", "urgent")],
        &body("unknown"),
    )
    .await;
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    let said = unknown.text();
    assert!(
        said.contains("x-tiergate-priority must be") && said.contains("urgent"),
        "{said}"
    );

    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let [standard, sheddable, critical] = [standard, sheddable, critical].map(|h| async { h.await.expect("task") });
    let (standard, sheddable, critical) = (standard.await, sheddable.await, critical.await);
    for answer in [&standard, &sheddable, &critical] {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let id = |a: &Answer| a.header("x-tiergate-batch-id").expect("a batch id").to_owned();
    assert_eq!(
        id(&critical),
        id(&standard),
        "the first batch after the busy one: critical, then standard"
    );
    assert_ne!(
        id(&sheddable),
        id(&critical),
        "the sheddable caller waited for the next batch"
    );

    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    for (priority, outcome, n) in [
        ("critical", "queued", 1),
        ("standard", "queued", 2),
        ("sheddable", "queued", 1),
        ("sheddable", "shed", 1),
        ("critical", "shed", 0),
    ] {
        let line = format!(
            "tiergate_batch_priority_requests_total{{route=\"bands\",priority=\"{priority}\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(scrape.lines().any(|l| l == line), "no {line} in\n{scrape}");
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn nobody_claims_a_band_above_standard_unless_the_operator_gives_it_to_their_key() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let mut cfg = config();
    std::fs::create_dir_all(&cfg.data_dir).expect("data dir");
    let keys = cfg.data_dir.with_extension("keys");
    let lines = [
        tiergate::front::auth::line("gold", "key-of-gold"),
        tiergate::front::auth::line("plain", "key-of-plain"),
    ];
    std::fs::write(&keys, lines.join("\n")).expect("keys file");
    cfg.auth.keys_file = Some(keys);
    // The route's ceiling is left at its default; only gold's key is given critical.
    let toml = policy("ceilings", &rt.url(), &batch.url()).replace(
        "max_priority = \"critical\"\n",
        "tenant_max_priority = { gold = \"critical\" }\n",
    );
    let gw = gateway_with(cfg, &toml).await;
    let ask = |key: &'static str| {
        let addr = gw.http_addr();
        async move {
            let bearer = format!("Bearer {key}");
            let headers = [
                ("x-tiergate-budget-ms", "5000"),
                ("x-tiergate-priority", "critical"),
                ("authorization", bearer.as_str()),
                // A header tenant is nobody's credential: it changes nothing here.
                ("x-api-key", "gold"),
            ];
            infer(addr, "m", &headers, &body("c")).await
        }
    };
    for key in ["key-of-plain", "key-of-plain", "key-of-gold"] {
        let answer = ask(key).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    for (priority, n) in [("critical", 1), ("standard", 2)] {
        let line = format!(
            "tiergate_batch_priority_requests_total{{route=\"ceilings\",priority=\"{priority}\",outcome=\"queued\"}} {n}"
        );
        assert!(scrape.lines().any(|l| l == line), "no {line} in\n{scrape}");
    }
    gw.stop().await.expect("stops");
}
