//! Backend health: a stalled endpoint is ejected after one slow call and traffic moves
//! to the others; a killed backend fails fast (502, then 503 with Retry-After, never a
//! hang) and is taken back automatically once it answers again.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::sim::{ModelSpec, Profile};
use tokio::time::Instant;

/// Route `r` for model `m`, its real-time pool on `endpoints` (16 calls at once), its
/// health settings `health` (each `(key, value)` below `realtime.health`) and no active
/// checks unless `health` sets them.
fn health_route(endpoints: &[&str], health: &[(&str, toml::Value)]) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
    let route = Route::new("r")
        .model("m")
        .set("realtime.endpoints", endpoints)
        .set("realtime.max_concurrency", 16);
    health
        .iter()
        .fold(route, |r, (key, value)| {
            r.set(&format!("realtime.health.{key}"), value.clone())
        })
        .toml()
}

/// `eject_after = n`, `eject_for` and no active checks.
fn ejecting(n: i64, eject_for: &str) -> Vec<(&'static str, toml::Value)> {
    vec![
        ("eject_after", n.into()),
        ("eject_for", eject_for.into()),
        ("check_path", "".into()),
    ]
}

#[tokio::test]
async fn a_stalled_endpoint_is_ejected_after_one_slow_call_and_traffic_moves_away() {
    let (a, b) = (backend(&["m"]).await, backend(&["m"]).await);
    a.sim.hold(); // a stalls: it accepts requests and never answers them
    let mut health = ejecting(1, "1m");
    health.push(("slow_call", "50ms".into()));
    let gw = gateway(&health_route(&[&a.url(), &b.url()], &health)).await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let r = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        statuses.push((r.status, started.elapsed()));
    }
    let stalled = a.sim.stats("m").expect("stats").requests;
    assert!(stalled <= 1, "the stalled endpoint got {stalled} requests");
    let failed: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.len() <= 1,
        "at most the one call caught on the stalled endpoint fails: {statuses:?}"
    );
    assert!(failed.iter().all(|(s, _)| *s == 504), "{statuses:?}");
    let ok_slowest = statuses.iter().filter(|(s, _)| *s == 200).map(|(_, t)| *t).max();
    assert!(
        ok_slowest.is_some_and(|t| t < Duration::from_millis(200)),
        "traffic on the healthy endpoint is not slowed: {statuses:?}"
    );
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    let ejected = format!(
        "tiergate_backend_ejections_total{{route=\"r\",tier=\"realtime\",endpoint=\"{}\",reason=\"slow\"}} 1",
        a.addr
    );
    assert!(scrape.contains(&ejected), "{ejected} in\n{scrape}");
    a.sim.release();
}

#[tokio::test]
async fn a_killed_backend_fails_fast_and_is_taken_back_when_it_returns() {
    let mut sim = sim_process(0, None);
    let port = sim.http.port();
    let toml = Route::new("r")
        .model("m")
        .realtime(&format!("http://127.0.0.1:{port}"))
        .set("realtime.health.eject_after", 2)
        .set("realtime.health.eject_for", "300ms")
        .set("realtime.health.check_interval", "100ms")
        .toml();
    let gw = gateway(&toml).await;
    let budget = [("x-tiergate-budget-ms", "250")];
    assert_eq!(infer(gw.http_addr(), "m", &budget, BODY).await.status, 200);

    sim.kill();
    let started = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let r = infer(gw.http_addr(), "m", &budget, BODY).await;
        seen.push((r.status, r.header("retry-after").map(str::to_owned)));
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "ten calls to a dead backend took {took:?}: {seen:?}"
    );
    assert!(seen.iter().all(|(s, _)| *s == 502 || *s == 503), "{seen:?}");
    assert!(
        seen.iter().any(|(s, after)| *s == 503 && after.is_some()),
        "ejected: 503 with Retry-After: {seen:?}"
    );

    // It comes back on the same port: the next probe (after the ejection, or once a
    // health check passes) takes it back. Polling is the only signal a client has.
    let _back = sim_process(port, None);
    eventually(Duration::from_secs(20), "the backend is taken back", || async {
        (infer(gw.http_addr(), "m", &budget, BODY).await.status == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_grpc_pool_is_checked_with_server_ready_and_a_dead_endpoint_is_ejected_without_traffic() {
    let mut sim = sim_process(0, Some(0));
    let grpc = sim.grpc.expect("a gRPC door").port();
    let toml = Route::new("r")
        .model("m")
        .realtime(&format!("grpc://127.0.0.1:{grpc}"))
        .set("realtime.health.eject_after", 1)
        .set("realtime.health.eject_for", "1m")
        .set("realtime.health.check_interval", "100ms")
        .toml();
    let gw = gateway(&toml).await;
    assert_eq!(
        infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY)
            .await
            .status,
        200
    );
    sim.kill();
    // No traffic: only the ServerReady checks can notice. Poll the metrics as an operator would.
    let ejected = format!("tiergate_backend_ejections_total{{route=\"r\",tier=\"realtime\",endpoint=\"127.0.0.1:{grpc}\",reason=\"check\"}} 1");
    eventually(
        Duration::from_secs(10),
        "the dead gRPC endpoint is ejected by its checks",
        || async {
            get(gw.metrics_addr(), "/metrics")
                .await
                .text()
                .contains(&ejected)
                .then_some(())
        },
    )
    .await;
    let r = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
    assert_eq!(r.status, 503, "ejected: refused at once: {}", r.text());
}

/// A 5 ms model (one instance: calls queue behind each other there, as on a GPU).
async fn five_ms_backend() -> Backend {
    let profile = tiergate::sim::Profile {
        a: Duration::from_millis(5),
        ..Default::default()
    };
    backend_with(vec![tiergate::sim::ModelSpec::new("m", profile)]).await
}

/// The ejection counts of `backends` in `scrape` (the metrics are the test process's,
/// shared by every gateway in it).
fn ejections<'a>(scrape: &'a str, backends: &[&Backend]) -> Vec<&'a str> {
    scrape
        .lines()
        .filter(|l| l.starts_with("tiergate_backend_ejections_total{"))
        .filter(|l| backends.iter().any(|b| l.contains(&format!("endpoint=\"{}\"", b.addr))))
        .collect()
}

