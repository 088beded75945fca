//! The offline tier over the HTTP door: `Prefer: respond-async` and offline budgets are
//! accepted durably (202 + Location), run later through the batch pool, and answered at
//! `/v1/jobs/{id}` with the backend's exact answer; idempotent resubmission, retries
//! then failure, cancellation, a refused request kept as is, micro-batch traffic going
//! first, gRPC refused with a clear message, and jobs surviving a restart.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::app::Gateway;
use tiergate::config::Config;
use tokio::time::Instant;

/// A route `name` for model `m` with every tier on, offline from 30 s.
fn policy(name: &str, rt: &str, batch: &str) -> String {
    format!(
        r#"
[routes.{name}]
models = ["m"]
offline_from = "30s"
[routes.{name}.flags]
realtime = true
micro_batch = true
offline = true
[routes.{name}.realtime]
endpoints = ["{rt}"]
[routes.{name}.micro_batch]
endpoints = ["{batch}"]
max_batch = 64
max_in_flight = 1
"#
    )
}

fn fast_retries() -> Config {
    let mut config = config();
    config.offline.max_attempts = 3;
    config.offline.retry_backoff = Duration::from_millis(20);
    config.offline.attempt_timeout = Duration::from_secs(2);
    config
}

const ASYNC: [(&str, &str); 1] = [("prefer", "respond-async")];

/// Submits `body` asynchronously and returns the job's path.
async fn submit(gw: &Gateway, headers: &[(&str, &str)], body: &str) -> String {
    let answer = infer(gw.http_addr(), "m", headers, body).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    assert_eq!(answer.tier().0, Some("offline"));
    let location = answer.header("location").expect("Location").to_owned();
    assert_eq!(answer.json()["url"], location.as_str());
    location
}

/// Polls `location` as a client would until the job is no longer pending (10 s at most).
async fn outcome(gw: &Gateway, location: &str) -> Answer {
    let what = format!("job {location} finishes");
    eventually(Duration::from_secs(10), &what, || async {
        let answer = get(gw.http_addr(), location).await;
        if answer.status == 202 {
            assert!(
                answer.header("retry-after").is_some(),
                "a pending job says when to ask again"
            );
            return None;
        }
        Some(answer)
    })
    .await
}

