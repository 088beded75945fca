//! The batch pool's admission window for LLM calls, against the simulator's
//! continuous-batching engine (vLLM's admission and preemption): with the window the
//! engine never preempts where the same calls sent straight to it do; callers are
//! released in the pool's order (a critical call before sheddable ones that came
//! first); the window narrows on the engine's own signals and widens back; offline
//! lines drain through it; on a pool the real-time tier shares, batch work is held back
//! for interactive streams (those whose first token never came too) and let in a
//! sequence at a time before the first interactive call.

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
        max_batched_tokens: u64::MAX,
        long_prefill_tokens: u64::MAX,
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

/// Route `name` serving `m` from `url` on the real-time tier and, through a window set
/// by `window`'s lines, on the micro-batch tier and offline: one pool both tiers share.
fn shared(name: &str, url: &str, window: &str) -> String {
    format!(
        "[routes.{name}]\nmodels = [\"m\"]\npaths = [\"/v1/chat/completions\"]\nrealtime_below = \"300ms\"\n\
         [routes.{name}.flags]\nrealtime = true\nmicro_batch = true\noffline = true\n\
         [routes.{name}.realtime]\nendpoints = [\"{url}\"]\n\
         [routes.{name}.micro_batch]\nendpoints = [\"{url}\"]\n[routes.{name}.micro_batch.window]\n{window}"
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

/// `n` Batch API lines, each a chat call asking for `max_tokens` tokens.
fn bulk_lines(n: usize, max_tokens: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "bulk"}]}})
            .to_string()
        })
        .collect()
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

/// The time a streamed chat call of `max_tokens` on the real-time tier (a 250 ms
/// budget) takes to its first token, seen by its caller.
async fn first_token(addr: SocketAddr, max_tokens: u64) -> Duration {
    use http_body_util::BodyExt;
    let body = json!({"model": "m", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]});
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-tiergate-budget-ms", "250")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    let sent = tokio::time::Instant::now();
    let response = client().request(request).await.expect("exchange");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut seen = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            seen.extend_from_slice(&data);
            // The first chunk with text in its `content` (not the role's empty one).
            let text = String::from_utf8_lossy(&seen).into_owned();
            if text.split("\"content\":\"").skip(1).any(|rest| !rest.starts_with('"')) {
                let took = sent.elapsed();
                while body.frame().await.is_some() {}
                return took;
            }
        }
    }
    panic!("no token in {}", String::from_utf8_lossy(&seen))
}

/// Interactive streams' median time to first token on a pool whose batch pool is the
/// same engine (two sequences), while offline lines of 60 tokens each flow through
/// its window, held back above `interactive_ttft`; and how many times it held back.
async fn shared_pool(name: &str, interactive_ttft: &str) -> (Duration, f64) {
    let backend = engine(2, 100_000).await;
    let window = format!("max_sequences = 2\nsignal_interval = \"100ms\"\ninteractive_ttft = \"{interactive_ttft}\"\n");
    let policy = shared(name, &backend.url(), &window);
    let gw = gateway(&policy).await;
    let lines = bulk_lines(60, 60);
    let addr = gw.http_addr();
    let batch = tokio::spawn(async move { chat_batch_completed(addr, &lines).await });
    let sim = backend.sim.clone();
    eventually(Duration::from_secs(10), "the batch fills the engine", || {
        let sim = sim.clone();
        async move { (sim.llm_stats("m").expect("llm").running == 2).then_some(()) }
    })
    .await;
    let mut took = Vec::new();
    for _ in 0..20 {
        took.push(first_token(addr, 2).await);
        tokio::time::sleep(Duration::from_millis(20)).await; // a person's pace, not a flood
    }
    let batch = batch.await.expect("batch");
    assert_eq!(
        batch["request_counts"]["completed"], 60,
        "the batch still completes: {batch}"
    );
    took.sort();
    let series = format!("tiergate_window_adapted_total{{route=\"{name}\",direction=\"held_back\"}}");
    (took[took.len() / 2], metric(&gw, &series).await)
}

