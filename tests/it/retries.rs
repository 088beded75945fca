//! Retries: a call that fails in a way that is safe to repeat goes again to another
//! endpoint of its pool, as the pool's `retry` table says, within its retry budget;
//! a step of a Triton sequence never does.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use tiergate::app::Gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a scripted endpoint does with each request it reads whole.
#[derive(Clone, Copy)]
enum Act {
    /// Closes the connection without a byte of answer.
    Close,
    /// Answers with this status and a small JSON body, keeping the connection.
    Answer(u16),
}

/// An HTTP/1.1 endpoint on loopback that reads each request (head and
/// `content-length` body) and does `act`; with the count of requests read.
async fn scripted(act: Act) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(len) = read_request(&mut stream, &mut buf).await else {
                        return;
                    };
                    buf.drain(..len);
                    count.fetch_add(1, Ordering::SeqCst);
                    match act {
                        Act::Close => return,
                        Act::Answer(status) => {
                            let body = match status {
                                200 => r#"{"model_name":"m","outputs":[]}"#,
                                _ => r#"{"error":"the server is shutting down"}"#,
                            };
                            let answer = format!(
                                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if stream.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

/// Reads one whole request into `buf`; its length, or `None` at the end of the stream.
async fn read_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + body {
                return Some(end + 4 + body);
            }
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Route `name` (each test its own: the metrics registry is the process's) for model
/// `m` (and, when `path` is given, that JSON path) on `endpoints`, nobody ever ejected,
/// no active checks, and `retry` keys set under `realtime.retry`.
fn retry_route(name: &str, endpoints: &[String], path: Option<&str>, retry: &[(&str, toml::Value)]) -> String {
    let mut route = Route::new(name)
        .model("m")
        .set("realtime.endpoints", endpoints.to_vec())
        .set("realtime.health.eject_after", 0)
        .set("realtime.health.check_path", "");
    if let Some(path) = path {
        route = route.set("paths", vec![path.to_owned()]);
    }
    retry
        .iter()
        .fold(route, |r, (key, value)| {
            r.set(&format!("realtime.retry.{key}"), value.clone())
        })
        .toml()
}

/// A gateway whose route `name` has a scripted endpoint doing `act` beside a simulator
/// serving `m`, with `retry` keys; the scripted endpoint's count of requests.
async fn failing_beside_good(
    name: &str,
    act: Act,
    retry: &[(&str, toml::Value)],
) -> (Gateway, Arc<AtomicU64>, Backend) {
    let (bad, bad_calls) = scripted(act).await;
    let good = backend(&["m"]).await;
    let gw = gateway(&retry_route(name, &[format!("http://{bad}"), good.url()], None, retry)).await;
    (gw, bad_calls, good)
}

/// `calls` KServe v2 inference calls to model `m`, one after another; their statuses.
async fn infer_calls(gw: &Gateway, calls: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..calls {
        statuses.push(
            infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY)
                .await
                .status,
        );
    }
    statuses
}

/// The value of `series` in the gateway's scrape (0 when absent).
async fn counted(gw: &Gateway, series: &str) -> u64 {
    metric(gw, series).await as u64
}

#[tokio::test]
async fn an_inference_call_reset_before_its_answer_or_answered_503_goes_to_another_endpoint() {
    for (act, reason) in [(Act::Close, "reset"), (Act::Answer(503), "unavailable")] {
        let (gw, bad_calls, good) = failing_beside_good("retried", act, &[]).await;
        let mut answers = Vec::new();
        for _ in 0..20 {
            answers.push(infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await);
        }
        let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        assert!(statuses.iter().all(|s| *s == 200), "{reason}: {statuses:?}");
        let failed = bad_calls.load(Ordering::SeqCst);
        assert!(
            failed > 0,
            "{reason}: the failing endpoint was never chosen in 20 calls"
        );
        // A retried answer says how long the failed call took before the one that answered.
        let retried = answers
            .iter()
            .map(Answer::timing)
            .filter(|parts| part_names(parts) == ["backend", "retry", "gateway", "total"])
            .count() as u64;
        assert_eq!(retried, failed, "{reason}");
        assert_eq!(good.sim.stats("m").expect("stats").requests, 20, "{reason}");
        let retries =
            format!("tiergate_backend_retries_total{{route=\"retried\",tier=\"realtime\",reason=\"{reason}\"}}");
        assert_eq!(
            counted(&gw, &retries).await,
            failed,
            "{reason}: one retry per failed call"
        );
    }
}

#[tokio::test]
async fn what_may_have_left_is_not_retried_where_the_policy_or_the_path_says_so() {
    // `on = []`: a reset or a 503 reaches the caller, as the endpoint answered.
    for (act, status) in [(Act::Close, 502), (Act::Answer(503), 503)] {
        let nothing = [("on", toml::Value::Array(vec![]))];
        let (gw, bad_calls, good) = failing_beside_good("not_retried", act, &nothing).await;
        let statuses = infer_calls(&gw, 20).await;
        let failed = statuses.iter().filter(|s| **s != 200).count() as u64;
        assert_eq!(failed, bad_calls.load(Ordering::SeqCst), "{statuses:?}");
        assert!(failed > 0, "the failing endpoint was never chosen in 20 calls");
        assert!(statuses.iter().all(|s| *s == 200 || *s == status), "{statuses:?}");
        let sent = good.sim.stats("m").expect("stats").requests;
        assert_eq!(sent + failed, 20, "no call went twice");
    }
    // A JSON path is not known to be idempotent: by default only an unreachable
    // endpoint's calls go again.
    let (bad, bad_calls) = scripted(Act::Close).await;
    let (good, good_calls) = scripted(Act::Answer(200)).await;
    let gw = gateway(&retry_route(
        "not_retried",
        &[format!("http://{bad}"), format!("http://{good}")],
        Some("/predict"),
        &[],
    ))
    .await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = send(
            "POST",
            gw.http_addr(),
            "/predict",
            &[("x-tiergate-budget-ms", "250")],
            r#"{"x":1}"#,
        )
        .await;
        statuses.push(r.status);
    }
    let failed = bad_calls.load(Ordering::SeqCst);
    assert!(failed > 0, "the failing endpoint was never chosen in 20 calls");
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count() as u64,
        failed,
        "{statuses:?}"
    );
    assert_eq!(good_calls.load(Ordering::SeqCst) + failed, 20, "no call went twice");
}

#[tokio::test]
async fn an_unreachable_endpoints_calls_always_go_again() {
    let dead = dead_addr().await;
    let good = backend(&["m"]).await;
    let toml = retry_route(
        "unreachable",
        &[format!("http://{dead}"), good.url()],
        None,
        &[("on", toml::Value::Array(vec![]))],
    );
    let gw = gateway(&toml).await;
    let statuses = infer_calls(&gw, 20).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let retries = counted(
        &gw,
        "tiergate_backend_retries_total{route=\"unreachable\",tier=\"realtime\",reason=\"unreachable\"}",
    )
    .await;
    assert!(retries > 0, "the dead endpoint was never chosen in 20 calls");
}

#[tokio::test]
async fn the_retry_budget_refuses_retries_past_its_share() {
    // Three endpoints answering 503; no share of the calls, 1 retry a second: 10 in the
    // 10 s window. Each call may be retried twice (on the two others).
    let mut endpoints = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..3 {
        let (addr, count) = scripted(Act::Answer(503)).await;
        endpoints.push(format!("http://{addr}"));
        counts.push(count);
    }
    let retry = [("budget_percent", 0.into()), ("min_per_second", 1.into())];
    let gw = gateway(&retry_route("budget", &endpoints, None, &retry)).await;
    let statuses = infer_calls(&gw, 12).await;
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    let sent: u64 = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert_eq!(sent, 12 + 10, "every call once, and the 10 retries the budget allows");
    let series = |family: &str, label: &str| format!("{family}{{route=\"budget\",tier=\"realtime\",{label}}}");
    let retries = counted(&gw, &series("tiergate_backend_retries_total", "reason=\"unavailable\"")).await;
    let refused = counted(&gw, &series("tiergate_backend_retries_refused_total", "why=\"budget\"")).await;
    assert_eq!(
        (retries, refused),
        (10, 7),
        "5 calls retried twice, then 7 refused once each"
    );
}

#[tokio::test]
async fn a_step_of_a_sequence_is_never_retried_on_another_endpoint() {
    let (gw, bad_calls, good) = failing_beside_good("sequence", Act::Answer(503), &[]).await;
    let statuses = one_step_sequences(&gw, 16, "250").await;
    let failed = bad_calls.load(Ordering::SeqCst);
    assert!(failed > 0, "no sequence was pinned to the failing endpoint in 16");
    assert_eq!(
        statuses.iter().filter(|s| **s == 503).count() as u64,
        failed,
        "{statuses:?}"
    );
    let sent = good.sim.stats("m").expect("stats").requests;
    assert_eq!(sent + failed, 16, "no step went to a second endpoint");
    let retries = counted(
        &gw,
        "tiergate_backend_retries_total{route=\"sequence\",tier=\"realtime\",reason=\"unavailable\"}",
    )
    .await;
    assert_eq!(retries, 0);
}

#[tokio::test]
async fn a_batch_answered_503_goes_to_another_endpoint_of_the_batch_pool() {
    let (bad, bad_calls) = scripted(Act::Answer(503)).await;
    let good = backend(&["m"]).await;
    let toml = Route::new("batch_retried")
        .model("m")
        .only(&["micro_batch"])
        .set("micro_batch.endpoints", vec![format!("http://{bad}"), good.url()])
        .set("micro_batch.health.eject_after", 0)
        .set("micro_batch.health.check_path", "")
        .toml();
    let gw = gateway(&toml).await;
    for _ in 0..12 {
        let r = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
        assert_eq!((r.status, r.tier().0), (200, Some("micro_batch")), "{}", r.text());
    }
    let failed = bad_calls.load(Ordering::SeqCst);
    assert!(failed > 0, "the failing endpoint got no batch of 12");
    let retries = counted(
        &gw,
        "tiergate_backend_retries_total{route=\"batch_retried\",tier=\"micro_batch\",reason=\"unavailable\"}",
    )
    .await;
    assert_eq!(retries, failed, "one retry per failed batch");
}
