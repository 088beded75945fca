//! Backend health: a stalled endpoint is ejected after one slow call and traffic moves
//! to the others; a killed backend fails fast (502, then 503 with Retry-After, never a
//! hang) and is taken back automatically once it answers again.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::time::Instant;

fn two_endpoint_route(a: &str, b: &str, health: &str) -> String {
    format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{a}\", \"{b}\"]\nmax_concurrency = 16\n\
         [routes.r.realtime.health]\n{health}\n"
    )
}

#[tokio::test]
async fn a_stalled_endpoint_is_ejected_after_one_slow_call_and_traffic_moves_away() {
    let (a, b) = (backend(&["m"]).await, backend(&["m"]).await);
    a.sim.hold(); // a stalls: it accepts requests and never answers them
    let health = "eject_after = 1\neject_for = \"1m\"\nslow_call = \"50ms\"\ncheck_path = \"\"";
    let gw = gateway(&two_endpoint_route(&a.url(), &b.url(), health)).await;
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
    let port = free_port();
    let mut child = sim_process(port);
    wait_ready(port, "/v2/health/ready", Duration::from_secs(20)).await;
    let toml = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:{port}\"]\n\
         [routes.r.realtime.health]\neject_after = 2\neject_for = \"300ms\"\ncheck_interval = \"100ms\"\n"
    );
    let gw = gateway(&toml).await;
    let budget = [("x-tiergate-budget-ms", "250")];
    assert_eq!(infer(gw.http_addr(), "m", &budget, BODY).await.status, 200);

    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
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
    let mut child = sim_process(port);
    eventually(Duration::from_secs(20), "the backend is taken back", || async {
        (infer(gw.http_addr(), "m", &budget, BODY).await.status == 200).then_some(())
    })
    .await;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
}

#[tokio::test]
async fn a_grpc_pool_is_checked_with_server_ready_and_a_dead_endpoint_is_ejected_without_traffic() {
    let (http, grpc) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args([
            "sim",
            "--http",
            &format!("127.0.0.1:{http}"),
            "--grpc",
            &format!("127.0.0.1:{grpc}"),
            "--model",
            "m:instant",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sim starts");
    wait_ready(http, "/v2/health/ready", Duration::from_secs(20)).await;
    let toml = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"grpc://127.0.0.1:{grpc}\"]\n\
         [routes.r.realtime.health]\neject_after = 1\neject_for = \"1m\"\ncheck_interval = \"100ms\"\n"
    );
    let gw = gateway(&toml).await;
    assert_eq!(
        infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY)
            .await
            .status,
        200
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
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
