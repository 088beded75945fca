//! Graceful shutdown of the `tiergate serve` process, end to end: SIGTERM with requests
//! open in every tier. Readiness turns 503 at once, new connections are still served for
//! `shutdown.drain_delay`, then the doors stop accepting while every open request is
//! answered (real-time calls in flight, micro-batch callers still queued), and the
//! process exits 0. Past `shutdown.timeout`, leased offline jobs are handed back to the
//! queue and the next start runs them: nothing is lost.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::served::{self, Served};
use common::*;
use tiergate::protocol::grpc::pb;

/// Every tier on one route: budgets under 10 s are real time, from 10 s micro-batch (one
/// batch in flight, so the rest queue in the gateway), `Prefer: respond-async` offline.
fn policy(rt: &Backend, batch: &Backend) -> String {
    format!(
        r#"
[defaults]
realtime_below = "10s"
offline_from = "1m"
[routes.r]
models = ["m"]
[routes.r.flags]
realtime = true
micro_batch = true
offline = true
[routes.r.realtime]
endpoints = ["{}"]
[routes.r.micro_batch]
endpoints = ["{}"]
max_batch = 2
max_wait = "1ms"
max_in_flight = 1
"#,
        rt.url(),
        batch.url()
    )
}

/// Starts `tiergate serve` (see [`served::serve`]) with the stop's settings.
fn serve(dir: &Path, drain_delay: &str, timeout: &str) -> Served {
    served::serve(
        dir,
        &[
            ("TIERGATE_SHUTDOWN__DRAIN_DELAY", drain_delay),
            ("TIERGATE_SHUTDOWN__TIMEOUT", timeout),
        ],
    )
}

fn write_policy(dir: &Path, text: &str) {
    std::fs::create_dir_all(dir.join("policies")).expect("dir");
    std::fs::write(dir.join("policies/test.toml"), text).expect("policy");
}

async fn refuses_connections(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_err()
}

/// An infer request for model `m` with `headers`, answered on its own connection.
fn infer_task(addr: SocketAddr, headers: &'static [(&'static str, &'static str)]) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(async move { infer(addr, "m", headers, BODY).await })
}

const REALTIME: &[(&str, &str)] = &[("x-tiergate-budget-ms", "9000")];

/// A real-time call through the gRPC door, on a connection opened now.
fn grpc_task(
    addr: SocketAddr,
) -> tokio::task::JoinHandle<Result<tonic::Response<pb::ModelInferResponse>, tonic::Status>> {
    tokio::spawn(async move {
        let mut client = common::grpc::client(addr).await;
        let request = common::grpc::with_budget(common::grpc::fp32_request("", &[[1.0, 2.0]]), "9000");
        client.model_infer(request).await
    })
}

const MICRO_BATCH: &[(&str, &str)] = &[("x-tiergate-budget-ms", "20000")];
const OFFLINE: &[(&str, &str)] = &[("prefer", "respond-async")];

#[tokio::test]
async fn sigterm_with_work_in_every_tier_answers_all_of_it_and_exits_cleanly() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    write_policy(dir.path(), &policy(&rt, &batch));
    let mut gw = serve(dir.path(), "1s", "20s");
    let addr = gw.http;
    // Hold both pools, so the work is open when the signal comes: real-time calls at
    // the backend, one micro-batch at the backend and the rest queued in the gateway,
    // offline jobs leased as filler behind them.
    rt.sim.hold();
    batch.sim.hold();
    let realtime: Vec<_> = (0..3).map(|_| infer_task(addr, REALTIME)).collect();
    let over_grpc = grpc_task(gw.grpc);
    let micro_batch: Vec<_> = (0..6).map(|_| infer_task(addr, MICRO_BATCH)).collect();
    let mut jobs = Vec::new();
    for _ in 0..4 {
        let accepted = infer(addr, "m", OFFLINE, BODY).await;
        assert_eq!(accepted.status, 202, "{}", accepted.text());
        jobs.push(accepted.header("location").expect("a job location").to_owned());
    }
    wait_for(&rt, |s| s.requests == 4).await;
    wait_for(&batch, |s| s.requests >= 1).await;

    gw.terminate();
    let ready = eventually(Duration::from_secs(2), "readiness turns 503", || async {
        Some(get(addr, "/v2/health/ready").await).filter(|a| a.status == 503)
    })
    .await;
    assert_eq!(
        ready.json()["reasons"],
        serde_json::json!(["draining"]),
        "{}",
        ready.text()
    );
    let mut probe = common::grpc::client(gw.grpc).await;
    let grpc_ready = probe.server_ready(pb::ServerReadyRequest {}).await.expect("answers");
    assert!(!grpc_ready.into_inner().ready, "gRPC ServerReady says the same");
    // Still accepting during the drain delay, and asking HTTP/1.1 clients to move on.
    let during = get(addr, "/v2").await;
    assert_eq!(during.status, 200, "a new connection is still served while draining");
    assert_eq!(during.header("connection"), Some("close"));
    // Then the door closes, with every request still open.
    drop(probe);
    eventually(Duration::from_secs(5), "both doors stop accepting", || async {
        (refuses_connections(addr).await && refuses_connections(gw.grpc).await).then_some(())
    })
    .await;
    rt.sim.release();
    batch.sim.release();

    for (tier, tasks) in [("realtime", realtime), ("micro_batch", micro_batch)] {
        for task in tasks {
            let answer = task.await.expect("the request task ends");
            assert_eq!(
                answer.status,
                200,
                "an open {tier} request is answered: {}",
                answer.text()
            );
            assert_eq!(answer.tier().0, Some(tier));
        }
    }
    let grpc = over_grpc
        .await
        .expect("the gRPC task ends")
        .expect("the open gRPC call is answered");
    assert!(!grpc.get_ref().outputs.is_empty());
    let (status, log) = gw.exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit status {status}; log:\n{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("\"stopped\"")), "{}", log.join("\n"));
    assert!(
        !log.iter().any(|l| l.contains("still open at the end")),
        "nothing was cut off:\n{}",
        log.join("\n")
    );
    // The jobs leased at the signal finished or went back to the queue; none is lost.
    let (running, known) = job_states(&dir.path().join("data/offline.db"), &jobs);
    assert_eq!(running, 0, "no job is left leased");
    assert_eq!(known, jobs.len(), "every accepted job is in the store");
}

