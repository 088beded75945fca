//! LLM streams through the HTTP door against the simulator's LLMs: events relayed as
//! they come (never held to the stream's end), routed by the body's `model`, the
//! usage chunk asked for and taken out again, the budget on the first token, a stall or
//! a malformed event cut with an error event in OpenAI's shape and counted against the
//! endpoint, a caller's `stream: true` never counted against it, and a caller that
//! leaves cancelling the backend's work.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tiergate::sim::{LlmProfile, ModelSpec, StreamFaults};

/// An LLM backend serving `models` with the `llm-tiny` profile (or `profile`).
async fn llm(models: &[&str], profile: Option<LlmProfile>) -> Backend {
    let profile = profile.unwrap_or_else(|| LlmProfile::named("llm-tiny").expect("profile"));
    backend_with(models.iter().map(|m| ModelSpec::llm(m, profile)).collect()).await
}

/// A route `name` serving `models` on OpenAI's chat and completions paths from `url`,
/// real time only unless `extra` says more.
fn llm_route(name: &str, models: &[&str], url: &str, extra: &str) -> String {
    let models: Vec<String> = models.iter().map(|m| format!("{m:?}")).collect();
    format!(
        "[routes.{name}]\nmodels = [{}]\npaths = [\"/v1/chat/completions\", \"/v1/completions\", \"/v1/responses\"]\n\
         [routes.{name}.realtime]\nendpoints = [\"{url}\"]\n{extra}",
        models.join(", ")
    )
}

fn chat(model: &str, stream: bool, max_tokens: u64) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "tell me about the gateway"}]})
}

/// A streamed call: the answer's head, and its body read frame by frame.
struct Streamed {
    head: http::response::Parts,
    body: hyper::body::Incoming,
}

async fn stream(addr: SocketAddr, body: &Value, headers: &[(&str, &str)]) -> Streamed {
    let mut request = http::Request::post(format!("http://{addr}/v1/chat/completions"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::from(body.to_string()))).expect("request");
    let response = tokio::time::timeout(Duration::from_secs(10), client().request(request))
        .await
        .expect("a head within 10 s")
        .expect("exchange");
    let (head, body) = response.into_parts();
    Streamed { head, body }
}

impl Streamed {
    /// The next event's data, within `within`; `None` at the end.
    async fn next(&mut self, within: Duration, held: &mut Vec<u8>) -> Option<String> {
        loop {
            if let Some(end) = held.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = held.drain(..end + 2).collect();
                let text = String::from_utf8(event).expect("text");
                let data = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Some(data);
            }
            let frame = tokio::time::timeout(within, self.body.frame())
                .await
                .expect("an event in time")?;
            if let Ok(data) = frame.expect("a frame").into_data() {
                held.extend_from_slice(&data);
            }
        }
    }

    /// Every event's data to the end.
    async fn all(mut self) -> Vec<String> {
        let mut held = Vec::new();
        let mut events = Vec::new();
        while let Some(event) = self.next(Duration::from_secs(10), &mut held).await {
            events.push(event);
        }
        events
    }
}

