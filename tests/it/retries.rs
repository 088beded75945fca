//! Retries: a call that fails in a way that is safe to repeat goes again to another
//! endpoint of its pool, as the pool's `retry` table says, within its caller's share of
//! the retry budget; a step of a Triton sequence never does. A failure the call meets
//! alike on another endpoint is its input's: no endpoint is charged for it, and one
//! caller's poison input neither ejects a pool nor spends the retries others need.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use tiergate::app::Gateway;
use tokio::io::AsyncWriteExt;

/// What a scripted endpoint does with each request it reads whole.
#[derive(Clone, Copy)]
enum Act {
    /// Closes the connection without a byte of answer.
    Close,
    /// Answers with this status and a small JSON body, keeping the connection.
    Answer(u16),
    /// Answers a request whose body holds `oom` with this status (as a model server
    /// does for an input that runs it out of memory), any other with 200.
    PoisonOn(u16),
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
                    count.fetch_add(1, Ordering::SeqCst);
                    let act = match act {
                        Act::PoisonOn(status) if contains(&buf[..len], b"oom") => Act::Answer(status),
                        Act::PoisonOn(_) => Act::Answer(200),
                        other => other,
                    };
                    match act {
                        Act::Close | Act::PoisonOn(_) => return,
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
                            buf.drain(..len);
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
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

/// A KServe v2 inference body with request id `id`: each a different input.
fn body_with_id(id: &str) -> String {
    BODY.replace("req-1", id)
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
    let mut statuses = Vec::new();
    for i in 0..12 {
        let body = body_with_id(&format!("call-{i}"));
        statuses.push(
            infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], &body)
                .await
                .status,
        );
    }
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    let sent: u64 = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert_eq!(sent, 12 + 10, "every call once, and the 10 retries the budget allows");
    let series = |family: &str, label: &str| format!("{family}{{route=\"budget\",tier=\"realtime\",{label}}}");
    let retries = counted(&gw, &series("tiergate_backend_retries_total", "reason=\"unavailable\"")).await;
    let refused = counted(&gw, &series("tiergate_backend_retries_refused_total", "why=\"budget\"")).await;
    let alike = counted(&gw, &series("tiergate_backend_retries_refused_total", "why=\"input\"")).await;
    assert_eq!(
        (retries, alike, refused),
        (10, 10, 2),
        "10 calls retried once, each failing alike on a second endpoint (its input's: not sent a third \
         time), then 2 refused"
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

/// Route `name` for model `m` on `endpoints`, ejecting after 3 failures in a row (the
/// default), no active checks, and `retry` keys set under `realtime.retry`.
fn ejecting_route(name: &str, endpoints: &[String], retry: &[(&str, toml::Value)]) -> String {
    retry
        .iter()
        .fold(
            Route::new(name)
                .model("m")
                .set("realtime.endpoints", endpoints.to_vec())
                .set("realtime.health.check_path", ""),
            |r, (key, value)| r.set(&format!("realtime.retry.{key}"), value.clone()),
        )
        .toml()
}

/// Two endpoints that answer `status` to an input holding `oom` and 200 to others.
async fn poisoned_pair(status: u16) -> (Vec<String>, Vec<Arc<AtomicU64>>) {
    let mut endpoints = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..2 {
        let (addr, count) = scripted(Act::PoisonOn(status)).await;
        endpoints.push(format!("http://{addr}"));
        counts.push(count);
    }
    (endpoints, counts)
}

#[tokio::test]
async fn one_callers_poison_input_ejects_no_endpoint_and_goes_again_once() {
    for (status, reason) in [(503, "unavailable"), (500, "error")] {
        let route = format!("poison_{status}");
        let (endpoints, counts) = poisoned_pair(status).await;
        let gw = gateway(&ejecting_route(&route, &endpoints, &[])).await;
        let poison = body_with_id("oom");
        let mut victim = Vec::new();
        for i in 0..60 {
            let r = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], &poison).await;
            assert_eq!(r.status, status, "{}", r.text());
            if i % 3 == 0 {
                victim.push(infer_calls(&gw, 1).await[0]);
            }
        }
        assert!(
            victim.iter().all(|s| *s == 200),
            "{status}: the victim is served throughout: {victim:?}"
        );
        let series = |family: &str, label: &str| format!("{family}{{route=\"{route}\",tier=\"realtime\",{label}}}");
        let circuit = |e: &str| {
            format!(
                "tiergate_backend_circuit_state{{route=\"{route}\",tier=\"realtime\",endpoint=\"{}\"}}",
                e.trim_start_matches("http://")
            )
        };
        for endpoint in &endpoints {
            assert_eq!(
                metric(&gw, &circuit(endpoint)).await,
                0.0,
                "{status}: {endpoint} stays in"
            );
        }
        let retries = counted(
            &gw,
            &series("tiergate_backend_retries_total", &format!("reason=\"{reason}\"")),
        )
        .await;
        let alike = counted(&gw, &series("tiergate_backend_retries_refused_total", "why=\"input\"")).await;
        assert_eq!(
            (retries, alike),
            (1, 1),
            "{status}: the first copy went to the second endpoint, failed alike there, and no copy after it \
             was sent twice"
        );
        let sent: u64 = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        assert_eq!(sent, 60 + 1 + victim.len() as u64, "{status}");
    }
}