#[tokio::test]
async fn a_callers_short_budget_ejects_no_endpoint_and_is_refused_once_the_pool_knows_its_cost() {
    let (a, b) = (five_ms_backend().await, five_ms_backend().await);
    let gw = gateway(&health_route(&[&a.url(), &b.url()], &ejecting(3, "50s"))).await;
    let short = [("x-tiergate-budget-ms", "1")];
    // An attacker's 1 ms budgets against a 5 ms backend, before the pool has learned
    // anything: each call is cut by its own deadline, and that is nobody's fault.
    // (One answered anyway is possible: on the test's one thread, an answer and the
    // deadline may be ready together, and the answer is looked at first.)
    for _ in 0..100 {
        let r = infer(gw.http_addr(), "m", &short, BODY).await;
        assert!([200, 503, 504].contains(&r.status), "{} {}", r.status, r.text());
    }
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert_eq!(ejections(&scrape, &[&a, &b]), Vec::<&str>::new(), "nothing ejected");
    // An honest caller is served by both endpoints, and the pool learns their cost.
    let honest = [("x-tiergate-budget-ms", "250")];
    for _ in 0..40 {
        let r = infer(gw.http_addr(), "m", &honest, BODY).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Now a budget below what the backends take is refused before it is sent.
    let sent = a.sim.stats("m").expect("stats").requests + b.sim.stats("m").expect("stats").requests;
    // (3 ms, below their 5 ms: a 1 ms budget may be spent before the pool is reached.)
    let (short, mut unmeetable) = ([("x-tiergate-budget-ms", "3")], 0);
    for _ in 0..100 {
        let r = infer(gw.http_addr(), "m", &short, BODY).await;
        match r.status {
            503 => {
                assert!(r.text().contains("deadline unmeetable"), "{}", r.text());
                assert_eq!(r.header("retry-after"), Some("1"));
                unmeetable += 1;
            }
            _ => assert!(
                r.status == 504 && r.text().contains("before the request reached a backend"),
                "{} {}",
                r.status,
                r.text()
            ),
        }
    }
    assert!(unmeetable >= 50, "{unmeetable} of 100 refused as unmeetable");
    let after = a.sim.stats("m").expect("stats").requests + b.sim.stats("m").expect("stats").requests;
    assert_eq!(after, sent, "no refused call reached a backend");
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert_eq!(
        ejections(&scrape, &[&a, &b]),
        Vec::<&str>::new(),
        "still nothing ejected"
    );
    assert!(
        scrape.contains("outcome=\"deadline_unmeetable\""),
        "refusals are counted as deadline_unmeetable"
    );
}

#[tokio::test]
async fn an_endpoint_that_stalls_past_the_pools_learned_p99_is_still_ejected_without_slow_call() {
    // Alone in its pool, so every call goes to it (beside another endpoint, its cost
    // would send the calls there after the first cut one: the test below).
    let a = five_ms_backend().await;
    let gw = gateway(&health_route(&[&a.url()], &ejecting(2, "1m"))).await;
    let budget = [("x-tiergate-budget-ms", "100")];
    for _ in 0..40 {
        assert_eq!(infer(gw.http_addr(), "m", &budget, BODY).await.status, 200);
    }
    a.sim.hold(); // a stalls: its calls run to the callers' 100 ms, far past the pool's p99
    let mut statuses = Vec::new();
    // The same input cut twice is one input's evidence; two inputs eject it.
    for id in ["same", "same", "other", "third", "fourth", "fifth"] {
        let body = BODY.replace("req-1", id);
        statuses.push(infer(gw.http_addr(), "m", &budget, &body).await.status);
    }
    assert_eq!(statuses, [504, 504, 504, 503, 503, 503], "two inputs cut eject it");
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    let ejected = format!(
        "tiergate_backend_ejections_total{{route=\"r\",tier=\"realtime\",endpoint=\"{}\",reason=\"timeout\"}} 1",
        a.addr
    );
    assert!(scrape.contains(&ejected), "{ejected} in\n{scrape}");
    a.sim.release();
}

#[tokio::test]
async fn a_stalled_endpoint_beside_another_costs_one_cut_call_then_gets_no_work() {
    let (a, b) = (five_ms_backend().await, five_ms_backend().await);
    let gw = gateway(&health_route(&[&a.url(), &b.url()], &ejecting(2, "1m"))).await;
    let budget = [("x-tiergate-budget-ms", "100")];
    for _ in 0..40 {
        assert_eq!(infer(gw.http_addr(), "m", &budget, BODY).await.status, 200);
    }
    a.sim.hold();
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(infer(gw.http_addr(), "m", &budget, BODY).await.status);
    }
    let timeouts = statuses.iter().filter(|s| **s == 504).count();
    assert!(
        timeouts <= 1,
        "its cost rose with the cut call, so b serves: {statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 30 - timeouts);
    a.sim.release();
}

#[tokio::test]
async fn steps_of_a_sequence_waiting_their_turn_past_their_budget_eject_nothing() {
    let profile = tiergate::sim::Profile {
        a: Duration::from_millis(20),
        ..Default::default()
    };
    let one = backend_with(vec![tiergate::sim::ModelSpec::new("m", profile)]).await;
    let toml = health_route(&[&one.url()], &ejecting(1, "1m"));
    let gw = gateway(&toml).await;
    let step = |i: u64| {
        let addr = gw.http_addr();
        let body = serde_json::json!({"id": format!("s{i}"),
            "parameters": {"sequence_id": 9, "sequence_start": i == 0, "sequence_end": i == 7},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]});
        tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "70")], &body.to_string()).await })
    };
    let steps: Vec<_> = (0..8).map(step).collect();
    let mut statuses = Vec::new();
    for s in steps {
        statuses.push(s.await.expect("task").status);
    }
    assert!(statuses.contains(&200), "the first steps are served: {statuses:?}");
    assert!(
        statuses.iter().any(|s| *s != 200),
        "the last ones run out of budget: {statuses:?}"
    );
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert_eq!(
        ejections(&scrape, &[&one]),
        Vec::<&str>::new(),
        "steps that waited eject nothing"
    );
    let after = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
    assert_eq!(after.status, 200, "the endpoint still serves: {}", after.text());
}

