//! Several models in one pass, end to end over both doors against the simulator's
//! combined model (`heads`, with heads `ctr` and `cvr`): callers of either member with
//! the same inputs share one backend call asking for both members' outputs, and each
//! caller gets only its own model's outputs, under its model's names, as it asked; a
//! caller asking for an output its model does not have gets 400; the route's cache keeps
//! each member's rows apart.
//!
//! The batch backend is held so the first request occupies the pool's only slot; the
//! rest queue in the gateway (waiting for the queue-depth gauge, never for time) until
//! it is released.

use crate::common;

use std::time::Duration;

use common::grpc::{client, fp32_request, with_budget};
use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::sim::{ModelSpec, Profile};
use tokio::task::JoinHandle;

/// The simulator's combined model: `heads` with heads ctr and cvr (ctr's sums are the
/// row's plus 1, cvr's plus 2).
async fn combined_backend() -> Backend {
    let mut heads = ModelSpec::new("heads", Profile::named("instant").expect("profile"));
    heads.heads = vec!["ctr".into(), "cvr".into()];
    backend_with(vec![heads]).await
}

/// Route `name` serving ctr and cvr on its micro-batch tier, both computed by the
/// combined model `heads`: batches of up to 8 rows, one slot, callers that come
/// within 5 s of each other in one batch.
fn policy(name: &str, batch: &str, extra: &str) -> String {
    format!(
        r#"
[defaults]
realtime_below = "10ms"
[routes.{name}]
models = ["ctr", "cvr"]
[routes.{name}.flags]
realtime = false
micro_batch = true
{extra}
[routes.{name}.micro_batch]
endpoints = ["{batch}"]
max_batch = 8
max_wait = "5s"
max_in_flight = 1
[routes.{name}.micro_batch.combined.heads]
ctr = {{ OUTPUT0 = "ctr_OUTPUT0", OUTPUT1 = "ctr_OUTPUT1" }}
cvr = {{ score = "cvr_OUTPUT1" }}
"#
    )
}

/// A one-row request for `[a, b]`, asking for `outputs` (none: all of its model's).
fn body(id: &str, (a, b): (f32, f32), outputs: &[&str]) -> String {
    let mut body =
        json!({"id": id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [a, b]}]});
    if !outputs.is_empty() {
        body["outputs"] = outputs.iter().map(|name| json!({"name": name})).collect();
    }
    body.to_string()
}

fn call(gw: &Gateway, model: &'static str, body: String) -> JoinHandle<Answer> {
    let addr = gw.http_addr();
    tokio::spawn(async move { infer(addr, model, &[("x-tiergate-budget-ms", "5000")], &body).await })
}

/// The names of `answer`'s outputs, in order.
fn names(answer: &Value) -> Vec<String> {
    answer["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| o["name"].as_str().expect("name").to_owned())
        .collect()
}

/// Output `name`'s data in `answer`.
fn data(answer: &Value, name: &str) -> Value {
    let outputs = answer["outputs"].as_array().expect("outputs");
    outputs.iter().find(|o| o["name"] == name).expect("the output")["data"].clone()
}

async fn wait_heads(batch: &Backend, pred: impl Fn(&tiergate::sim::Stats) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), batch.sim.wait_for("heads", pred))
        .await
        .expect("the backend reached the expected state within 10 s");
}

