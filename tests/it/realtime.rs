//! The real-time tier under pressure: shedding at the limit, deadlines, dead backends,
//! balancing.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test]
async fn sheds_at_the_concurrency_limit_and_never_calls_past_it() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await; // max_concurrency = 4
    let addr = gw.http_addr();
    rt.sim.hold();
    let held: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await }))
        .collect();
    wait_for(&rt, |s| s.in_flight == 4).await;
    for _ in 0..6 {
        let a = infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        assert_eq!(a.status, 503, "{}", a.text());
        assert_eq!(a.header("retry-after"), Some("1"));
        assert_eq!(a.tier(), (Some("realtime"), Some("budget_realtime")));
        assert!(a.json()["error"]
            .as_str()
            .expect("error")
            .contains("max_concurrency 4 reached"));
    }
    rt.sim.release();
    for h in held {
        assert_eq!(h.await.expect("task").status, 200);
    }
    let stats = rt.sim.stats("m").expect("stats");
    assert_eq!(
        (stats.requests, stats.max_in_flight),
        (4, 4),
        "shed requests never reached the backend"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_passed_deadline_is_504_and_the_backend_call_is_dropped() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    rt.sim.hold();
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY).await;
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(a.json()["error"]
        .as_str()
        .expect("error")
        .contains("the call was dropped"));
    // the backend sees its caller go away: the handler is cancelled, not answered
    wait_for(&rt, |s| s.cancelled == 1).await;
    rt.sim.release();
    assert_eq!(
        rt.sim.stats("m").expect("stats").batches,
        0,
        "the dropped call never ran"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_zero_budget_is_a_passed_deadline_and_a_zero_kserve_timeout_is_none() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    // A zero budget can never be met: 504 without a retry hint, as gRPC answers a
    // deadline that has passed; nothing reaches the backend.
    for header in [("x-tiergate-budget-ms", "0"), ("grpc-timeout", "0m")] {
        let a = infer(gw.http_addr(), "m", &[header], BODY).await;
        assert_eq!(
            (a.status, a.header("retry-after")),
            (504, None),
            "{header:?}: {}",
            a.text()
        );
        assert!(
            a.text().contains(header.0),
            "the message names {}: {}",
            header.0,
            a.text()
        );
    }
    let mut grpc = common::grpc::client(gw.grpc_addr()).await;
    let mut call = tonic::Request::new(common::grpc::fp32_request("g", &[[1.0, 2.0]]));
    call.metadata_mut()
        .insert("x-tiergate-budget-ms", "0".parse().expect("ascii"));
    let status = grpc.model_infer(call).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(rt.sim.stats("m").expect("stats").requests, 0);
    // A KServe `timeout` of 0 is no timeout (as Triton reads it): the route default.
    let body =
        r#"{"parameters":{"timeout":0},"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[1,2]}]}"#;
    let a = infer(gw.http_addr(), "m", &[], body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_budget_reserve_ends_a_stalled_call_before_the_whole_budget() {
    let rt = backend(&["m"]).await;
    let policy = route(&rt.url(), &rt.url(), "realtime = true", "realtime_below = \"5s\"");
    let mut refused = config();
    refused.limits.budget_reserve = 0.7;
    let err = tiergate::app::Gateway::start(&refused, common::policy(&policy))
        .await
        .expect_err("a reserve over half the budget is refused");
    assert!(err.to_string().contains("limits.budget_reserve: must be"), "{err}");
    assert!(err.to_string().contains("got 0.7"), "{err}");
    let mut config = config();
    config.limits.budget_reserve = 0.5;
    let gw = gateway_with(config, &policy).await;
    rt.sim.hold();
    let started = Instant::now();
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    let took = started.elapsed();
    assert_eq!(a.status, 504, "{}", a.text());
    assert_eq!(a.tier(), (Some("realtime"), Some("budget_realtime")));
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_millis(1900),
        "half of the 2 s budget is kept back: the call ends at 1 s, not 2 s ({took:?})"
    );
    rt.sim.release();
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_dead_backend_is_502_quickly() {
    let dead = format!("http://{}", dead_addr().await);
    let gw = gateway(&route_r(&dead, &dead).flags(&["realtime"]).toml()).await;
    let started = Instant::now();
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert!(
        a.json()["error"].as_str().expect("error").contains("is unreachable"),
        "{}",
        a.text()
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "failed fast, inside the budget"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn balances_over_endpoints_and_steps_around_a_dead_one() {
    let a = backend(&["m"]).await;
    let b = backend(&["m"]).await;
    let dead = format!("http://{}", dead_addr().await);
    let policy = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{}\", \"{}\"]\n",
        a.url(),
        b.url()
    );
    let gw = gateway(&policy).await;
    for _ in 0..40 {
        assert_eq!(infer(gw.http_addr(), "m", &[], BODY).await.status, 200);
    }
    let (na, nb) = (
        a.sim.stats("m").expect("a").requests,
        b.sim.stats("m").expect("b").requests,
    );
    assert_eq!(na + nb, 40);
    assert!(na > 0 && nb > 0, "both endpoints served: {na} / {nb}");
    gw.stop().await.expect("stops");

    let policy = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{dead}\", \"{}\"]\n",
        a.url()
    );
    let gw = gateway(&policy).await;
    for i in 0..20 {
        // A trace of its own for each call, so what the endpoint saw last is this call's.
        let trace = format!("{:032x}", 0x4bf9_2f35_77b3_4da6_u128 + i);
        let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
        assert_eq!(
            infer(gw.http_addr(), "m", &[("traceparent", &traceparent)], BODY)
                .await
                .status,
            200,
            "a connect failure moves to the live endpoint"
        );
        // The request tried on the live endpoint is the whole request, headers and all.
        let seen = a.sim.stats("m").expect("a").last_traceparent.expect("a traceparent");
        assert!(
            seen.contains(&trace),
            "call {i}: the client's trace reached the live endpoint: {seen}"
        );
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn speaks_http2_to_backends_when_the_pool_says_so() {
    let rt = backend(&["m"]).await;
    let policy = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{}\"]\nhttp2 = true\n",
        rt.url()
    );
    let gw = gateway(&policy).await;
    for _ in 0..3 {
        let a = infer(gw.http_addr(), "m", &[], BODY).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(rt.sim.stats("m").expect("stats").requests, 3);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_steps_of_a_sequence_go_to_one_endpoint_one_at_a_time_in_order() {
    let (one, two) = (backend(&["m"]).await, backend(&["m"]).await);
    let policy = format!(
        "[routes.r]\nmodels = [\"m\"]\nrealtime_below = \"20s\"\n[routes.r.realtime]\nendpoints = [\"{}\", \"{}\"]\nmax_concurrency = 64\n",
        one.url(),
        two.url()
    );
    let gw = gateway(&policy).await;
    // A long budget, all of it real time: the test holds the backends for a while.
    sequence_steps_in_order(&gw, (&one, &two), "realtime", "15000").await;
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_sequence_step_is_never_taken_offline() {
    let be = backend(&["m"]).await;
    let gw = gateway(&route_r(&be.url(), &be.url()).flags(&["realtime", "offline"]).toml()).await;
    let body =
        r#"{"parameters":{"sequence_id":5},"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1]}]}"#;
    let answer = infer(gw.http_addr(), "m", &[("prefer", "respond-async")], body).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(
        answer.text().contains("sequence 5 cannot be served offline"),
        "{}",
        answer.text()
    );
    gw.stop().await.expect("stops");
}
