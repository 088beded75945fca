//! Each tier decision for each kind of budget and flag, over the HTTP door.

use crate::common;

use common::*;

#[tokio::test]
async fn every_budget_source_reaches_the_right_tier() {
    let rt = backend(&["m"]).await;
    let batch = backend(&["m"]).await;
    let gw = gateway(
        &route_r(&rt.url(), &batch.url())
            .only(&["realtime", "micro_batch", "offline"])
            .set("offline_from", "60s")
            .toml(),
    )
    .await;
    let addr = gw.http_addr();
    let timeout_body = |us: u64| {
        BODY.replacen(
            "\"inputs\"",
            &format!("\"parameters\":{{\"timeout\":{us}}},\"inputs\""),
            1,
        )
    };
    // (headers, body, status, tier, reason)
    type Case = (
        Vec<(&'static str, &'static str)>,
        String,
        u16,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            vec![("x-tiergate-budget-ms", "100")],
            BODY.into(),
            200,
            "realtime",
            "budget_realtime",
        ),
        (
            vec![("grpc-timeout", "50m")],
            BODY.into(),
            200,
            "realtime",
            "budget_realtime",
        ),
        (vec![], timeout_body(100_000), 200, "realtime", "budget_realtime"),
        (vec![], BODY.into(), 200, "realtime", "budget_realtime"), // route default 200 ms
        (
            vec![("x-tiergate-budget-ms", "2000")],
            BODY.into(),
            200,
            "micro_batch",
            "budget_micro_batch",
        ),
        (
            vec![("grpc-timeout", "2S")],
            BODY.into(),
            200,
            "micro_batch",
            "budget_micro_batch",
        ),
        (
            vec![],
            timeout_body(2_000_000),
            200,
            "micro_batch",
            "budget_micro_batch",
        ),
        (
            vec![("x-tiergate-budget-ms", "60000")],
            BODY.into(),
            202,
            "offline",
            "budget_offline",
        ),
        (
            vec![("prefer", "respond-async")],
            BODY.into(),
            202,
            "offline",
            "prefer_async",
        ),
        // the header wins over the KServe parameter
        (
            vec![("x-tiergate-budget-ms", "100")],
            timeout_body(2_000_000),
            200,
            "realtime",
            "budget_realtime",
        ),
    ];
    let mut jobs = Vec::new();
    for (headers, body, status, tier, reason) in cases {
        let answer = infer(addr, "m", &headers, &body).await;
        assert_eq!(
            (answer.status, answer.tier()),
            (status, (Some(tier), Some(reason))),
            "{headers:?} {body}: {}",
            answer.text()
        );
        if status == 202 {
            jobs.push(answer.header("location").expect("Location").to_owned());
        }
    }
    for job in jobs {
        // Poll as a client would until the offline job has run.
        eventually(std::time::Duration::from_secs(10), "the offline job runs", || async {
            (get(addr, &job).await.status != 202).then_some(())
        })
        .await;
    }
    assert_eq!(
        batch.sim.stats("m").expect("stats").rows,
        5 * 2,
        "the rows of the three micro_batch requests and the two offline jobs (batched as the pool saw fit), \
         and only those, reached the batch pool"
    );
    assert_eq!(rt.sim.stats("m").expect("stats").requests, 5);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn flags_switch_tiers_and_unmeetable_budgets_are_refused() {
    let rt = backend(&["m"]).await;
    let batch = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &batch.url()).only(&["realtime"]).toml()).await;
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    assert_eq!((a.status, a.tier()), (200, (Some("realtime"), Some("micro_batch_off"))));
    let a = infer(gw.http_addr(), "m", &[("prefer", "respond-async")], BODY).await;
    assert_eq!((a.status, a.tier()), (200, (Some("realtime"), Some("offline_off"))));
    gw.stop().await.expect("stops");

    let only_batch = route_r(&rt.url(), &batch.url()).only(&["micro_batch"]);
    let gw = gateway(&only_batch.toml()).await;
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY).await;
    assert_eq!((a.status, a.tier()), (503, (None, Some("no_tier"))));
    assert!(
        a.text().contains("calls for the realtime tier, which is off"),
        "{}",
        a.text()
    );
    assert!(
        a.header("retry-after").is_none(),
        "retrying cannot help a policy refusal"
    );
    gw.stop().await.expect("stops");

    let best = gateway(&only_batch.set("when_unmet", "best_effort").toml()).await;
    let a = infer(best.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY).await;
    assert_eq!(a.tier(), (Some("micro_batch"), Some("best_effort")));
    best.stop().await.expect("stops");

    let gw = gateway(&route_r(&rt.url(), &batch.url()).only(&[]).toml()).await;
    let a = infer(gw.http_addr(), "m", &[], BODY).await;
    assert_eq!((a.status, a.tier()), (503, (None, Some("route_disabled"))));
    gw.stop().await.expect("stops");
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        2,
        "only the two realtime answers reached the backend"
    );
}

#[tokio::test]
async fn rollout_percent_is_deterministic_per_request_key() {
    let rt = backend(&["m"]).await;
    let batch = backend(&["m"]).await;
    let route = route_r(&rt.url(), &batch.url()).flags(&["realtime", "micro_batch"]);
    let gw = gateway(&route.set("flags.micro_batch_percent", 50).toml()).await;
    let mut tiers = Vec::new();
    for i in 0..40 {
        let key = format!("key-{i}");
        let first = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "1000"), ("x-request-id", &key)],
            BODY,
        )
        .await;
        let again = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "1000"), ("x-request-id", &key)],
            BODY,
        )
        .await;
        assert_eq!(first.tier(), again.tier(), "the same key lands on the same side");
        tiers.push(first.header("x-tiergate-tier").expect("tier").to_owned());
    }
    let batched = tiers.iter().filter(|t| *t == "micro_batch").count();
    assert!((8..=32).contains(&batched), "about half roll out: {batched}/40");
    gw.stop().await.expect("stops");
}
