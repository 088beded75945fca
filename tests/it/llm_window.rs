//! The batch pool's admission window for LLM calls, against the simulator's
//! continuous-batching engine (vLLM's admission and preemption): with the window the
//! engine never preempts where the same calls sent straight to it do; callers are
//! released in the pool's order (a critical call before sheddable ones that came
//! first); the window narrows on the engine's own signals and widens back; offline
//! lines drain through it.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::sim::{LlmProfile, ModelSpec};

/// An engine of `max_sequences` sequences and `kv_tokens` of KV cache, 2 ms a step.
async fn engine(max_sequences: usize, kv_tokens: u64) -> Backend {
    let profile = LlmProfile {
        a: Duration::from_millis(2),
        b: Duration::ZERO,
        prefill: Duration::from_micros(10),
        max_sequences,
        kv_tokens,
    };
    backend_with(vec![ModelSpec::llm("m", profile)]).await
}

/// Route `name` serving `m` from `url` on the micro-batch tier (and offline), its
/// batch pool's window set by `window`'s lines (each test its own route: the metrics
/// are the process's).
fn windowed(name: &str, url: &str, window: &str) -> String {
    format!(
        "[routes.{name}]\nmodels = [\"m\"]\npaths = [\"/v1/chat/completions\"]\nrealtime_below = \"50ms\"\n\
         [routes.{name}.flags]\nrealtime = false\nmicro_batch = true\noffline = true\n\
         [routes.{name}.micro_batch]\nendpoints = [\"{url}\"]\nmax_priority = \"critical\"\n\
         [routes.{name}.micro_batch.window]\n{window}"
    )
}

/// A streamed chat call of a 50-word prompt and `max_tokens`.
fn chat(max_tokens: u64) -> Value {
    json!({"model": "m", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "word ".repeat(50)}]})
}

async fn call(addr: SocketAddr, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("content-type", "application/json"), ("x-tiergate-budget-ms", "4000")];
    all.extend_from_slice(headers);
    send("POST", addr, "/v1/chat/completions", &all, body.to_string()).await
}

/// `n` calls at once to `addr`; their statuses.
async fn flood(addr: SocketAddr, n: usize, max_tokens: u64) -> Vec<u16> {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..n {
        calls.spawn(async move { call(addr, &chat(max_tokens), &[]).await.status });
    }
    calls.join_all().await
}

#[tokio::test]
async fn with_the_window_the_engine_never_preempts_where_the_same_calls_sent_straight_do() {
    // Each call holds 50 prompt tokens and grows to 150; eight of them fill 1,200
    // tokens of a 1,000-token cache. Sent straight, the engine lets all eight in (it
    // admits on what they hold now) and preempts as they grow.
    let straight = engine(8, 1000).await;
    let statuses = flood(straight.addr, 24, 100).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let preempted = straight.sim.llm_stats("m").expect("llm").preemptions;
    assert!(preempted > 0, "sent straight, the engine preempts");

    // Through the window (each call held at its prompt's estimate of 67 tokens and its
    // 100), at most five run at once, and the cache never overflows.
    let backend = engine(8, 1000).await;
    let gw = gateway(&windowed(
        "kv",
        &backend.url(),
        "max_sequences = 8\nmax_tokens_in_flight = 1000\n",
    ))
    .await;
    let statuses = flood(gw.http_addr(), 24, 100).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let stats = backend.sim.llm_stats("m").expect("llm");
    assert_eq!(stats.preemptions, 0, "{stats:?}");
    assert_eq!((stats.completed, stats.tokens), (24, 2400), "{stats:?}");
    assert!(stats.max_running <= 5 && stats.max_running >= 2, "{stats:?}");
    assert!(stats.max_reserved <= 1000, "{stats:?}");
    eventually(Duration::from_secs(5), "the window empties", || async {
        let series = "tiergate_window_in_flight{route=\"kv\",kind=\"sequences\"}";
        (metric(&gw, series).await == 0.0).then_some(())
    })
    .await;
    assert_eq!(
        metric(&gw, "tiergate_window_limit{route=\"kv\",kind=\"tokens\"}").await,
        1000.0
    );
    let preempted = backend.sim.llm_stats("m").expect("llm").preemptions;
    assert_eq!(preempted, 0, "{preempted} preemptions through the window");
}