fn content(events: &[String]) -> String {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_stream_is_relayed_event_by_event_and_its_usage_counted_without_showing_it() {
    let be = llm(&["llama"], None).await;
    let gw = gateway(&llm_route("chat", &["llama"], &be.url(), "")).await;
    let events = stream(gw.http_addr(), &chat("llama", true, 6), &[("accept-encoding", "gzip")]).await;
    assert_eq!(events.head.status, 200);
    assert_eq!(events.head.headers["content-type"], "text/event-stream");
    assert!(
        events.head.headers.get("content-encoding").is_none(),
        "a stream is never compressed: no event is held back"
    );
    assert_eq!(events.head.headers["x-tiergate-tier"], "realtime");
    let events = events.all().await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(content(&events).split_whitespace().count(), 6, "{events:?}");
    assert!(
        !events.iter().any(|e| e.contains("\"usage\"")),
        "the usage chunk the gateway asked for is taken out: {events:?}"
    );
    let tokens = |kind: &str| format!("tiergate_tokens_total{{route=\"chat\",tier=\"realtime\",kind=\"{kind}\"}}");
    assert_eq!(
        metric(&gw, &tokens("completion")).await,
        6.0,
        "exact, from the backend's usage"
    );
    assert_eq!(metric(&gw, &tokens("prompt")).await, 5.0);
    // A caller that asks for the usage gets it.
    let mut asked = chat("llama", true, 2);
    asked["stream_options"] = json!({"include_usage": true});
    let events = stream(gw.http_addr(), &asked, &[]).await.all().await;
    let usage: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v.get("usage").is_some_and(|u| !u.is_null()))
        .collect();
    assert_eq!(usage.len(), 1, "{events:?}");
    assert_eq!(usage[0]["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn events_reach_the_client_while_the_stream_is_still_running() {
    let be = llm(&["llama"], None).await;
    be.sim.faulty_streams(StreamFaults {
        stall_after: 3,
        malformed_after: 0,
    });
    let gw = gateway(&llm_route("held", &["llama"], &be.url(), "")).await;
    let mut events = stream(gw.http_addr(), &chat("llama", true, 100), &[]).await;
    let mut held = Vec::new();
    // The role chunk and three tokens come, then the backend sends nothing more: had the
    // gateway held the stream to its end, none of them would have come.
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(events.next(Duration::from_secs(5), &mut held).await.expect("an event"));
    }
    assert_eq!(content(&got).split_whitespace().count(), 3, "{got:?}");
    drop(events);
    // The caller left: the backend sees its generation cancelled.
    let stats = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let stats = be.sim.llm_stats("llama").expect("stats");
            if stats.cancelled == 1 {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the cancellation reached the backend");
    assert_eq!(stats.tokens, 3);
}

#[tokio::test]
async fn a_caller_leaving_a_call_not_streamed_cancels_it_too() {
    let slow = LlmProfile {
        a: Duration::from_millis(50),
        ..LlmProfile::named("llm-tiny").expect("profile")
    };
    let be = llm(&["llama"], Some(slow)).await;
    let gw = gateway(&llm_route("whole", &["llama"], &be.url(), "")).await;
    let addr = gw.http_addr();
    let call = tokio::spawn(async move {
        send(
            "POST",
            addr,
            "/v1/chat/completions",
            &[],
            chat("llama", false, 1000).to_string(),
        )
        .await
    });
    let mut stats = be.sim.llm_stats("llama").expect("stats");
    while stats.tokens < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        stats = be.sim.llm_stats("llama").expect("stats");
    }
    call.abort();
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        while be.sim.llm_stats("llama").expect("stats").cancelled == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(cancelled.is_ok(), "the backend's generation was cancelled");
    assert!(be.sim.llm_stats("llama").expect("stats").tokens < 1000);
}

#[tokio::test]
async fn a_stream_that_stalls_or_breaks_ends_with_an_error_event_and_counts_against_the_endpoint() {
    let be = llm(&["llama"], None).await;
    let extra = "[routes.faulty.realtime.health]\neject_after = 1\neject_for = \"1m\"\ncheck_path = \"\"\n";
    let route = llm_route("faulty", &["llama"], &be.url(), extra).replace(
        "[routes.faulty.realtime]",
        "stream_idle_timeout = \"1s\"\n[routes.faulty.realtime]",
    );
    let gw = gateway(&route).await;
    // A caller's stream: true never counts against the endpoint.
    for _ in 0..3 {
        let events = stream(gw.http_addr(), &chat("llama", true, 2), &[]).await.all().await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    }
    let circuit = format!(
        "tiergate_backend_circuit_state{{route=\"faulty\",tier=\"realtime\",endpoint=\"{}\"}}",
        be.addr
    );
    assert_eq!(metric(&gw, &circuit).await, 0.0, "three streams: the endpoint stays in");
    be.sim.faulty_streams(StreamFaults {
        stall_after: 2,
        malformed_after: 0,
    });
    let events = stream(gw.http_addr(), &chat("llama", true, 50), &[]).await.all().await;
    let last: Value = serde_json::from_str(events.last().expect("events")).expect("an error event");
    assert_eq!(last["error"]["code"], "stream_idle", "{events:?}");
    assert_eq!(metric(&gw, &circuit).await, 1.0, "the stall ejected the endpoint");
    let ended = "tiergate_streams_ended_total{route=\"faulty\",tier=\"realtime\",reason=\"idle\"}";
    assert_eq!(metric(&gw, ended).await, 1.0);
    // A malformed event, on another gateway in front of the same backend.
    be.sim.faulty_streams(StreamFaults {
        stall_after: 0,
        malformed_after: 1,
    });
    let gw = gateway(&llm_route("broken", &["llama"], &be.url(), "")).await;
    let events = stream(gw.http_addr(), &chat("llama", true, 50), &[]).await.all().await;
    let last: Value = serde_json::from_str(events.last().expect("events")).expect("an error event");
    assert_eq!(last["error"]["code"], "malformed_event", "{events:?}");
    assert!(
        !events.iter().any(|e| e.contains("oops")),
        "the malformed event is not passed on"
    );
}

#[tokio::test]
async fn a_streams_budget_is_its_first_token() {
    let slow = LlmProfile {
        a: Duration::from_millis(300),
        ..LlmProfile::named("llm-tiny").expect("profile")
    };
    let be = llm(&["llama"], Some(slow)).await;
    let gw = gateway(&llm_route("ttft", &["llama"], &be.url(), "")).await;
    // 100 ms to a first token that takes 300: the head comes, then the error event.
    let events = stream(
        gw.http_addr(),
        &chat("llama", true, 5),
        &[("x-tiergate-budget-ms", "100")],
    )
    .await;
    let events = events.all().await;
    let last: Value = serde_json::from_str(events.last().expect("events")).expect("an error event");
    assert_eq!(last["error"]["code"], "deadline", "{events:?}");
    // 2 s to the first token, far less than the whole stream takes: served whole.
    let events = stream(
        gw.http_addr(),
        &chat("llama", true, 8),
        &[("x-tiergate-budget-ms", "1000")],
    )
    .await;
    let events = events.all().await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    assert_eq!(
        content(&events).split_whitespace().count(),
        8,
        "8 tokens, 2.4 s: past the budget, served"
    );
}

#[tokio::test]
async fn routes_share_a_path_by_model_and_an_unknown_model_gets_404() {
    let (a, b) = (llm(&["llama"], None).await, llm(&["mistral"], None).await);
    let policy = format!(
        "{}\n{}",
        llm_route("small", &["llama"], &a.url(), ""),
        llm_route("large", &["mistral"], &b.url(), "")
    );
    let gw = gateway(&policy).await;
    for (model, backend) in [("llama", &a), ("mistral", &b)] {
        let answer = send(
            "POST",
            gw.http_addr(),
            "/v1/chat/completions",
            &[],
            chat(model, false, 3).to_string(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["model"], model);
        assert_eq!(backend.sim.llm_stats(model).expect("stats").completed, 1);
    }
    let unknown = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &[],
        chat("gpt-9", false, 3).to_string(),
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "model_not_found");
    let models = get(gw.http_addr(), "/v1/models").await;
    let ids: Vec<String> = models.json()["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        ids,
        vec!["mistral", "llama"],
        "in the policy's order (routes by file, then name)"
    );
}

#[tokio::test]
async fn a_stream_on_the_micro_batch_tier_is_relayed_and_one_offline_is_refused() {
    let be = llm(&["llama"], None).await;
    let policy = format!(
        "[routes.mb]\nmodels = [\"llama\"]\npaths = [\"/v1/chat/completions\"]\nrealtime_below = \"50ms\"\n\
         [routes.mb.flags]\nrealtime = false\nmicro_batch = true\noffline = true\n\
         [routes.mb.micro_batch]\nendpoints = [\"{}\"]\n",
        be.url()
    );
    let gw = gateway(&policy).await;
    let events = stream(
        gw.http_addr(),
        &chat("llama", true, 4),
        &[("x-tiergate-budget-ms", "2000")],
    )
    .await;
    assert_eq!(events.head.headers["x-tiergate-tier"], "micro_batch");
    let events = events.all().await;
    assert_eq!(content(&events).split_whitespace().count(), 4, "{events:?}");
    let offline = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &[("prefer", "respond-async")],
        chat("llama", true, 4).to_string(),
    )
    .await;
    assert_eq!(offline.status, 400, "{}", offline.text());
    assert!(
        offline.text().contains("cannot be served offline"),
        "{}",
        offline.text()
    );
}