#[tokio::test]
async fn a_failure_met_alike_on_another_endpoint_is_not_charged_and_an_answer_there_is() {
    // Different poison inputs (as an attacker varying a field would send): each goes to
    // the second endpoint once, fails alike, and charges nobody.
    let (endpoints, _) = poisoned_pair(503).await;
    let gw = gateway(&ejecting_route("poison_varied", &endpoints, &[])).await;
    for i in 0..30 {
        let r = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "250")],
            &body_with_id(&format!("oom-{i}")),
        )
        .await;
        assert_eq!(r.status, 503, "{}", r.text());
    }
    let ejections = metric(&gw, "tiergate_backend_ejections_total{route=\"poison_varied\"").await;
    assert_eq!(ejections, 0.0, "no endpoint ejected by its inputs");
    assert_eq!(infer_calls(&gw, 5).await, vec![200; 5]);
    // A failure an answer elsewhere contradicts is the endpoint's: three in a row eject it.
    let (bad, _) = scripted(Act::Answer(503)).await;
    let good = backend(&["m"]).await;
    let gw = gateway(&ejecting_route(
        "really_bad",
        &[format!("http://{bad}"), good.url()],
        &[],
    ))
    .await;
    let statuses = infer_calls(&gw, 40).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let circuit =
        format!("tiergate_backend_circuit_state{{route=\"really_bad\",tier=\"realtime\",endpoint=\"{bad}\"}}");
    assert_eq!(
        metric(&gw, &circuit).await,
        1.0,
        "the endpoint failing alone is ejected"
    );
}

#[tokio::test]
async fn one_callers_failing_inputs_spend_only_its_share_of_the_retries() {
    // Team a sends inputs that fail everywhere, each a different one; team b's calls
    // meet a dead endpoint now and then (never ejected here) and need a retry each. The
    // budget: 30 retries in the window (no share of the calls, 3 a second), which team a
    // alone would spend.
    let dead = dead_addr().await;
    let (mut endpoints, _) = poisoned_pair(503).await;
    endpoints.insert(0, format!("http://{dead}"));
    let policy = Route::new("shares")
        .model("m")
        .set("realtime.endpoints", endpoints)
        .set("realtime.health.check_path", "")
        .set("realtime.health.eject_after", 0)
        .set("realtime.retry.budget_percent", 0)
        .set("realtime.retry.min_per_second", 3)
        .toml();
    let mut cfg = config();
    std::fs::create_dir_all(&cfg.data_dir).expect("data dir");
    let keys = cfg.data_dir.with_extension("keys");
    let text = format!(
        "{}\n{}\n",
        tiergate::front::auth::line("team-a", "key-of-team-a-0123456789"),
        tiergate::front::auth::line("team-b", "key-of-team-b-0123456789")
    );
    std::fs::write(&keys, text).expect("keys file");
    cfg.auth.keys_file = Some(keys);
    let gw = gateway_with(cfg, &policy).await;
    let team = |key: &'static str| ("authorization", format!("Bearer {key}"));
    let (a, b) = (team("key-of-team-a-0123456789"), team("key-of-team-b-0123456789"));
    for i in 0..30 {
        let body = body_with_id(&format!("oom-{i}"));
        let r = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "250"), (a.0, &a.1)],
            &body,
        )
        .await;
        assert!(matches!(r.status, 502 | 503), "{}", r.text());
    }
    let refused = counted(
        &gw,
        "tiergate_backend_retries_refused_total{route=\"shares\",tier=\"realtime\",why=\"budget\"}",
    )
    .await;
    assert!(refused > 0, "team a went past the budget");
    let mut statuses = Vec::new();
    for _ in 0..15 {
        statuses.push(
            infer(
                gw.http_addr(),
                "m",
                &[("x-tiergate-budget-ms", "250"), (b.0, &b.1)],
                BODY,
            )
            .await
            .status,
        );
    }
    assert!(
        statuses.iter().all(|s| *s == 200),
        "team b's retries were not spent by team a: {statuses:?}"
    );
}