#[tokio::test]
async fn an_async_request_is_accepted_then_answered_exactly_as_the_backend_answers() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("async", &rt.url(), &batch.url())).await;
    let direct = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY).await;
    let location = submit(&gw, &ASYNC, BODY).await;
    let done = outcome(&gw, &location).await;
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.header("x-tiergate-job-status"), Some("succeeded"));
    assert_eq!(done.json(), direct.json(), "the same answer as a real-time call");
    // An offline budget is the other way in.
    let budget = submit(&gw, &[("x-tiergate-budget-ms", "60000")], BODY).await;
    assert_eq!(outcome(&gw, &budget).await.status, 200);
    assert_eq!(
        batch.sim.stats("m").expect("stats").requests,
        2,
        "jobs ran on the batch pool"
    );
    let unknown = get(gw.http_addr(), "/v1/jobs/job_nope").await;
    assert_eq!(unknown.status, 404);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_job() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("idem", &rt.url(), &batch.url())).await;
    let headers = [("prefer", "respond-async"), ("idempotency-key", "order-42")];
    let first = submit(&gw, &headers, BODY).await;
    outcome(&gw, &first).await;
    let again = infer(gw.http_addr(), "m", &headers, BODY).await;
    assert_eq!(again.status, 202);
    assert_eq!(again.header("location"), Some(first.as_str()));
    assert_eq!(again.json()["existing"], true);
    assert_eq!(again.json()["status"], "succeeded");
    assert_eq!(batch.sim.stats("m").expect("stats").requests, 1, "run once");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn retryable_failures_retry_then_fail_with_the_last_error() {
    let rt = backend(&["m"]).await;
    let dead = dead_addr().await;
    let gw = gateway_with(fast_retries(), &policy("dead", &rt.url(), &format!("http://{dead}"))).await;
    let location = submit(&gw, &ASYNC, BODY).await;
    let failed = outcome(&gw, &location).await;
    assert_eq!(failed.status, 502, "{}", failed.text());
    assert_eq!(failed.header("x-tiergate-job-status"), Some("failed"));
    let error = failed.json()["error"]["message"]
        .as_str()
        .expect("OpenAI's error object")
        .to_owned();
    assert!(
        error.contains("unreachable") && error.contains("attempt 3 of 3; giving up"),
        "{error}"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_request_the_backend_refuses_is_kept_as_its_answer() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("refused", &rt.url(), &batch.url())).await;
    let poison = r#"{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1,1],"data":["poison"]}]}"#;
    let location = submit(&gw, &ASYNC, poison).await;
    let refused = outcome(&gw, &location).await;
    assert_eq!(refused.status, 400, "the backend's own status");
    assert_eq!(refused.header("x-tiergate-job-status"), Some("failed"));
    assert!(
        refused.text().contains("poison"),
        "the backend's own message: {}",
        refused.text()
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_cancelled_job_gives_no_result() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("cancel", &rt.url(), &batch.url())).await;
    batch.sim.hold();
    let location = submit(&gw, &ASYNC, BODY).await;
    wait_for(&batch, |s| s.requests == 1).await; // running: at the held backend
    let cancelled = send("DELETE", gw.http_addr(), &location, &[], "").await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json()["status"], "cancelled");
    batch.sim.release();
    let gone = get(gw.http_addr(), &location).await;
    assert_eq!(gone.status, 410, "{}", gone.text());
    let again = send("DELETE", gw.http_addr(), &location, &[], "").await;
    assert_eq!(again.status, 200, "cancelling twice is harmless");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn offline_jobs_wait_for_spare_capacity_and_micro_batch_traffic_goes_first() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("spare", &rt.url(), &batch.url())).await;
    batch.sim.hold();
    let busy = {
        let addr = gw.http_addr();
        tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "5000")], BODY).await })
    };
    wait_for(&batch, |s| s.requests == 1).await;
    let mut jobs = Vec::new();
    for _ in 0..10 {
        jobs.push(submit(&gw, &ASYNC, BODY).await);
    }
    let interactive = {
        let addr = gw.http_addr();
        tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "5000")], BODY).await })
    };
    batch.sim.release();
    assert_eq!(busy.await.expect("task").status, 200);
    let interactive = interactive.await.expect("task");
    assert_eq!(interactive.status, 200);
    assert_eq!(
        interactive.header("x-tiergate-batch-size"),
        Some("2"),
        "not merged with offline jobs"
    );
    for job in &jobs {
        assert_eq!(outcome(&gw, job).await.status, 200);
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(stats.rows, 2 + 2 + 20, "every job ran once");
    assert!(
        stats.batch_sizes.get(&2).copied().unwrap_or(0) >= 2,
        "the two callers' batches: {:?}",
        stats.batch_sizes
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn grpc_calls_classified_offline_are_told_to_use_http() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("grpc", &rt.url(), &batch.url())).await;
    let mut c = common::grpc::client(gw.grpc_addr()).await;
    let mut req = tonic::Request::new(common::grpc::fp32_request("", &[[0.0, 0.0]]));
    req.set_timeout(Duration::from_secs(60));
    let err = c.model_infer(req).await.expect_err("no async answers over gRPC");
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(err.message().contains("only over HTTP"), "{}", err.message());
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn accepted_jobs_survive_a_restart_and_run_once() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy("restart", &rt.url(), &batch.url());
    let config = config();
    batch.sim.hold();
    let gw = Gateway::start(&config, common::policy(&text)).await.expect("starts");
    let mut jobs = Vec::new();
    for _ in 0..5 {
        jobs.push(submit(&gw, &ASYNC, BODY).await);
    }
    wait_for(&batch, |s| s.requests == 1).await; // one batch is running at the backend
    gw.stop().await.expect("stops");
    batch.sim.release();
    // The store's file is free once the old gateway's last handle is gone.
    let limit = Instant::now() + Duration::from_secs(10);
    let gw = loop {
        match Gateway::start(&config, common::policy(&text)).await {
            Ok(gw) => break gw,
            Err(e) => {
                assert!(Instant::now() < limit, "the store never reopened: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    for job in &jobs {
        let done = outcome(&gw, job).await;
        assert_eq!(done.status, 200, "{}", done.text());
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_inputs_own_parameters_reach_the_backend_on_every_tier() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("own", &rt.url(), &batch.url())).await;
    // The simulator multiplies OUTPUT1 by the first input's own `scale`.
    let body =
        r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,3],"parameters":{"scale":1000},"data":[1,1,1]}]}"#;
    let scaled = |answer: &Answer| answer.json()["outputs"][1]["data"][0].as_f64();
    let realtime = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], body).await;
    assert_eq!(realtime.tier().0, Some("realtime"));
    let batched = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "5000")], body).await;
    assert_eq!(batched.tier().0, Some("micro_batch"));
    let location = submit(&gw, &ASYNC, body).await;
    let offline = outcome(&gw, &location).await;
    for (tier, answer) in [
        ("realtime", &realtime),
        ("micro_batch", &batched),
        ("offline", &offline),
    ] {
        assert_eq!(answer.status, 200, "{tier}: {}", answer.text());
        assert_eq!(scaled(answer), Some(3000.0), "{tier}: {}", answer.text());
    }
}