#[tokio::test]
async fn a_stream_sent_alone_on_the_batch_pool_holds_its_slot_to_its_last_event() {
    let be = llm(&["llama"], None).await;
    let policy = format!(
        "[routes.mbs]\nmodels = [\"llama\"]\npaths = [\"/v1/chat/completions\"]\nrealtime_below = \"50ms\"\n\
         [routes.mbs.flags]\nrealtime = false\nmicro_batch = true\n\
         [routes.mbs.micro_batch]\nendpoints = [\"{}\"]\nmax_in_flight = 1\n",
        be.url()
    );
    let gw = gateway(&policy).await;
    let budget = [("x-tiergate-budget-ms", "5000")];
    let first = stream(gw.http_addr(), &chat("llama", true, 200), &budget).await;
    assert_eq!(first.head.status, 200);
    // The first stream's head came: it runs. The second waits for the pool's one slot.
    let addr = gw.http_addr();
    let second = tokio::spawn(async move { stream(addr, &chat("llama", true, 4), &budget).await.all().await });
    let events = first.all().await;
    assert_eq!(content(&events).split_whitespace().count(), 200, "{events:?}");
    let events = second.await.expect("task");
    assert_eq!(content(&events).split_whitespace().count(), 4, "{events:?}");
    let stats = be.sim.llm_stats("llama").expect("stats");
    assert_eq!(
        (stats.completed, stats.max_running),
        (2, 1),
        "the second was sent once the first stream had ended"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn service_tier_is_a_hint_within_the_routes_flags_and_the_answer_says_the_tier() {
    let (rt, batch) = (llm(&["llama"], None).await, llm(&["llama"], None).await);
    let policy = format!(
        "[routes.tiers]\nmodels = [\"llama\"]\npaths = [\"/v1/chat/completions\"]\n\
         [routes.tiers.flags]\nmicro_batch = true\n[routes.tiers.realtime]\nendpoints = [\"{}\"]\n[routes.tiers.micro_batch]\nendpoints = [\"{}\"]\n",
        rt.url(),
        batch.url()
    );
    let gw = gateway(&policy).await;
    let call = |tier: Option<&str>, budget: &'static str| {
        let mut body = chat("llama", false, 2);
        if let Some(tier) = tier {
            body["service_tier"] = json!(tier);
        }
        let addr = gw.http_addr();
        async move {
            send(
                "POST",
                addr,
                "/v1/chat/completions",
                &[("x-tiergate-budget-ms", budget)],
                body.to_string(),
            )
            .await
        }
    };
    let plain = call(None, "100").await;
    assert_eq!(
        (plain.tier(), plain.json()["service_tier"].as_str()),
        ((Some("realtime"), Some("budget_realtime")), Some("default"))
    );
    let flex = call(Some("flex"), "100").await;
    assert_eq!(flex.status, 200, "{}", flex.text());
    assert_eq!(
        (flex.tier(), flex.json()["service_tier"].as_str()),
        ((Some("micro_batch"), Some("service_tier")), Some("flex"))
    );
    let priority = call(Some("priority"), "2000").await;
    assert_eq!(priority.tier(), (Some("realtime"), Some("service_tier")));
    assert_eq!(
        call(Some("auto"), "2000").await.tier().0,
        Some("micro_batch"),
        "auto follows the budget"
    );
    let wrong = call(Some("turbo"), "100").await;
    assert_eq!(wrong.status, 400, "{}", wrong.text());
    assert!(wrong.text().contains("service_tier"), "{}", wrong.text());
    let tokens = "tiergate_tokens_total{route=\"tiers\",tier=\"micro_batch\",kind=\"completion\"}";
    assert_eq!(
        metric(&gw, tokens).await,
        4.0,
        "whole answers' usage counted: flex and auto, 2 each"
    );
}

#[tokio::test]
async fn tritons_generate_and_generate_stream_are_served_on_the_models_route() {
    let be = llm(&["llama"], None).await;
    let gw = gateway(&format!(
        "[routes.gen]\nmodels = [\"llama\"]\n[routes.gen.realtime]\nendpoints = [\"{}\"]\n",
        be.url()
    ))
    .await;
    let body = json!({"text_input": "what is a gateway", "max_tokens": 3}).to_string();
    let whole = send("POST", gw.http_addr(), "/v2/models/llama/generate", &[], body.clone()).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(
        whole.json()["text_output"]
            .as_str()
            .map(|t| t.split_whitespace().count()),
        Some(3)
    );
    let mut request = http::Request::post(format!("http://{}/v2/models/llama/generate_stream", gw.http_addr()));
    request = request.header("content-type", "application/json");
    let request = request.body(Full::new(Bytes::from(body))).expect("request");
    let response = client().request(request).await.expect("exchange");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (head, body) = response.into_parts();
    let events = Streamed { head, body }.all().await;
    let words: Vec<String> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["text_output"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(words.len(), 3, "{events:?}");
}

#[tokio::test]
async fn batch_api_chat_lines_are_routed_by_model_and_a_streamed_line_fails_alone() {
    let (a, b) = (llm(&["llama"], None).await, llm(&["mistral"], None).await);
    let route = |name: &str, model: &str, url: &str| {
        format!(
            "[routes.{name}]\nmodels = [\"{model}\"]\npaths = [\"/v1/chat/completions\"]\n\
             [routes.{name}.flags]\noffline = true\n[routes.{name}.realtime]\nendpoints = [\"{url}\"]\n\
             [routes.{name}.micro_batch]\nendpoints = [\"{url}\"]\n"
        )
    };
    let gw = gateway(&format!(
        "{}{}",
        route("small", "llama", &a.url()),
        route("large", "mistral", &b.url())
    ))
    .await;
    let line = |id: &str, model: &str, stream: bool| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": chat(model, stream, 3)})
            .to_string()
    };
    let id = |answer: &Answer| answer.json()["id"].as_str().expect("id").to_owned();
    let create = |file: String| {
        let body = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        let addr = gw.http_addr();
        async move {
            send(
                "POST",
                addr,
                "/v1/batches",
                &[("content-type", "application/json")],
                body.to_string(),
            )
            .await
        }
    };
    let done = |batch: String| {
        let addr = gw.http_addr();
        async move {
            eventually(Duration::from_secs(20), "the batch completes", || async {
                let batch = get(addr, &format!("/v1/batches/{batch}")).await.json();
                (batch["status"] == "completed").then_some(batch)
            })
            .await
        }
    };
    let with_stream = [line("a", "llama", false), line("s", "llama", true)].join("\n");
    let file = upload_file(gw.http_addr(), &with_stream, &[]).await;
    let created = create(id(&file)).await;
    assert_eq!(created.status, 200, "{}", created.text());
    let batch = done(id(&created)).await;
    assert_eq!(
        batch["request_counts"],
        json!({"total": 2, "completed": 1, "failed": 1}),
        "the stream line fails alone"
    );
    let errors = get(
        gw.http_addr(),
        &format!("/v1/files/{}/content", batch["error_file_id"].as_str().expect("errors")),
    )
    .await;
    assert!(errors.text().contains("stream is not supported"), "{}", errors.text());
    let good = [
        line("a", "llama", false),
        line("b", "mistral", false),
        line("c", "llama", false),
    ]
    .join("\n");
    let file = upload_file(gw.http_addr(), &good, &[]).await;
    let created = create(id(&file)).await;
    assert_eq!(created.status, 200, "{}", created.text());
    let done = done(id(&created)).await;
    assert_eq!(done["request_counts"]["completed"], 3);
    let (input, output) = (&done["usage"]["input_tokens"], &done["usage"]["output_tokens"]);
    assert_eq!(output, 9, "the batch's usage adds its lines' up: {done}");
    assert!(input.as_u64().is_some_and(|n| n > 0), "{done}");
    assert_eq!(done["usage"]["total_tokens"], input.as_u64().unwrap_or(0) + 9);
    let out = get(
        gw.http_addr(),
        &format!("/v1/files/{}/content", done["output_file_id"].as_str().expect("file")),
    )
    .await;
    for l in out.text().lines() {
        let v: Value = serde_json::from_str(l).expect("JSONL");
        let answer = &v["response"]["body"];
        assert_eq!(
            answer["usage"]["completion_tokens"], 3,
            "the backend's usage is in the line: {v}"
        );
        let model = if v["custom_id"] == "b" { "mistral" } else { "llama" };
        assert_eq!(answer["model"], model, "{v}");
    }
    assert_eq!(
        a.sim.llm_stats("llama").expect("stats").completed,
        3,
        "one line before, two now"
    );
    assert_eq!(b.sim.llm_stats("mistral").expect("stats").completed, 1);
}

/// An OpenAI-compatible endpoint on loopback that answers every chat call with a
/// stream, written as fast as its caller takes it: events of content (model `big`: 2 MiB; else 64 KiB), up to 1,000; with the count of streams
/// whose caller went away before the end.
async fn flooding() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut = std::sync::Arc::new(AtomicU64::new(0));
    let counted = cut.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let cut = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let Some(len) = read_request(&mut conn, &mut buf).await else {
                    return;
                };
                let big = String::from_utf8_lossy(&buf[..len]).contains("\"big\"");
                let content = "x".repeat(if big { 2 << 20 } else { 64 << 10 });
                let event = format!(
                    "data: {}\n\n",
                    json!({"choices": [{"index": 0, "delta": {"content": content}}]})
                );
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..1000 {
                    if conn.write_all(chunk.as_bytes()).await.is_err() {
                        cut.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
                let _ = conn.write_all(b"1a\r\ndata: [DONE]\n\n\r\n0\r\n\r\n").await;
            });
        }
    });
    (addr, cut)
}