/// An HTTP server on 127.0.0.1:0 that answers every request 200 with an HTML page, as a
/// misconfigured proxy or a crashed app's error page does; and how many it answered.
async fn html_server() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let answered = std::sync::Arc::new(AtomicU64::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let page = "<html><body>502 upstream gone</body></html>";
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}",
                    page.len()
                );
                while let Ok(n) = stream.read(&mut buf).await {
                    // One request a read is enough here: the gateway sends whole, small requests.
                    if n == 0 || stream.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    (addr, answered)
}

#[tokio::test]
async fn an_endpoint_answering_200_with_garbage_is_passed_over_and_ejected() {
    let good = backend(&["m"]).await;
    let (bad, answered) = html_server().await;
    let gw = gateway(&health_route(
        &[&good.url(), &format!("http://{bad}")],
        &ejecting(2, "1m"),
    ))
    .await;
    let budget = [("x-tiergate-budget-ms", "250")];
    for _ in 0..60 {
        // A garbled answer is not taken: the call goes to the other endpoint, which
        // answers, so the garbling is the endpoint's own.
        let answer = infer(gw.http_addr(), "m", &budget, BODY).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(answer.json()["outputs"].is_array(), "{}", answer.text());
    }
    let reached = answered.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=2).contains(&reached),
        "two in a row eject it: it answered {reached}"
    );
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    let ejected = format!(
        "tiergate_backend_ejections_total{{route=\"r\",tier=\"realtime\",endpoint=\"{bad}\",reason=\"broken_answer\"}} 1"
    );
    assert!(scrape.contains(&ejected), "{ejected} in\n{scrape}");
}