#[tokio::test]
async fn callers_of_both_members_share_one_call_and_each_gets_its_own_outputs() {
    let batch = combined_backend().await;
    let gw = gateway(&policy("heads_shared", &batch.url(), "")).await;
    batch.sim.hold();
    let busy = call(&gw, "ctr", body("busy", (0.0, 0.0), &[]));
    wait_heads(&batch, |s| s.requests == 1).await;

    let ctr = call(&gw, "ctr", body("a", (1.0, 2.0), &["OUTPUT1"]));
    queued(&gw, "heads_shared", 1).await;
    let cvr = call(&gw, "cvr", body("b", (1.0, 2.0), &[]));
    queued(&gw, "heads_shared", 2).await;
    let both = call(&gw, "ctr", body("c", (3.0, 4.0), &["OUTPUT1", "OUTPUT0"]));
    queued(&gw, "heads_shared", 3).await;
    // Over gRPC too: the door's call joins the same lane.
    let mut grpc = client(gw.grpc_addr()).await;
    let mut message = fp32_request("g", &[[5.0, 6.0]]);
    message.model_name = "cvr".into();
    let grpc_call = tokio::spawn(async move { grpc.model_infer(with_budget(message, "5000")).await });
    queued(&gw, "heads_shared", 4).await;
    batch.sim.release();

    assert_eq!(busy.await.expect("task").status, 200);
    let (ctr, cvr, both) = (
        ctr.await.expect("task"),
        cvr.await.expect("task"),
        both.await.expect("task"),
    );
    for answer in [&ctr, &cvr, &both] {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some("4"),
            "one call for all four"
        );
    }
    let batch_id = ctr.header("x-tiergate-batch-id");
    assert!(batch_id.is_some());
    assert_eq!(cvr.header("x-tiergate-batch-id"), batch_id, "the same backend call");
    assert_eq!(both.header("x-tiergate-batch-id"), batch_id);
    let stats = batch.sim.stats("heads").expect("heads");
    assert_eq!(stats.requests, 2, "the busy call and one shared call");
    assert_eq!(stats.batch_sizes.get(&4), Some(&1));
    // The batch's JSON header (binary tensors follow it).
    let mut header = serde_json::Deserializer::from_slice(&stats.last_request).into_iter::<Value>();
    let sent = header.next().expect("a header").expect("the batch's header is JSON");
    let asked: Vec<&str> = sent["outputs"]
        .as_array()
        .expect("the batch named its outputs")
        .iter()
        .map(|o| o["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        asked,
        ["ctr_OUTPUT0", "ctr_OUTPUT1", "cvr_OUTPUT1"],
        "every member's outputs, once"
    );

    let (ctr, cvr, both) = (ctr.json(), cvr.json(), both.json());
    assert_eq!((&ctr["model_name"], &ctr["id"]), (&json!("ctr"), &json!("a")));
    assert_eq!(names(&ctr), ["OUTPUT1"], "only what it named");
    assert_eq!(data(&ctr, "OUTPUT1"), json!([4.0]), "ctr's head: 1 + 2 + 1");
    assert_eq!(cvr["model_name"], "cvr");
    assert_eq!(names(&cvr), ["score"], "cvr's output under cvr's name, none of ctr's");
    assert_eq!(data(&cvr, "score"), json!([5.0]), "cvr's head: 1 + 2 + 2");
    assert_eq!(names(&both), ["OUTPUT1", "OUTPUT0"], "in the order it named them");
    assert_eq!(data(&both, "OUTPUT1"), json!([8.0]));
    assert_eq!(data(&both, "OUTPUT0"), json!([3.0, 4.0]), "its own row");

    let grpc = grpc_call.await.expect("task").expect("served").into_inner();
    assert_eq!(grpc.model_name, "cvr");
    assert_eq!(grpc.id, "g");
    let outputs: Vec<&str> = grpc.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outputs, ["score"]);
    let score = f64::from_le_bytes(grpc.raw_output_contents[0][..8].try_into().expect("8 bytes"));
    assert_eq!(score, 13.0, "5 + 6 + cvr's 2");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_output_the_member_does_not_have_is_refused_saying_which_it_has() {
    let batch = combined_backend().await;
    let gw = gateway(&policy("heads_unknown", &batch.url(), "")).await;
    let answer = infer(
        gw.http_addr(),
        "cvr",
        &[("x-tiergate-budget-ms", "5000")],
        &body("x", (1.0, 2.0), &["OUTPUT1"]),
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("\\\"OUTPUT1\\\" is not an output of model \\\"cvr\\\" (it has score)"),
        "{}",
        answer.text()
    );
    assert_eq!(batch.sim.stats("heads").expect("heads").requests, 0, "nothing sent");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_cache_keeps_each_members_rows_apart() {
    let batch = combined_backend().await;
    let cache = "cache = true\n[routes.heads_cached.cache]\nttl = \"60s\"";
    let gw = gateway(&policy("heads_cached", &batch.url(), cache)).await;
    let ask = |model: &'static str, id: &str, outputs: &[&str]| {
        let body = body(id, (1.0, 2.0), outputs);
        let addr = gw.http_addr();
        async move { infer(addr, model, &[("x-tiergate-budget-ms", "5000")], &body).await }
    };
    let first = ask("ctr", "1", &["OUTPUT1"]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(data(&first.json(), "OUTPUT1"), json!([4.0]));
    // The same row for cvr is cvr's own question: not answered from ctr's entry.
    let other = ask("cvr", "2", &[]).await;
    assert_eq!(names(&other.json()), ["score"]);
    assert_eq!(data(&other.json(), "score"), json!([5.0]));
    assert_eq!(batch.sim.stats("heads").expect("heads").requests, 2);
    // ctr again, naming no outputs: its row was kept as ctr's whole answer, which a
    // one-row request finds at the door.
    let again = ask("ctr", "3", &[]).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("x-tiergate-cache"), Some("hit"), "{:?}", again.headers);
    assert_eq!(
        names(&again.json()),
        ["OUTPUT0", "OUTPUT1"],
        "all of ctr's, none of cvr's"
    );
    assert_eq!(again.json()["model_name"], "ctr");
    assert_eq!(batch.sim.stats("heads").expect("heads").requests, 2, "no third call");
    gw.stop().await.expect("stops");
}