#[tokio::test]
async fn an_event_too_big_or_a_reader_too_slow_ends_the_stream() {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, cut) = flooding().await;
    let mut cfg = config();
    cfg.limits.min_send_rate = 1 << 20;
    let extra = "[routes.flood.realtime.health]\neject_after = 0\ncheck_path = \"\"\n";
    let gw = gateway_with(
        cfg,
        &llm_route("flood", &["big", "flood"], &format!("http://{addr}"), extra),
    )
    .await;
    // An event of 2 MiB, over limits.max_stream_event_bytes (1 MiB): an error event.
    let events = stream(gw.http_addr(), &chat("big", true, 1), &[]).await.all().await;
    assert_eq!(events.len(), 1, "nothing but the error event");
    let error: Value = serde_json::from_str(&events[0]).expect("an error event");
    assert_eq!(error["error"]["code"], "event_too_big", "{error}");
    let too_big = "tiergate_streams_ended_total{route=\"flood\",tier=\"realtime\",reason=\"event_too_big\"}";
    assert_eq!(metric(&gw, too_big).await, 1.0);
    // A caller that asks for a stream of 64 MiB and reads nothing: cut once it is below
    // 1 MiB/s over a window (10 s); the backend's connection goes with it.
    let mut stalled = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
    let body = chat("flood", true, 1).to_string();
    let ask = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled.write_all(ask.as_bytes()).await.expect("ask");
    let slow = "tiergate_streams_ended_total{route=\"flood\",tier=\"realtime\",reason=\"slow_reader\"}";
    eventually(Duration::from_secs(40), "the stalled reader's stream ends", || async {
        (metric(&gw, slow).await >= 1.0).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the backend sees its stream dropped",
        || async { (cut.load(Ordering::SeqCst) >= 1).then_some(()) },
    )
    .await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is closed");
    assert!(rest.len() < 64 << 20, "the client never got the whole stream");
    assert_eq!(
        metric(&gw, "tiergate_streams_open{route=\"flood\",tier=\"realtime\"}").await,
        0.0
    );
    // A backend that sends no usage: what it sent until the cut counted from its
    // content events, marked estimated.
    let estimated = "tiergate_tokens_total{route=\"flood\",tier=\"realtime\",kind=\"completion_estimated\"}";
    assert!(metric(&gw, estimated).await >= 1.0);
}

