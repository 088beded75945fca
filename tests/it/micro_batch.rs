//! The micro-batch tier end to end over the HTTP and gRPC doors, against the simulator:
//! batches really form (the simulator counts them), each caller gets exactly its own rows,
//! mixed signatures never merge, a poison request fails alone, callers who leave are
//! not sent, a full queue answers 429, an unmeetable deadline 503 at once, turning the
//! flag off drains the queue, and the JSON adapters batch TF-Serving and embeddings.
//!
//! Every test holds the simulated batch backend so the first request occupies the
//! pool's only slot, queues the rest in the gateway (waiting for the queue-depth gauge,
//! never for time), and then releases it.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::protocol::{self, InferResponse};
use tiergate::sim::{ModelSpec, Profile};
use tokio::task::JoinHandle;

const BATCH: [(&str, &str); 1] = [("x-tiergate-budget-ms", "5000")];

/// A route `name` serving model `m` (and `paths`) whose micro-batch tier takes budgets
/// from 10 ms, with one batch slot on `batch`. Its batch window is wide (3 s) so every
/// caller a test queues behind the busy slot falls in one window however slow the
/// machine; the batch leaves when the slot frees, not when the window closes.
pub(crate) fn policy(name: &str, rt: &str, batch: &str, paths: &str, extra: &str) -> String {
    format!(
        r#"
[defaults]
realtime_below = "10ms"
[routes.{name}]
models = ["m"]
paths = [{paths}]
[routes.{name}.flags]
realtime = true
micro_batch = true
[routes.{name}.realtime]
endpoints = ["{rt}"]
max_concurrency = 8
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

/// A KServe v2 JSON body: `rows` rows of two FP32 values derived from `seed`.
fn body(id: &str, seed: u32, rows: u32, binary_output: bool) -> (String, Vec<f32>) {
    let data: Vec<f32> = (0..rows * 2).map(|i| (seed * 100 + i) as f32).collect();
    let body = json!({
        "id": id,
        "parameters": {"binary_data_output": binary_output},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 2], "data": data}],
    });
    (body.to_string(), data)
}

fn decode(answer: &Answer) -> InferResponse {
    let header_len = protocol::header_len(&answer.headers).expect("header");
    protocol::decode_response(&answer.body, header_len).unwrap_or_else(|e| panic!("{e}: {}", answer.text()))
}