#[tokio::test]
async fn past_the_timeout_leased_jobs_are_handed_back_and_the_next_start_runs_them() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    write_policy(dir.path(), &policy(&rt, &batch));
    let mut gw = serve(dir.path(), "100ms", "1500ms");
    batch.sim.hold(); // the batch pool never answers before the timeout
    let mut jobs = Vec::new();
    for _ in 0..5 {
        let accepted = infer(gw.http, "m", OFFLINE, BODY).await;
        assert_eq!(accepted.status, 202, "{}", accepted.text());
        jobs.push(accepted.header("location").expect("a job location").to_owned());
    }
    wait_for(&batch, |s| s.requests >= 1).await; // a group of jobs is leased and sent
    let queued_caller = infer_task(gw.http, MICRO_BATCH);
    gw.terminate();
    let answer = queued_caller.await.expect("ends");
    assert_eq!(
        answer.status,
        503,
        "a caller still queued at the timeout is told: {}",
        answer.text()
    );
    let (status, log) = gw.exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}; log:\n{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("handed back")), "{}", log.join("\n"));
    let (running, known) = job_states(&dir.path().join("data/offline.db"), &jobs);
    assert_eq!((running, known), (0, jobs.len()), "handed back, not left leased");

    // The next start (another replica, with Kafka) runs every one of them.
    batch.sim.release();
    let gw = serve(dir.path(), "100ms", "5s");
    for job in &jobs {
        eventually(
            Duration::from_secs(20),
            "every job succeeds after the restart",
            || async { (get(gw.http, job).await.status == 200).then_some(()) },
        )
        .await;
    }
}

/// How many of `jobs` (their `/v1/jobs/ID` locations) are running, and how many the
/// store at `db` knows, read from the file after the gateway exited.
fn job_states(db: &Path, jobs: &[String]) -> (usize, usize) {
    let conn = rusqlite::Connection::open(db).expect("the store opens");
    let mut running = 0;
    let mut known = 0;
    for location in jobs {
        let id = location.rsplit('/').next().expect("an id");
        let state: Option<String> = conn
            .query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get(0))
            .ok();
        known += usize::from(state.is_some());
        running += usize::from(state.as_deref() == Some("running"));
    }
    (running, known)
}

#[tokio::test]
async fn health_says_ok_and_a_second_gateway_on_the_same_data_dir_is_refused_saying_why() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    write_policy(dir.path(), &policy(&rt, &batch));
    let first = serve(dir.path(), "100ms", "5s");
    let health = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["health", "--gateway"])
        .arg(first.http.to_string())
        .output()
        .await
        .expect("runs");
    assert!(health.status.success(), "{}", String::from_utf8_lossy(&health.stderr));
    let said = String::from_utf8_lossy(&health.stdout);
    assert!(said.starts_with("ok: ") && said.contains("is ready"), "{said}");
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .arg("serve")
        .env_clear()
        .env("TIERGATE_POLICY_DIR", dir.path().join("policies"))
        .env("TIERGATE_DATA_DIR", dir.path().join("data"))
        .env("TIERGATE_LISTEN__HTTP", "127.0.0.1:0")
        .env("TIERGATE_LISTEN__GRPC", "127.0.0.1:0")
        .env("TIERGATE_LISTEN__METRICS", "127.0.0.1:0")
        .output();
    let second = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second one stops at once")
        .expect("runs");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{err}");
    assert!(err.contains("is in use by another gateway"), "{err}");
    first.terminate();
}