#[tokio::test]
async fn tokens_reach_the_usage_ledger_by_tenant_and_a_whole_answer_says_them_in_server_timing() {
    const TOKEN: &str = "streams-admin-token";
    let be = llm(&["llama"], None).await;
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join("llm.toml"),
        llm_route("ledger", &["llama"], &be.url(), ""),
    )
    .expect("policy");
    let (gw, _config) = admin_gateway(dir.path(), TOKEN).await;
    let events = stream(gw.http_addr(), &chat("llama", true, 6), &[("x-api-key", "acme")]).await;
    assert_eq!(events.all().await.last().map(String::as_str), Some("[DONE]"));
    let whole = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &[("content-type", "application/json"), ("x-api-key", "beta")],
        chat("llama", false, 4).to_string(),
    )
    .await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    let timing = whole.header("server-timing").expect("server-timing").to_owned();
    assert!(
        timing.ends_with("prompt_tokens;desc=5, completion_tokens;desc=4"),
        "{timing}"
    );
    let answer = admin_call(&gw, TOKEN, ("GET", "/admin/usage?by=tenant"), &[], "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = answer.json();
    let tenant = |name: &str| {
        report["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|l| l["tenant"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tenant {name} in {report:#}"))
    };
    let (acme, beta) = (tenant("acme"), tenant("beta"));
    assert_eq!(
        (&acme["prompt_tokens"], &acme["completion_tokens"]),
        (&json!(5), &json!(6))
    );
    assert_eq!(
        (&beta["prompt_tokens"], &beta["completion_tokens"]),
        (&json!(5), &json!(4))
    );
    assert_eq!(acme["estimated_tokens"], 0, "the backend's own usage: exact");
    assert_eq!(report["total"]["completion_tokens"], 10);
    // The pool learned its endpoint's time to first token and per token after it.
    let backends = admin_call(&gw, TOKEN, ("GET", "/admin/backends"), &[], "").await.json();
    let endpoint = &backends["pools"][0]["endpoints"][0];
    let ms = |key: &str| {
        endpoint[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} in {backends:#}"))
    };
    assert!(ms("first_token_ms") > 0.0 && ms("per_token_ms") > 0.0, "{endpoint}");
}