#[tokio::test]
async fn the_window_releases_callers_in_the_pools_order() {
    // One sequence: a long call holds it while six sheddable calls and then one
    // critical call wait; the critical one is released first.
    let backend = engine(4, 100_000).await;
    let gw = gateway(&windowed("order", &backend.url(), "max_sequences = 1\n")).await;
    let addr = gw.http_addr();
    let first = tokio::spawn(async move { call(addr, &chat(400), &[]).await });
    let sim = backend.sim.clone();
    eventually(Duration::from_secs(5), "the first call runs", || {
        let sim = sim.clone();
        async move { (sim.llm_stats("m").expect("llm").running == 1).then_some(()) }
    })
    .await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiting = tokio::task::JoinSet::new();
    let mut sheddable = 0.0;
    for (name, band) in [
        ("s1", "sheddable"),
        ("s2", "sheddable"),
        ("s3", "sheddable"),
        ("c", "critical"),
    ] {
        let order = order.clone();
        waiting.spawn(async move {
            let answer = call(addr, &chat(5), &[("x-tiergate-priority", band)]).await;
            order.lock().expect("order").push(name);
            answer.status
        });
        // Each is queued before the next comes.
        let series =
            format!("tiergate_batch_priority_requests_total{{route=\"order\",priority=\"{band}\",outcome=\"queued\"}}");
        let expected = match band {
            "sheddable" => {
                sheddable += 1.0;
                sheddable
            }
            _ => 1.0,
        };
        eventually(Duration::from_secs(5), "the call waits", || async {
            (metric(&gw, &series).await == expected).then_some(())
        })
        .await;
    }
    assert_eq!(first.await.expect("first").status, 200);
    let statuses = waiting.join_all().await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let order = order.lock().expect("order").clone();
    assert_eq!(order.first(), Some(&"c"), "the critical call goes first: {order:?}");
    assert_eq!(&order[1..], ["s1", "s2", "s3"], "then the sheddable ones as they came");
}

#[tokio::test]
async fn the_window_narrows_on_the_engines_signals_and_widens_back() {
    // The window allows 16 sequences; the engine runs 2 and queues the rest, which
    // vLLM's `num_requests_waiting` says: the window halves until the engine stops
    // queueing, then grows back to 16 once the calls are done.
    let backend = engine(2, 100_000).await;
    let policy = windowed(
        "signals",
        &backend.url(),
        "max_sequences = 16\nsignals = \"vllm\"\nsignal_interval = \"100ms\"\n",
    );
    let gw = gateway(&policy).await;
    let addr = gw.http_addr();
    let flood = tokio::spawn(async move {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..40 {
            calls.spawn(async move { call(addr, &chat(60), &[]).await.status });
        }
        calls.join_all().await
    });
    let limit = "tiergate_window_limit{route=\"signals\",kind=\"sequences\"}";
    let narrowest = eventually(Duration::from_secs(20), "the window narrows", || async {
        let now = metric(&gw, limit).await;
        (now > 0.0 && now <= 4.0).then_some(now)
    })
    .await;
    let statuses = flood.await.expect("flood");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    eventually(Duration::from_secs(20), "the window widens back", || async {
        (metric(&gw, limit).await == 16.0).then_some(())
    })
    .await;
    let narrowed = "tiergate_window_adapted_total{route=\"signals\",direction=\"narrowed\"}";
    let widened = "tiergate_window_adapted_total{route=\"signals\",direction=\"widened\"}";
    assert!(metric(&gw, narrowed).await >= 2.0, "halved from 16 to {narrowest}");
    assert!(metric(&gw, widened).await >= 1.0);
}

#[tokio::test]
async fn offline_lines_drain_through_the_window() {
    let backend = engine(8, 100_000).await;
    let gw = gateway(&windowed("offline", &backend.url(), "max_sequences = 2\n")).await;
    let lines: Vec<String> = (0..12)
        .map(|i| {
            let mut body = chat(20);
            body["stream"] = json!(false);
            json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body})
                .to_string()
        })
        .collect();
    let batch = chat_batch_completed(gw.http_addr(), &lines).await;
    assert_eq!(batch["request_counts"]["completed"], 12, "{batch}");
    let stats = backend.sim.llm_stats("m").expect("llm");
    assert_eq!(stats.completed, 12, "{stats:?}");
    assert!(stats.max_running <= 2, "two sequences at most: {stats:?}");
}