#[tokio::test]
async fn a_slower_endpoint_gets_less_work_before_it_is_slow_enough_to_be_ejected() {
    let slow = |factor: u64| {
        ModelSpec::new(
            "m",
            Profile {
                a: Duration::from_millis(factor),
                ..Profile::default()
            },
        )
    };
    let (fast, slower) = (backend_with(vec![slow(1)]).await, backend_with(vec![slow(10)]).await);
    let gw = gateway(&health_route(&[&fast.url(), &slower.url()], &ejecting(0, "1s"))).await;
    for _ in 0..100 {
        let r = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (to_fast, to_slow) = (
        fast.sim.stats("m").expect("stats").requests,
        slower.sim.stats("m").expect("stats").requests,
    );
    assert_eq!(to_fast + to_slow, 100);
    // On calls in flight alone (one call at a time: always 0 and 0) each would get
    // about half; by cost, the slower one only until its cost is known.
    assert!(to_slow <= 10, "the 10x slower endpoint got {to_slow} of 100 calls");
}

#[tokio::test]
async fn a_fallback_pool_serves_while_the_realtime_pool_is_ejected_or_full() {
    // Ejected: the one real-time endpoint is dead; its first call ejects it.
    let dead = dead_addr().await;
    let spare = backend(&["m"]).await;
    let toml = Route::new("fb")
        .model("m")
        .set("realtime.endpoints", vec![format!("http://{dead}")])
        .set("realtime.health.eject_after", 1)
        .set("realtime.health.eject_for", "1m")
        .set("realtime.health.check_path", "")
        .set("fallback.endpoints", vec![spare.url()])
        .toml();
    let gw = gateway(&toml).await;
    let budget = [("x-tiergate-budget-ms", "250")];
    assert_eq!(
        infer(gw.http_addr(), "m", &budget, BODY).await.status,
        502,
        "the call that ejects it"
    );
    for _ in 0..10 {
        let r = infer(gw.http_addr(), "m", &budget, BODY).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.tier(), (Some("realtime"), Some("fallback")));
    }
    assert_eq!(spare.sim.stats("m").expect("stats").requests, 10);
    let decided = "tiergate_decisions_total{route=\"fb\",tier=\"realtime\",reason=\"fallback\"}";
    assert_eq!(metric(&gw, decided).await, 10.0);

    // Full: the real-time pool's one call slot is taken by a call its backend holds.
    let (held, spare) = (backend(&["m"]).await, backend(&["m"]).await);
    let toml = Route::new("fbfull")
        .model("m")
        .set("realtime.endpoints", vec![held.url()])
        .set("realtime.max_concurrency", 1)
        .set("realtime.health.check_path", "")
        .set("fallback.endpoints", vec![spare.url()])
        .toml();
    let gw = gateway(&toml).await;
    held.sim.hold();
    let addr = gw.http_addr();
    let first = tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await });
    wait_for(&held, |s| s.requests == 1).await;
    let second = infer(gw.http_addr(), "m", &budget, BODY).await;
    assert_eq!(
        (second.status, second.tier()),
        (200, (Some("realtime"), Some("fallback")))
    );
    held.sim.release();
    let first = first.await.expect("task");
    assert_eq!(
        (first.status, first.tier()),
        (200, (Some("realtime"), Some("budget_realtime")))
    );

    // Another model: the fallback pool serves the calls as `m-cpu`, the one model its
    // server has (a version the caller named is that model's, not the fallback's).
    let cpu = backend(&["m-cpu"]).await;
    let toml = Route::new("fbmodel")
        .model("m")
        .set("realtime.endpoints", vec![format!("http://{}", dead_addr().await)])
        .set("realtime.health.eject_after", 1)
        .set("realtime.health.eject_for", "1m")
        .set("realtime.health.check_path", "")
        .set("fallback.endpoints", vec![cpu.url()])
        .set("fallback.model", "m-cpu")
        .toml();
    let gw = gateway(&toml).await;
    assert_eq!(
        infer(gw.http_addr(), "m", &budget, BODY).await.status,
        502,
        "the call that ejects it"
    );
    let served = infer(gw.http_addr(), "m", &budget, BODY).await;
    assert_eq!(
        (served.status, served.tier().1),
        (200, Some("fallback")),
        "{}",
        served.text()
    );
    assert_eq!(served.json()["model_name"], "m-cpu");
    let versioned = send(
        "POST",
        gw.http_addr(),
        "/v2/models/m/versions/3/infer",
        &[("x-tiergate-budget-ms", "250"), ("content-type", "application/json")],
        BODY.to_owned(),
    )
    .await;
    assert_eq!(
        (versioned.status, versioned.json()["model_name"].clone()),
        (200, "m-cpu".into())
    );
    assert_eq!(cpu.sim.stats("m-cpu").expect("stats").requests, 2);
}