/// An OpenAI-compatible endpoint on loopback (not the simulator) that answers every
/// call with a stream of 5 chat chunks `gap` apart, then `[DONE]`.
async fn sse(gap: Duration) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(len) = read_request(&mut conn, &mut buf).await {
                    buf.drain(..len);
                    let head =
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for i in 0..6 {
                        tokio::time::sleep(gap).await;
                        let data = match i {
                            5 => "[DONE]".to_owned(),
                            i => json!({"choices": [{"index": 0, "delta": {"content": format!("w{i} ")}}]}).to_string(),
                        };
                        let event = format!("data: {data}\n\n");
                        if conn
                            .write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    if conn.write_all(b"0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn any_sse_backend_streams_on_both_tiers_and_streams_never_eject_it() {
    let (slow, fast) = (
        sse(Duration::from_millis(200)).await,
        sse(Duration::from_millis(20)).await,
    );
    let policy = |addr: SocketAddr| {
        format!(
        "[routes.plain]\npaths = [\"/v1/chat/completions\"]\n[routes.plain.flags]\nmicro_batch = true\n\
         [routes.plain.realtime]\nendpoints = [\"http://{addr}\"]\n[routes.plain.realtime.health]\neject_after = 3\n\
         [routes.plain.micro_batch]\nendpoints = [\"http://{addr}\"]\n[routes.plain.micro_batch.health]\neject_after = 3\n"
    )
    };
    // Three streams of different inputs a tier, each under a budget that covers the
    // first event (200 ms) but not the whole stream (1.2 s).
    let gw = gateway(&policy(slow)).await;
    for budget in ["250", "2000"] {
        for n in 0..3 {
            let sent = std::time::Instant::now();
            let mut events = stream(
                gw.http_addr(),
                &chat("any", true, 5 + n),
                &[("x-tiergate-budget-ms", budget)],
            )
            .await;
            assert_eq!(events.head.status, 200, "budget {budget}");
            let mut held = Vec::new();
            let first = events
                .next(Duration::from_secs(5), &mut held)
                .await
                .expect("a first event");
            assert!(first.contains("w0"), "{first}");
            let at = sent.elapsed();
            assert!(
                at < Duration::from_millis(700),
                "the first event came at {at:?}, not held to the end (1.2 s)"
            );
            let mut rest = vec![first];
            while let Some(event) = events.next(Duration::from_secs(5), &mut held).await {
                rest.push(event);
            }
            assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "{rest:?}");
        }
    }
    let circuit = |tier: &str, addr: SocketAddr| {
        format!("tiergate_backend_circuit_state{{route=\"plain\",tier=\"{tier}\",endpoint=\"{addr}\"}}")
    };
    for tier in ["realtime", "micro_batch"] {
        assert_eq!(
            metric(&gw, &circuit(tier, slow)).await,
            0.0,
            "three streams on {tier}: the endpoint stays in"
        );
    }
    // A stream short enough to end within the budget: never taken for a broken answer.
    let gw = gateway(&policy(fast)).await;
    for n in 0..3 {
        let events = stream(
            gw.http_addr(),
            &chat("any", true, 5 + n),
            &[("x-tiergate-budget-ms", "250")],
        )
        .await;
        assert_eq!(events.head.status, 200);
        assert_eq!(events.all().await.last().map(String::as_str), Some("[DONE]"));
    }
    assert_eq!(
        metric(&gw, &circuit("realtime", fast)).await,
        0.0,
        "the endpoint stays in"
    );
}

#[tokio::test]
async fn a_first_token_budget_below_the_pools_learned_time_to_first_token_is_refused_unsent() {
    let slow = LlmProfile {
        a: Duration::from_millis(40),
        ..LlmProfile::named("llm-tiny").expect("profile")
    };
    let be = llm(&["llama"], Some(slow)).await;
    let gw = gateway(&llm_route("learned", &["llama"], &be.url(), "")).await;
    // Twenty streams teach the pool its time to first token (40 to 80 ms here).
    for _ in 0..20 {
        let events = stream(
            gw.http_addr(),
            &chat("llama", true, 1),
            &[("x-tiergate-budget-ms", "250")],
        )
        .await;
        assert_eq!(events.all().await.last().map(String::as_str), Some("[DONE]"));
    }
    let asked = be.sim.llm_stats("llama").expect("stats").generations;
    let refused = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &[("content-type", "application/json"), ("x-tiergate-budget-ms", "15")],
        chat("llama", true, 1).to_string(),
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("deadline unmeetable"), "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        be.sim.llm_stats("llama").expect("stats").generations,
        asked,
        "nothing was sent"
    );
}

