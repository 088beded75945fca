//! Streamed completions merged on the micro-batch tier (`json_adapter =
//! "openai_completions"`), against the simulator's LLM. Callers' streams share one
//! backend stream; each caller is streamed only its own choices, indexed as its own,
//! with the text a stream of its own gets; a caller that leaves does not end its
//! batch-mates' streams, and once every caller has left, the backend's work is
//! cancelled.
//!
//! As in `micro_batch`, the batch pool's only slot is held so that callers queue behind
//! it (waiting for the queue-depth gauge, never for time), and then released.

use crate::common;
use crate::micro_batch::{completions_gateway as setup, occupy};

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tokio::task::JoinHandle;

/// A streamed completions body for `prompt`, asking for the usage chunk when `usage`.
fn body(prompt: &Value, max_tokens: u64, usage: bool) -> String {
    let mut body =
        json!({"model": "llm", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body.to_string()
}

const HEADERS: [(&str, &str); 2] = [("x-tiergate-budget-ms", "5000"), ("content-type", "application/json")];

/// Every event's data in a stream's text.
fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// The text streamed for each choice, by its index.
fn texts(events: &[String]) -> BTreeMap<u64, String> {
    let mut texts = BTreeMap::new();
    for chunk in events.iter().filter_map(|e| serde_json::from_str::<Value>(e).ok()) {
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            let index = choice["index"].as_u64().expect("index");
            let text: &mut String = texts.entry(index).or_default();
            text.push_str(choice["text"].as_str().unwrap_or(""));
        }
    }
    texts
}

fn spawn_stream(gw: &Gateway, body: String) -> JoinHandle<Answer> {
    let addr = gw.http_addr();
    tokio::spawn(async move { send("POST", addr, "/v1/completions", &HEADERS, body).await })
}

#[tokio::test]
async fn streamed_completions_share_one_backend_stream_and_each_caller_is_streamed_its_own_choices() {
    let (_rt, batch, gw) = setup("cmpl_streamed", "").await;
    let busy = occupy(&gw, &batch).await;
    let prompts = [json!("alpha beta"), json!(["gamma", "delta epsilon"]), json!("zeta")];
    let mut callers = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        // Only the first asks for the usage chunk; the others' is taken out.
        callers.push(spawn_stream(&gw, body(prompt, 6, i == 0)));
        queued(&gw, "cmpl_streamed", [1, 3, 4][i]).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let mut answers = Vec::new();
    for call in callers {
        answers.push(call.await.expect("task"));
    }
    let generations = batch.sim.llm_stats("llm").expect("stats").generations;
    assert_eq!(generations, 4, "one backend call generated the four prompts");
    for (i, (answer, prompt)) in answers.iter().zip(&prompts).enumerate() {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("content-type"), Some("text/event-stream"));
        assert_eq!(
            answer.header("x-tiergate-batch-size"),
            Some("4"),
            "one call for the four prompts"
        );
        let events = events(&answer.text());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        // The same prompt streamed alone, straight to the backend: the same choices.
        let alone = send(
            "POST",
            batch.addr,
            "/v1/completions",
            &[("content-type", "application/json")],
            body(prompt, 6, false),
        )
        .await;
        let own = texts(&events);
        assert_eq!(own, texts(&self::events(&alone.text())), "{prompt}");
        assert_eq!(own.len(), prompt.as_array().map_or(1, Vec::len), "its own choices only");
        let usage: Vec<Value> = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|v| v.get("usage").is_some())
            .collect();
        if i == 0 {
            assert_eq!(usage.len(), 1, "{events:?}");
            assert_eq!(usage[0]["choices"], json!([]));
            assert_eq!(
                usage[0]["usage"]["tiergate_estimated"], true,
                "a share of the batch's usage"
            );
            assert_eq!(
                usage[0]["usage"]["completion_tokens"], 6,
                "its tokens, by the chunks it was sent"
            );
        } else {
            assert!(usage.is_empty(), "a caller that did not ask sees no usage: {usage:?}");
        }
    }
    gw.stop().await.expect("stops");
}

/// A stream opened through the gateway at `addr`, read until its first content event.
async fn first_token(addr: std::net::SocketAddr, body: String) -> hyper::body::Incoming {
    let mut request = http::Request::post(format!("http://{addr}/v1/completions"));
    for (k, v) in HEADERS {
        request = request.header(k, v);
    }
    let request = request.body(Full::new(Bytes::from(body))).expect("request");
    let response = tokio::time::timeout(Duration::from_secs(10), client().request(request))
        .await
        .expect("a head within 10 s")
        .expect("exchange");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut held = Vec::new();
    while !texts(&events(&String::from_utf8_lossy(&held)))
        .values()
        .any(|t| !t.is_empty())
    {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event within 10 s")
            .expect("a frame before the end")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            held.extend_from_slice(&data);
        }
    }
    body
}

/// Waits until the batch backend's LLM counters satisfy `done`.
async fn llm_stats_until(batch: &Backend, done: impl Fn(&tiergate::sim::LlmStats) -> bool) {
    let wait = async {
        while !done(&batch.sim.llm_stats("llm").expect("stats")) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{:?}", batch.sim.llm_stats("llm")));
}

#[tokio::test]
async fn a_caller_leaving_never_ends_its_batch_mates_streams_and_all_leaving_cancels_the_work() {
    // One failure counted would eject the batch pool's endpoint: callers leaving must
    // count none.
    let health = "[routes.cmpl_leaving.micro_batch.health]\neject_after = 1\ncheck_path = \"\"\n";
    let (_rt, batch, gw) = setup("cmpl_leaving", health).await;
    let addr = gw.http_addr();
    // Three callers in one batch; the first leaves after its first token.
    let busy = occupy(&gw, &batch).await;
    let leaver = tokio::spawn(first_token(addr, body(&json!("one"), 300, false)));
    queued(&gw, "cmpl_leaving", 1).await;
    let mut staying = Vec::new();
    for (i, prompt) in ["two", "three"].into_iter().enumerate() {
        staying.push(spawn_stream(&gw, body(&json!(prompt), 300, false)));
        queued(&gw, "cmpl_leaving", 2 + i as u64).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    drop(leaver.await.expect("task"));
    for call in staying {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        let events = events(&answer.text());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        let texts = texts(&events);
        assert_eq!(texts.len(), 1);
        assert_eq!(texts[&0].split_whitespace().count(), 300, "every token, to the end");
    }
    // The batch's call ran to its end: the leaver's prompt could not be taken out of it.
    llm_stats_until(&batch, |s| s.completed == 3).await;
    assert_eq!(batch.sim.llm_stats("llm").expect("stats").cancelled, 0);

    // Two callers in one batch, both leaving after their first token: the backend's
    // stream is closed, and its work cancelled.
    let busy = occupy(&gw, &batch).await;
    let mut leavers = Vec::new();
    for (i, prompt) in ["four", "five"].into_iter().enumerate() {
        leavers.push(tokio::spawn(first_token(addr, body(&json!(prompt), 300, false))));
        queued(&gw, "cmpl_leaving", 1 + i as u64).await;
    }
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    for leaver in leavers {
        drop(leaver.await.expect("task"));
    }
    llm_stats_until(&batch, |s| s.cancelled == 2).await;
    assert_eq!(batch.sim.llm_stats("llm").expect("stats").completed, 3);
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        !scrape
            .lines()
            .any(|l| l.starts_with("tiergate_backend_ejections_total") && l.contains("cmpl_leaving")),
        "callers leaving ejected the endpoint"
    );
    gw.stop().await.expect("stops");
}