#[tokio::test]
async fn on_a_shared_pool_batch_work_is_held_back_for_interactive_streams() {
    // Held to a target no stream misses, the window lets batch work fill both of the
    // engine's sequences, and an interactive stream waits for one to end (60 tokens
    // at 2 ms). Held to 20 ms, the window holds batch work back and leaves room.
    let (ignored, never) = shared_pool("unheld", "60s").await;
    let (held, times) = shared_pool("held", "20ms").await;
    assert_eq!(never, 0.0);
    assert!(times >= 1.0, "held back {times} times");
    assert!(
        held * 2 < ignored,
        "median time to first token {held:?} held back, {ignored:?} not"
    );
}

#[tokio::test]
async fn a_window_that_may_share_its_pool_widens_a_sequence_at_a_time_before_any_interactive_call() {
    // The route's real-time pool is the batch pool's engine, but no interactive call
    // has come, so nothing says the pool is not shared: batch work that comes first
    // is let in a sequence at a time (a 256th of 256), not at the engine's pace (a
    // sixteenth), which would fill the engine before the first interactive stream.
    let backend = engine(256, 10_000_000).await;
    let name = "first";
    let window = "max_sequences = 256\nsignals = \"vllm\"\nsignal_interval = \"100ms\"\n";
    let policy = shared(name, &backend.url(), window);
    let gw = gateway(&policy).await;
    let lines = bulk_lines(300, 5000);
    let addr = gw.http_addr();
    let _batch = tokio::spawn(async move { chat_batch_completed(addr, &lines).await });
    let limit = format!("tiergate_window_limit{{route=\"{name}\",kind=\"sequences\"}}");
    let widened = format!("tiergate_window_adapted_total{{route=\"{name}\",direction=\"widened\"}}");
    let (times, now) = eventually(Duration::from_secs(20), "the window widens ten times", || async {
        let times = metric(&gw, &widened).await;
        (times >= 10.0).then_some((times, metric(&gw, &limit).await))
    })
    .await;
    // It opens at 16; each widening adds one (read just after, it may have widened once
    // more).
    assert!(
        now <= 16.0 + times + 1.0,
        "{now} sequences after widening {times} times"
    );
}

#[tokio::test]
async fn first_tokens_that_never_come_hold_batch_work_back() {
    // Batch work fills both of the engine's sequences for seconds; interactive streams
    // with a 250 ms budget get no first token in it. Their misses count, at the budget,
    // in what the window reads, so it holds batch work back (a window that read only the
    // first tokens that came would read nothing and widen).
    let backend = engine(2, 100_000).await;
    let name = "missed";
    let window = "max_sequences = 2\nsignal_interval = \"100ms\"\ninteractive_ttft = \"100ms\"\n";
    let policy = shared(name, &backend.url(), window);
    let gw = gateway(&policy).await;
    let lines = bulk_lines(4, 3000);
    let addr = gw.http_addr();
    let _batch = tokio::spawn(async move { chat_batch_completed(addr, &lines).await });
    let sim = backend.sim.clone();
    eventually(Duration::from_secs(10), "the batch fills the engine", || {
        let sim = sim.clone();
        async move { (sim.llm_stats("m").expect("llm").running == 2).then_some(()) }
    })
    .await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 2,
        "messages": [{"role": "user", "content": "hello"}]});
    let headers = [("content-type", "application/json"), ("x-tiergate-budget-ms", "250")];
    for _ in 0..2 {
        let answer = send("POST", addr, "/v1/chat/completions", &headers, body.to_string()).await;
        assert!(
            answer.text().contains("before the first token"),
            "the stream's budget ran out first: {}",
            answer.text()
        );
    }
    let held_back = format!("tiergate_window_adapted_total{{route=\"{name}\",direction=\"held_back\"}}");
    eventually(Duration::from_secs(5), "the window holds back", || async {
        (metric(&gw, &held_back).await >= 1.0).then_some(())
    })
    .await;
}