#[tokio::test]
async fn a_failure_before_the_first_event_goes_to_another_endpoint() {
    let (down, up) = (llm(&["llama"], None).await, llm(&["llama"], None).await);
    down.sim.unavailable(true);
    let policy = format!(
        "[routes.again]\nmodels = [\"llama\"]\npaths = [\"/v1/chat/completions\"]\n[routes.again.realtime]\n\
         endpoints = [\"{}\", \"{}\"]\n[routes.again.realtime.health]\neject_after = 0\ncheck_path = \"\"\n",
        down.url(),
        up.url()
    );
    let gw = gateway(&policy).await;
    let retried = "tiergate_backend_retries_total{route=\"again\",tier=\"realtime\",reason=\"unavailable\"}";
    // Streams until one has met the endpoint that is down (which one a call meets first
    // is the pool's choice), each read whole from the one up.
    let mut sent = 0;
    while sent < 6 || metric(&gw, retried).await < 1.0 {
        assert!(sent < 60, "no stream met the endpoint that is down in {sent}");
        let events = stream(gw.http_addr(), &chat("llama", true, 3), &[]).await;
        assert_eq!(events.head.status, 200);
        let events = events.all().await;
        assert_eq!(content(&events).split_whitespace().count(), 3, "{events:?}");
        sent += 1;
    }
    assert_eq!(
        up.sim.llm_stats("llama").expect("stats").completed,
        sent,
        "every stream served by the one up, the ones that met the one down sent again"
    );
}