fn fp32(resp: &InferResponse, output: &str) -> Vec<f32> {
    let t = resp.outputs.iter().find(|t| t.name == output).expect("output");
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

fn spawn_infer(addr: std::net::SocketAddr, body: String) -> JoinHandle<Answer> {
    tokio::spawn(async move { infer(addr, "m", &BATCH, &body).await })
}

/// Starts the gateway with the batch backend held and one request (1 row) holding the
/// only slot; returns that request.
pub(crate) async fn occupy(gw: &Gateway, batch: &Backend) -> JoinHandle<Answer> {
    let before = batch.sim.stats("m").expect("stats").requests;
    batch.sim.hold();
    let (b, _) = body("busy", 0, 1, false);
    let busy = spawn_infer(gw.http_addr(), b);
    wait_for(batch, |s| s.requests == before + 1).await;
    busy
}

#[tokio::test]
async fn concurrent_callers_share_one_batch_and_each_gets_its_own_rows() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("share", &rt.url(), &batch.url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    let mut callers = Vec::new();
    let mut rows_total = 0;
    for i in 1..=10u32 {
        let rows = 1 + i % 3;
        rows_total += u64::from(rows);
        let (b, data) = body(&format!("c{i}"), i, rows, i % 2 == 0);
        callers.push((i, data, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "share", rows_total).await; // arrival order is queue order
    }
    batch.sim.release();
    let busy = busy.await.expect("task");
    assert_eq!(busy.status, 200);
    let first_batch = busy.header("x-tiergate-batch-id").expect("a batch id").to_owned();
    assert!(
        first_batch.starts_with("mb_") && first_batch.len() == 19,
        "{first_batch}"
    );
    let mut batch_ids = std::collections::BTreeSet::new();
    for (i, data, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        batch_ids.insert(answer.header("x-tiergate-batch-id").expect("a batch id").to_owned());
        assert_eq!(answer.tier(), (Some("micro_batch"), Some("budget_micro_batch")));
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some(rows_total.to_string().as_str())
        );
        let waited: f64 = answer
            .header("x-tiergate-queue-ms")
            .expect("queue ms")
            .parse()
            .expect("ms");
        assert!(waited > 0.0, "it waited for the busy slot");
        let binary = answer.header(protocol::HEADER_LEN.as_str()).is_some();
        assert_eq!(binary, i % 2 == 0, "caller {i} gets the encoding it asked for");
        let resp = decode(&answer);
        assert_eq!(resp.id.as_deref(), Some(format!("c{i}").as_str()), "its own id");
        assert_eq!(fp32(&resp, "OUTPUT0"), data, "caller {i} gets exactly its own rows");
        let sums: Vec<f64> = data.chunks(2).map(|r| f64::from(r[0] + r[1])).collect();
        let out1 = resp.outputs.iter().find(|t| t.name == "OUTPUT1").expect("OUTPUT1");
        let got: Vec<f64> = out1
            .data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        assert_eq!(got, sums);
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(
        stats.batch_sizes,
        [(1, 1), (rows_total, 1)].into(),
        "one batch of every waiting caller"
    );
    assert_eq!(batch_ids.len(), 1, "one batch id for the callers of one batch");
    // The backend hears how long the batch is still useful for, in microseconds.
    let timeout = last_batch(&stats).parameters["timeout"]
        .as_u64()
        .expect("a timeout parameter");
    assert!(
        timeout > 0 && timeout <= 5_000_000,
        "within the callers' 5 s budget: {timeout} µs"
    );
    assert!(!batch_ids.contains(&first_batch), "another for the batch before");
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    for family in [
        "tiergate_batch_rows_bucket{route=\"share\"",
        "tiergate_batch_fill_ratio_bucket{route=\"share\"",
        "tiergate_batch_queue_duration_seconds_bucket{route=\"share\"",
        "tiergate_batch_flushes_total{route=\"share\",reason=\"idle_backend\"} 2",
    ] {
        assert!(scrape.contains(family), "{family} missing from /metrics");
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn requests_with_different_signatures_are_never_merged() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("mixed", &rt.url(), &batch.url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    let shapes = [
        ("FP32", "[1,2]", "[1,2]"),
        ("FP32", "[1,3]", "[1,2,3]"),
        ("INT32", "[1,2]", "[7,8]"),
    ];
    let mut callers = Vec::new();
    for i in 0..9 {
        let (datatype, shape, data) = shapes[i % 3];
        let b = format!(
            r#"{{"id":"{i}","inputs":[{{"name":"INPUT0","datatype":"{datatype}","shape":{shape},"data":{data}}}]}}"#
        );
        callers.push((i, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "mixed", i as u64 + 1).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (i, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some("3"),
            "three callers per signature"
        );
        let out = answer.json();
        let (datatype, shape, data) = shapes[i % 3];
        assert_eq!(out["outputs"][0]["datatype"], datatype);
        assert_eq!(out["outputs"][0]["shape"].to_string(), shape);
        let numbers =
            |v: &Value| -> Vec<f64> { v.as_array().expect("array").iter().filter_map(Value::as_f64).collect() };
        let sent: Value = serde_json::from_str(data).expect("json");
        assert_eq!(
            numbers(&out["outputs"][0]["data"]),
            numbers(&sent),
            "caller {i} gets its own row"
        );
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(stats.batch_sizes, [(1, 1), (3, 3)].into(), "one batch per signature");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_poison_request_fails_alone_and_its_batch_mates_are_answered() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("poison", &rt.url(), &batch.url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    let words = ["alpha", "beta", "gamma", "poison", "delta", "epsilon", "zeta", "eta"];
    let mut callers = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let b = format!(
            r#"{{"id":"{i}","inputs":[{{"name":"INPUT0","datatype":"BYTES","shape":[1,1],"data":["{word}"]}}]}}"#
        );
        callers.push((*word, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "poison", i as u64 + 1).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (word, call) in callers {
        let answer = call.await.expect("task");
        if word == "poison" {
            assert_eq!(answer.status, 400, "{}", answer.text());
            assert!(
                answer.text().contains("\\\"poison\\\""),
                "the backend's reason: {}",
                answer.text()
            );
        } else {
            assert_eq!(answer.status, 200, "{word}: {}", answer.text());
            assert_eq!(
                answer.json()["outputs"][0]["data"],
                json!([word]),
                "{word} gets its own row"
            );
        }
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(stats.rows, 1 + 7, "every good row ran exactly once");
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with("tiergate_batch_isolations_total{route=\"poison\"} ")),
        "isolation is counted"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn callers_who_leave_are_not_sent() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("leave", &rt.url(), &batch.url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    // An HTTP caller that hangs up while queued…
    let (b, _) = body("gone", 1, 3, false);
    let gone = spawn_infer(gw.http_addr(), b);
    queued(&gw, "leave", 3).await;
    gone.abort();
    // …and a gRPC caller that cancels.
    let mut grpc = common::grpc::client(gw.grpc_addr()).await;
    let raw = common::grpc::fp32_request("cancelled", &[[0.0, 0.0], [0.0, 0.0]]);
    let mut cancelled = tonic::Request::new(raw);
    cancelled.set_timeout(Duration::from_secs(5));
    let call = tokio::spawn(async move { grpc.model_infer(cancelled).await });
    queued(&gw, "leave", 5).await;
    call.abort();
    let (b, data) = body("stays", 2, 1, false);
    let stays = spawn_infer(gw.http_addr(), b);
    queued(&gw, "leave", 6).await;
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let answer = stays.await.expect("task");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    assert_eq!(
        answer.header("x-tiergate-batch-size"),
        Some("1"),
        "only the caller who stayed"
    );
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(
        stats.batch_sizes,
        [(1, 2)].into(),
        "the callers who left never reached the backend"
    );
    queued(&gw, "leave", 0).await;
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let policy = policy("full", &rt.url(), &batch.url(), "", "")
        .replace("max_batch = 64", "max_batch = 4")
        .replace("queue_capacity = 1000", "queue_capacity = 4");
    let gw = gateway(&policy).await;
    let busy = occupy(&gw, &batch).await;
    let mut callers = Vec::new();
    for i in 0..2 {
        let (b, _) = body(&format!("q{i}"), i, 2, false);
        callers.push(spawn_infer(gw.http_addr(), b));
        queued(&gw, "full", u64::from(i + 1) * 2).await;
    }
    let (b, _) = body("refused", 9, 1, false);
    let refused = infer(gw.http_addr(), "m", &BATCH, &b).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert!(refused.text().contains("capacity 4"), "{}", refused.text());
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for call in callers {
        assert_eq!(call.await.expect("task").status, 200, "queued callers are still served");
    }
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(scrape.contains("tiergate_batch_rejections_total{route=\"full\",reason=\"queue_full\"} 1"));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_unmeetable_deadline_is_refused_at_once_by_the_learned_cost() {
    let rt = backend(&["m"]).await;
    let slow = Profile {
        a: Duration::from_millis(40),
        ..Profile::default()
    };
    let batch = backend_with(vec![ModelSpec::new("m", slow)]).await;
    let gw = gateway(&policy("learn", &rt.url(), &batch.url(), "", "")).await;
    for i in 0..8 {
        let (b, _) = body("warm", i, 1 + i % 4, false);
        assert_eq!(infer(gw.http_addr(), "m", &BATCH, &b).await.status, 200);
    }
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    let fixed = scrape
        .lines()
        .find_map(|l| l.strip_prefix("tiergate_batch_cost_fixed_seconds{route=\"learn\"} "))
        .expect("the learned cost is exported")
        .parse::<f64>()
        .expect("number");
    assert!(fixed >= 0.030, "about 40 ms learned, got {fixed}");
    let busy = occupy(&gw, &batch).await;
    let (b, _) = body("hopeless", 1, 1, false);
    let refused = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "20")], &b).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.text().contains("deadline unmeetable: learned cost"),
        "{}",
        refused.text()
    );
    assert!(refused.header("retry-after").is_some());
    let (b, _) = body("patient", 2, 1, false);
    let patient = spawn_infer(gw.http_addr(), b);
    queued(&gw, "learn", 1).await;
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    assert_eq!(patient.await.expect("task").status, 200, "a budget that fits is served");
    assert_eq!(
        batch.sim.stats("m").expect("stats").requests,
        10,
        "the refused one never reached it"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn turning_the_flag_off_drains_the_queue_and_loses_nothing() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy("drain", &rt.url(), &batch.url(), "", "");
    let gw = gateway(&text).await;
    let busy = occupy(&gw, &batch).await;
    let mut callers = Vec::new();
    for i in 0..5 {
        let (b, data) = body(&format!("d{i}"), i, 1, false);
        callers.push((data, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "drain", u64::from(i) + 1).await;
    }
    gw.policy().swap(common::policy(
        &text.replace("micro_batch = true", "micro_batch = false"),
    ));
    let (b, _) = body("after", 9, 1, false);
    let after = infer(gw.http_addr(), "m", &BATCH, &b).await;
    assert_eq!(
        after.tier(),
        (Some("realtime"), Some("micro_batch_off")),
        "new requests stay off the tier"
    );
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (data, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-tier"), Some("micro_batch"));
        assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    }
    assert_eq!(batch.sim.stats("m").expect("stats").rows, 6);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn tf_serving_callers_are_batched_through_the_json_adapter() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy(
        "tfs",
        &rt.url(),
        &batch.url(),
        r#""/v1/models/m:predict""#,
        r#"json_adapter = "tf_serving""#,
    );
    let gw = gateway(&text).await;
    let busy = occupy(&gw, &batch).await;
    let bodies = [
        json!({"instances": [[1, 2], [3, 4]]}),
        json!({"instances": [[10, 20]]}),
        json!({"instances": [[100, 200], [1, 1], [2, 2]]}),
    ];
    let mut callers = Vec::new();
    let mut rows = 0;
    for b in &bodies {
        rows += b["instances"].as_array().expect("array").len() as u64;
        let (addr, b) = (gw.http_addr(), b.to_string());
        let headers = [("x-tiergate-budget-ms", "5000"), ("content-type", "application/json")];
        callers.push(tokio::spawn(async move {
            send("POST", addr, "/v1/models/m:predict", &headers, b).await
        }));
        queued(&gw, "tfs", rows).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let expected = [json!([3.0, 7.0]), json!([30.0]), json!([300.0, 2.0, 4.0])];
    for (call, want) in callers.into_iter().zip(expected) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-batch-size"), Some("6"));
        assert_eq!(answer.json(), json!({"predictions": want}));
    }
    assert_eq!(
        batch.sim.stats("m").expect("stats").batch_sizes,
        [(1, 1), (6, 1)].into()
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn embedding_callers_are_batched_and_indexes_renumbered() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy(
        "emb",
        &rt.url(),
        &batch.url(),
        r#""/v1/embeddings""#,
        r#"json_adapter = "openai_embeddings""#,
    );
    let gw = gateway(&text).await;
    let busy = occupy(&gw, &batch).await;
    let inputs = [json!("one two"), json!(["a", "bc"]), json!([5, 6, 7])];
    let mut callers = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let b = json!({"model": "m", "input": input}).to_string();
        let addr = gw.http_addr();
        let headers = [("x-tiergate-budget-ms", "5000"), ("content-type", "application/json")];
        callers.push(tokio::spawn(async move {
            send("POST", addr, "/v1/embeddings", &headers, b).await
        }));
        queued(&gw, "emb", [1, 3, 4][i]).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let expected = [
        json!([{"object": "embedding", "index": 0, "embedding": [7.0, 700.0]}]),
        json!([{"object": "embedding", "index": 0, "embedding": [1.0, 97.0]},
               {"object": "embedding", "index": 1, "embedding": [2.0, 197.0]}]),
        json!([{"object": "embedding", "index": 0, "embedding": [3.0, 18.0]}]),
    ];
    for (call, want) in callers.into_iter().zip(expected) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        let out: Value = answer.json();
        assert_eq!(out["data"], want);
        assert_eq!(out["model"], "m");
        assert!(out["usage"]["prompt_tokens"].is_u64());
    }
    assert_eq!(
        batch.sim.stats("m").expect("stats").batch_sizes,
        [(1, 1), (4, 1)].into()
    );
    gw.stop().await.expect("stops");
}

/// A real-time and a batch backend serving KServe model `m` (which holds the batch
/// slot) and LLM `llm`, and a gateway whose route `route` merges `/v1/completions`
/// calls on the batch pool, its policy ending with `extra`.
pub(crate) async fn completions_gateway(route: &str, extra: &str) -> (Backend, Backend, Gateway) {
    let llm = tiergate::sim::LlmProfile::named("llm-tiny").expect("profile");
    let specs = || vec![ModelSpec::new("m", Profile::default()), ModelSpec::llm("llm", llm)];
    let (rt, batch) = (backend_with(specs()).await, backend_with(specs()).await);
    let text = policy(
        route,
        &rt.url(),
        &batch.url(),
        r#""/v1/completions""#,
        r#"json_adapter = "openai_completions""#,
    )
    .replace(r#"models = ["m"]"#, r#"models = ["m", "llm"]"#);
    let gw = gateway(&(text + extra)).await;
    (rt, batch, gw)
}

#[tokio::test]
async fn completions_callers_share_one_call_and_each_gets_what_a_call_of_its_own_would() {
    let (_rt, batch, gw) = completions_gateway("cmpl", "").await;
    let busy = occupy(&gw, &batch).await;
    let prompts = [json!("alpha beta"), json!(["gamma", "delta epsilon"]), json!("zeta")];
    let body =
        |prompt: &Value| json!({"model": "llm", "prompt": prompt, "max_tokens": 4, "temperature": 0}).to_string();
    let mut callers = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (addr, b) = (gw.http_addr(), body(prompt));
        let headers = [("x-tiergate-budget-ms", "5000"), ("content-type", "application/json")];
        callers.push(tokio::spawn(async move {
            send("POST", addr, "/v1/completions", &headers, b).await
        }));
        queued(&gw, "cmpl", [1, 3, 4][i]).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let generations = batch.sim.llm_stats("llm").expect("stats").generations;
    let texts = |v: &Value| -> Vec<(u64, String)> {
        v["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| {
                (
                    c["index"].as_u64().expect("index"),
                    c["text"].as_str().expect("text").to_owned(),
                )
            })
            .collect()
    };
    let mut prompt_tokens = 0;
    for (call, prompt) in callers.into_iter().zip(&prompts) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some("4"),
            "one call for the four prompts"
        );
        // The same prompt sent alone, straight to the backend: the same choices.
        let alone = send(
            "POST",
            batch.addr,
            "/v1/completions",
            &[("content-type", "application/json")],
            body(prompt),
        )
        .await;
        assert_eq!(texts(&answer.json()), texts(&alone.json()), "{prompt}");
        let usage = &answer.json()["usage"];
        assert_eq!(usage["tiergate_estimated"], true, "{usage}");
        prompt_tokens += usage["prompt_tokens"].as_u64().expect("prompt tokens");
    }
    assert_eq!(generations, 4, "the batch pool generated each prompt once");
    // The split adds up to what the backend counted: 2 + 1 + 2 + 1 words.
    assert_eq!(prompt_tokens, 6);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_grpc_batch_pool_is_sent_batches_over_grpc() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("grpcpool", &rt.url(), &batch.grpc_url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    let mut callers = Vec::new();
    for i in 1..=4u32 {
        let (b, data) = body(&format!("g{i}"), i, i, i % 2 == 1);
        callers.push((data, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "grpcpool", u64::from(i * (i + 1) / 2)).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (data, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-batch-size"), Some("10"));
        assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    }
    assert_eq!(
        batch.sim.stats("m").expect("stats").batch_sizes,
        [(1, 1), (10, 1)].into()
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn steps_of_a_triton_sequence_are_never_combined() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("seq", &rt.url(), &batch.url(), "", "")).await;
    let busy = occupy(&gw, &batch).await;
    // Eight steps of sequence 77 arrive while the batch slot is busy: any other eight
    // callers would leave in one batch.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let b = json!({"id": format!("s{i}"), "parameters": {"sequence_id": 77},
                           "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i]}]});
            spawn_infer(gw.http_addr(), b.to_string())
        })
        .collect();
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for call in calls {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-batch-size"), None, "sent alone");
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(
        stats.batch_sizes,
        [(1, 9)].into(),
        "every backend call carried one request"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_steps_of_a_sequence_keep_one_batch_endpoint_and_their_order() {
    let (rt, one, two) = (backend(&["m"]).await, backend(&["m"]).await, backend(&["m"]).await);
    let batch = format!("{}\", \"{}", one.url(), two.url());
    let policy = policy("r", &rt.url(), &batch, "", "").replace("max_in_flight = 1", "max_in_flight = 32");
    let gw = gateway(&policy).await;
    sequence_steps_in_order(&gw, (&one, &two), "micro_batch", "5000").await;
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_sequence_stays_in_the_tier_of_its_first_step() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("r", &rt.url(), &batch.url(), "", "").replace("\"10ms\"", "\"300ms\"")).await;
    let step = |id: &str, start: bool, end: bool| {
        json!({"id": id, "parameters": {"sequence_id": "s-1", "sequence_start": start, "sequence_end": end},
               "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
        .to_string()
    };
    let served = |answer: Answer| {
        assert_eq!(answer.status, 200, "{}", answer.text());
        let header = |name| answer.header(name).map(str::to_owned);
        (header("x-tiergate-tier"), header("x-tiergate-reason"))
    };
    let pair = |tier: &str, reason: &str| (Some(tier.to_owned()), Some(reason.to_owned()));
    // A 200 ms first step is real-time; the 2 s steps after it would be micro-batch.
    let first = infer(
        gw.http_addr(),
        "m",
        &[("x-tiergate-budget-ms", "200")],
        &step("a", true, false),
    )
    .await;
    assert_eq!(served(first), pair("realtime", "budget_realtime"));
    for (id, end) in [("b", false), ("c", true)] {
        let later = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "2000")],
            &step(id, false, end),
        )
        .await;
        assert_eq!(served(later), pair("realtime", "sequence"), "step {id}");
    }
    // Ended: the id's next sequence is classified afresh.
    let next = infer(
        gw.http_addr(),
        "m",
        &[("x-tiergate-budget-ms", "2000")],
        &step("d", true, false),
    )
    .await;
    assert_eq!(served(next), pair("micro_batch", "budget_micro_batch"));
    let ids = |b: &Backend| b.sim.stats("m").expect("stats").ids;
    assert_eq!(ids(&rt), ["a", "b", "c"]);
    assert_eq!(ids(&batch), ["d"]);
    gw.stop().await.expect("stops");
}

/// The last batch the simulator saw, in Triton's binary form: its JSON header, then the
/// tensors' bytes.
fn last_batch(stats: &tiergate::sim::Stats) -> protocol::InferRequest {
    let mut header = serde_json::Deserializer::from_slice(&stats.last_request).into_iter::<Value>();
    let _ = header.next();
    let header_len = header.byte_offset();
    protocol::decode_request(&stats.last_request, Some(header_len)).expect("the batch the simulator saw")
}

/// A body whose rows are `rows`, two FP32 values each.
fn rows_body(id: &str, rows: &[[f32; 2]]) -> (String, Vec<f32>) {
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    let body = json!({
        "id": id,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows.len(), 2], "data": data}],
    });
    (body.to_string(), data)
}

#[tokio::test]
async fn a_batch_sends_only_the_unique_rows_its_cache_does_not_hold() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy("rowcache", &rt.url(), &batch.url(), "", "")
        .replace("micro_batch = true", "micro_batch = true\ncache = true")
        + "[routes.rowcache.cache]\n";
    let gw = gateway(&text).await;
    let (a0, a1, b0, c0) = ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]);
    let (warm, _) = rows_body("warm", &[a0, a1]);
    let warmed = infer(gw.http_addr(), "m", &BATCH, &warm).await;
    assert_eq!(warmed.status, 200, "{}", warmed.text());
    assert_eq!(warmed.header("x-tiergate-cached-rows"), Some("0"));
    let sent_before = batch.sim.stats("m").expect("stats").rows;
    assert_eq!(sent_before, 2);

    // Three callers queue behind a busy slot: a0 and a1 are kept, b0 and c0 asked twice.
    let busy = occupy(&gw, &batch).await;
    let mut callers = Vec::new();
    let mut queued_rows = 0;
    for (id, rows, kept) in [("c1", [a0, b0], 1), ("c2", [b0, c0], 0), ("c3", [c0, a1], 1)] {
        let (body, data) = rows_body(id, &rows);
        callers.push((id, data, kept, spawn_infer(gw.http_addr(), body)));
        queued_rows += 2;
        queued(&gw, "rowcache", queued_rows).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (id, data, kept, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        let resp = decode(&answer);
        assert_eq!(resp.id.as_deref(), Some(id), "its own id");
        assert_eq!(fp32(&resp, "OUTPUT0"), data, "{id} gets its own rows, in its order");
        assert_eq!(answer.header("x-tiergate-cached-rows"), Some(kept.to_string().as_str()));
        assert_eq!(answer.header("x-tiergate-batch-size"), Some("2"), "two rows sent");
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(
        stats.rows,
        sent_before + 1 + 2,
        "the busy row, then b0 and c0 once each"
    );
    let last = last_batch(&stats);
    let seen: Vec<f32> = last.inputs[0]
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    assert_eq!(seen, [b0, c0].concat(), "only the unique rows the cache did not hold");
    let rows = |result: &str| format!("tiergate_cache_rows_total{{route=\"rowcache\",result=\"{result}\"}}");
    assert_eq!(metric(&gw, &rows("hit")).await, 2.0);
    assert_eq!(metric(&gw, &rows("deduped")).await, 2.0);
    assert_eq!(metric(&gw, &rows("sent")).await, 5.0, "warm 2, busy 1, batch 2");

    // Every row kept: answered without the backend; a one-row question a batch kept is a
    // hit at the door (a row's key is the key of a one-row request asking it).
    let requests = stats.requests;
    let (all_kept, data) = rows_body("c4", &[c0, a0, b0]);
    let answer = infer(gw.http_addr(), "m", &BATCH, &all_kept).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    assert_eq!(answer.header("x-tiergate-cached-rows"), Some("3"));
    let (one, data) = rows_body("c5", &[b0]);
    let answer = infer(gw.http_addr(), "m", &BATCH, &one).await;
    assert_eq!(answer.header("x-tiergate-cache"), Some("hit"));
    assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    assert_eq!(
        batch.sim.stats("m").expect("stats").requests,
        requests,
        "no backend call"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_embeddings_batch_sends_only_the_inputs_its_cache_does_not_hold() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy(
        "embrows",
        &rt.url(),
        &batch.url(),
        r#""/v1/embeddings""#,
        r#"json_adapter = "openai_embeddings""#,
    )
    .replace("micro_batch = true", "micro_batch = true\ncache = true")
        + "[routes.embrows.cache]\n";
    let gw = gateway(&text).await;
    let embed = |input: Value| {
        let body = json!({"model": "m", "input": input}).to_string();
        let addr = gw.http_addr();
        tokio::spawn(async move {
            let headers = [("x-tiergate-budget-ms", "5000"), ("content-type", "application/json")];
            send("POST", addr, "/v1/embeddings", &headers, body).await
        })
    };
    let warm = embed(json!(["alpha", "beta"])).await.expect("task");
    assert_eq!(warm.status, 200, "{}", warm.text());
    let warm = warm.json();
    let busy = occupy(&gw, &batch).await;
    let asked = [
        json!(["alpha", "gamma"]),
        json!(["gamma", "delta"]),
        json!(["beta", "delta"]),
    ];
    let mut callers = Vec::new();
    for (i, input) in asked.iter().enumerate() {
        callers.push(embed(input.clone()));
        queued(&gw, "embrows", 2 * (i as u64 + 1)).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let mut answers = Vec::new();
    for (call, kept) in callers.into_iter().zip([1, 0, 1]) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-cached-rows"), Some(kept.to_string().as_str()));
        let out = answer.json();
        let indexes: Vec<_> = out["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|d| d["index"].clone())
            .collect();
        assert_eq!(indexes, [json!(0), json!(1)], "indexed afresh");
        assert_eq!(out["model"], "m");
        answers.push(out);
    }
    let vector = |answer: &Value, i: usize| answer["data"][i]["embedding"].clone();
    assert_eq!(vector(&answers[0], 0), vector(&warm, 0), "alpha, kept");
    assert_eq!(
        vector(&answers[0], 1),
        vector(&answers[1], 0),
        "gamma, sent once for both"
    );
    assert_eq!(
        vector(&answers[1], 1),
        vector(&answers[2], 1),
        "delta, sent once for both"
    );
    assert_eq!(vector(&answers[2], 0), vector(&warm, 1), "beta, kept");
    assert_ne!(vector(&answers[1], 0), vector(&answers[1], 1));
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(
        stats.batch_sizes,
        [(1, 1), (2, 2)].into(),
        "the warm call, the busy one, then gamma and delta"
    );
    let rows = |result: &str| format!("tiergate_cache_rows_total{{route=\"embrows\",result=\"{result}\"}}");
    assert_eq!(metric(&gw, &rows("hit")).await, 2.0, "alpha and beta");
    assert_eq!(
        metric(&gw, &rows("deduped")).await,
        2.0,
        "gamma and delta, the second time"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn batches_shrink_after_failures_and_grow_back_as_they_succeed() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    // The endpoint stays in (its breaker is the pool's other guard, tested apart).
    let health = "[routes.shrink.micro_batch.health]\neject_after = 1000";
    let gw = gateway(&policy("shrink", &rt.url(), &batch.url(), "", health)).await;
    let limit = || metric(&gw, "tiergate_batch_size_limit{route=\"shrink\"}");
    let (b, _) = body("first", 0, 1, false);
    assert_eq!(infer(gw.http_addr(), "m", &BATCH, &b).await.status, 200);
    assert_eq!(limit().await, 64.0, "max_batch to start with");
    // Five failed batches halve it five times.
    batch.sim.fail(true);
    for i in 0..5 {
        let (b, _) = body(&format!("f{i}"), i, 1, false);
        assert_eq!(infer(gw.http_addr(), "m", &BATCH, &b).await.status, 500);
    }
    assert_eq!(limit().await, 2.0);
    // Eight callers queue behind a busy slot. Its good batch grows the limit to 6 before
    // theirs is formed (when the slot frees): 6 go, then the other 2.
    let busy = occupy(&gw, &batch).await;
    batch.sim.fail(false);
    let mut callers = Vec::new();
    for i in 0..8u32 {
        let (b, data) = body(&format!("c{i}"), 10 + i, 1, false);
        callers.push((data, spawn_infer(gw.http_addr(), b)));
        queued(&gw, "shrink", u64::from(i) + 1).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for (data, call) in callers {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(fp32(&decode(&answer), "OUTPUT0"), data);
    }
    let sizes = batch.sim.stats("m").expect("stats").batch_sizes;
    assert_eq!(
        sizes,
        [(1, 2), (6, 1), (2, 1)].into(),
        "the first and the busy one, then as many as the limit allows"
    );
    // Each good batch adds back a sixteenth of max_batch: 64 again within 16 of them.
    let mut good = 3;
    while limit().await < 64.0 {
        let (b, _) = body(&format!("g{good}"), 100 + good, 1, false);
        assert_eq!(infer(gw.http_addr(), "m", &BATCH, &b).await.status, 200);
        good += 1;
        assert!(good <= 16, "grown back within 16 good batches");
    }
    gw.stop().await.expect("stops");
}

/// A KServe v2 JSON body of one row of 400 FP32 values (about 2.5 KB; 1.6 KB as a
/// binary tensor).
fn wide_row(id: &str) -> String {
    let data: Vec<String> = (0..400).map(|i| format!("{i}.5")).collect();
    format!(
        r#"{{"id":"{id}","inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,400],"data":[{}]}}]}}"#,
        data.join(",")
    )
}

/// `n` callers of [`wide_row`] queued behind the busy slot of route `name`, then
/// released; every caller's answer.
async fn wide_callers(gw: &Gateway, batch: &Backend, name: &str, n: u32) -> Vec<Answer> {
    let busy = occupy(gw, batch).await;
    let mut calls = Vec::new();
    for i in 1..=n {
        calls.push(spawn_infer(gw.http_addr(), wide_row(&format!("w{i}"))));
        queued(gw, name, u64::from(i)).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.expect("task"));
    }
    answers
}

#[tokio::test]
async fn a_batch_stays_under_max_batch_bytes_and_a_larger_request_goes_alone() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let one = wide_row("w1").len();
    let limit = 2 * one + one / 2;
    let extra = format!("max_batch_bytes = {limit}");
    let gw = gateway(&policy("bytes", &rt.url(), &batch.url(), "", &extra)).await;
    let answers = wide_callers(&gw, &batch, "bytes", 6).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some("2"),
            "two fit in the limit, three do not"
        );
    }
    let sizes = batch.sim.stats("m").expect("stats").batch_sizes;
    assert_eq!(sizes, [(1, 1), (2, 3)].into(), "{sizes:?}");
    // One request over the limit: sent alone, answered.
    let (b, _) = body(&"y".repeat(limit), 9, 1, false);
    let alone = infer(gw.http_addr(), "m", &BATCH, &b).await;
    assert_eq!(alone.status, 200, "{}", alone.text());
    assert_eq!(alone.header("x-tiergate-batch-size"), None, "sent alone");
}

#[tokio::test]
async fn a_batch_the_backend_refuses_as_too_large_is_split_and_later_ones_stay_under_half_of_it() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    // Room for two rows in a batch call, not three.
    batch.sim.limit_body(4000);
    let gw = gateway(&policy("learned", &rt.url(), &batch.url(), "", "")).await;
    let answers = wide_callers(&gw, &batch, "learned", 6).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "every caller answered: {}", answer.text());
    }
    let refused = batch.sim.refused_too_large();
    assert!(refused > 0, "the first batch was refused as too large");
    let answers = wide_callers(&gw, &batch, "learned", 4).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(
        batch.sim.refused_too_large(),
        refused,
        "no batch too large once it was learned"
    );
}
