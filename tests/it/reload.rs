//! Hot reload from the policy directory: a valid change is swapped in as the next version
//! (visible in `x-tiergate-policy-version` and in decisions), an invalid one is refused
//! and the running policy stays, and a startup setting in a policy file is refused with
//! a message saying a restart is needed.

use crate::common;

use std::time::Duration;

use common::*;

fn route(rt: &str, batch: &str, micro_batch: bool) -> String {
    format!(
        "[routes.hot]\nmodels = [\"m\"]\n[routes.hot.flags]\nrealtime = true\nmicro_batch = {micro_batch}\n\
         [routes.hot.realtime]\nendpoints = [\"{rt}\"]\n[routes.hot.micro_batch]\nendpoints = [\"{batch}\"]\n"
    )
}

/// Polls (as an operator's client would) until the gateway answers with policy `version`.
async fn until_version(addr: std::net::SocketAddr, version: &str) -> Answer {
    let what = format!("policy version {version} arrives");
    eventually(Duration::from_secs(10), &what, || async {
        let a = infer(addr, "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
        (a.header("x-tiergate-policy-version") == Some(version)).then_some(a)
    })
    .await
}

#[tokio::test]
async fn valid_changes_swap_in_and_invalid_ones_are_refused() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hot.toml");
    std::fs::write(&file, route(&rt.url(), &batch.url(), false)).expect("write");
    let mut gw = gateway(&route(&rt.url(), &batch.url(), false)).await;
    gw.watch_policy(dir.path()).expect("watches");
    let addr = gw.http_addr();

    let before = infer(addr, "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    assert_eq!(before.tier(), (Some("realtime"), Some("micro_batch_off")));
    assert_eq!(before.header("x-tiergate-policy-version"), Some("1"));

    std::fs::write(&file, route(&rt.url(), &batch.url(), true)).expect("write");
    let after = until_version(addr, "2").await;
    assert_eq!(
        after.tier(),
        (Some("micro_batch"), Some("budget_micro_batch")),
        "the new flag is live"
    );

    // A typo: refused, the running policy stays.
    std::fs::write(
        &file,
        route(&rt.url(), &batch.url(), true).replace("realtime = true", "realtime = yes"),
    )
    .expect("write");
    let scrape = eventually(Duration::from_secs(10), "the bad edit is seen", || async {
        let scrape = get(gw.metrics_addr(), "/metrics").await.text();
        let rejected = scrape
            .lines()
            .any(|l| l.starts_with("tiergate_policy_reloads_total{result=\"rejected\"}") && !l.ends_with(" 0"));
        rejected.then_some(scrape)
    })
    .await;
    assert!(
        scrape.contains("tiergate_policy_last_reload_ok 0"),
        "the failed reload is visible"
    );
    let kept = infer(addr, "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    assert_eq!(
        kept.header("x-tiergate-policy-version"),
        Some("2"),
        "still the last good policy"
    );
    assert_eq!(kept.tier().0, Some("micro_batch"));

    // Fixed: the next version.
    std::fs::write(&file, route(&rt.url(), &batch.url(), false)).expect("write");
    let fixed = until_version(addr, "3").await;
    assert_eq!(fixed.tier().0, Some("realtime"));
    gw.stop().await.expect("stops");
}

#[test]
fn a_startup_setting_in_a_policy_file_says_a_restart_is_needed() {
    let text = "[listen]\nhttp = \"0.0.0.0:9000\"\n[routes.r]\nmodels = [\"m\"]\n";
    let problems = tiergate::policy::Policy::from_texts(vec![("p.toml".into(), text.into())]).expect_err("refused");
    let text = problems.to_string();
    assert!(
        text.contains("p.toml: listen") && text.contains("needs a restart"),
        "{text}"
    );
}