#[tokio::test]
async fn an_llm_call_sent_respond_async_is_answered_later_with_its_usage() {
    let be = llm(&["llama"], None).await;
    let policy = format!(
        "[routes.later]\nmodels = [\"llama\"]\npaths = [\"/v1/chat/completions\"]\n[routes.later.flags]\noffline = true\n\
         [routes.later.realtime]\nendpoints = [\"{0}\"]\n[routes.later.micro_batch]\nendpoints = [\"{0}\"]\n",
        be.url()
    );
    let gw = gateway(&policy).await;
    let accepted = send(
        "POST",
        gw.http_addr(),
        "/v1/chat/completions",
        &[("content-type", "application/json"), ("prefer", "respond-async")],
        chat("llama", false, 4).to_string(),
    )
    .await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let job = accepted.header("location").expect("location").to_owned();
    let answer = eventually(Duration::from_secs(20), "the job is answered", || async {
        let got = get(gw.http_addr(), &job).await;
        (got.status == 200).then_some(got)
    })
    .await;
    let body = answer.json();
    assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");
    assert_eq!(body["object"], "chat.completion");
    let offline = "tiergate_tokens_total{route=\"later\",tier=\"offline\",kind=\"completion\"}";
    assert_eq!(metric(&gw, offline).await, 4.0, "counted when the job ran");
}

#[tokio::test]
async fn over_http2_events_come_as_they_are_made_and_a_reset_stream_cancels_the_work() {
    let paced = LlmProfile {
        a: Duration::from_millis(25),
        ..LlmProfile::named("llm-tiny").expect("profile")
    };
    let be = llm(&["llama"], Some(paced)).await;
    let gw = gateway(&llm_route("h2", &["llama"], &be.url(), "")).await;
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let ask = |tokens: u64| {
        http::Request::post(format!("http://{}/v1/chat/completions", gw.http_addr()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat("llama", true, tokens).to_string())))
            .expect("request")
    };
    // Ten tokens 25 ms apart: the first comes long before the last.
    let answer = h2.request(ask(10)).await.expect("answered over HTTP/2");
    assert_eq!(answer.version(), http::Version::HTTP_2);
    assert_eq!(answer.headers()["content-type"], "text/event-stream");
    let (head, body) = answer.into_parts();
    let mut events = Streamed { head, body };
    let (mut held, mut arrivals) = (Vec::new(), Vec::new());
    while let Some(event) = events.next(Duration::from_secs(5), &mut held).await {
        if event.contains("\"content\":\"") && !event.contains("\"content\":\"\"") {
            arrivals.push(std::time::Instant::now());
        }
    }
    assert_eq!(arrivals.len(), 10);
    assert!(arrivals[9] - arrivals[0] > Duration::from_millis(150), "{arrivals:?}");
    // A stream of 4,000 tokens (100 s) whose caller resets it after a few events.
    let mut body = h2.request(ask(4000)).await.expect("a long one").into_body();
    let mut read = 0;
    while read < 3 {
        if body.frame().await.expect("more").expect("a frame").is_data() {
            read += 1;
        }
    }
    drop(body);
    eventually(
        Duration::from_secs(10),
        "the backend's generation is cancelled",
        || async { (be.sim.llm_stats("llama").expect("stats").cancelled >= 1).then_some(()) },
    )
    .await;
    let gone = "tiergate_streams_ended_total{route=\"h2\",tier=\"realtime\",reason=\"client_gone\"}";
    assert_eq!(metric(&gw, gone).await, 1.0);
}
