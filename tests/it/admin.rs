//! The admin API on its own listener: authenticated, validated, versioned (ETag and
//! If-Match), written back to the policy files, audited, dry-run and rollback; flag
//! flips under load lose nothing and each request follows the flag of its policy version.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::{Gateway, StartError};
use tiergate::config::Config;
use tokio::sync::Notify;

const TOKEN: &str = "test-admin-token-0123456789abcdef";

struct Admined {
    gw: Gateway,
    admin: SocketAddr,
    dir: tempfile::TempDir,
    config: Config,
}

impl Admined {
    fn file(&self) -> PathBuf {
        self.dir.path().join("routes.toml")
    }
    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.config.data_dir.join("policy/audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit lines are JSON"))
            .collect()
    }
    /// One authenticated admin call, without a socket (`Admin::answer`).
    async fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut all = vec![("x-tiergate-actor", "alice")];
        all.extend_from_slice(headers);
        admin_call(&self.gw, TOKEN, (method, path), &all, body).await
    }
    async fn set_flag(&self, flag: &str, value: &str) -> Answer {
        self.call("PUT", &format!("/admin/routes/r/flags/{flag}"), &[], value)
            .await
    }
    async fn tier(&self) -> Answer {
        infer(self.gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await
    }
}

/// A gateway serving route `r` (model `m`, micro-batch off) from a policy directory,
/// with the admin API on and watching the directory.
async fn admined(rt: &Backend, batch: &Backend) -> Admined {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "# The admin test's policy.\n{}",
        route(
            &rt.url(),
            &batch.url(),
            "realtime = true\nmicro_batch = false # flipped by the test",
            ""
        )
    );
    std::fs::write(dir.path().join("routes.toml"), text).expect("write");
    let (mut gw, config) = admin_gateway(dir.path(), TOKEN).await;
    gw.watch_policy(dir.path()).expect("watches");
    let admin = gw.admin_addr().expect("the admin API is on");
    Admined { gw, admin, dir, config }
}

/// Answers by the policy version that served them: (status, tier, reason).
type Seen = HashMap<u64, Vec<(u16, String, String)>>;

#[tokio::test]
async fn flipping_micro_batch_under_load_loses_nothing_and_each_request_follows_its_version() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = Arc::new(admined(&rt, &batch).await);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let progress = Arc::new(Notify::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (a, seen, progress, stop) = (a.clone(), seen.clone(), progress.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = a.tier().await;
                let version: u64 = r
                    .header("x-tiergate-policy-version")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tier, reason) = r.tier();
                let entry = (r.status, tier.unwrap_or("").to_owned(), reason.unwrap_or("").to_owned());
                seen.lock().expect("lock").entry(version).or_default().push(entry);
                progress.notify_waiters();
            }
        }));
    }
    // Flip the flag six times, each time waiting until the load has been served at least
    // 20 times under the new version.
    let mut flag_of: HashMap<u64, bool> = HashMap::from([(1, false)]);
    for (i, on) in [true, false, true, false, true, false].into_iter().enumerate() {
        let answer = a.set_flag("micro_batch", if on { "true" } else { "\"off\"" }).await;
        assert_eq!(answer.status, 200, "flip {i}: {}", answer.text());
        let version = answer.json()["version_after"].as_u64().expect("version");
        assert_eq!(version, i as u64 + 2);
        flag_of.insert(version, on);
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let notified = progress.notified();
                if seen.lock().expect("lock").get(&version).is_some_and(|v| v.len() >= 20) {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("the load was served under the new version");
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let seen = seen.lock().expect("lock");
    let mut total = 0;
    for (version, answers) in seen.iter() {
        let on = flag_of[version];
        for (status, tier, reason) in answers {
            total += 1;
            assert_eq!(*status, 200, "nothing is lost (version {version})");
            let expected = if on {
                ("micro_batch", "budget_micro_batch")
            } else {
                ("realtime", "micro_batch_off")
            };
            assert_eq!(
                (tier.as_str(), reason.as_str()),
                expected,
                "version {version} has micro_batch={on}"
            );
        }
    }
    assert!(total >= 6 * 20, "{total} requests");
    assert_eq!(a.audit().len(), 6, "one audit entry per accepted change");
    let text = std::fs::read_to_string(a.file()).expect("read");
    assert!(
        text.contains("micro_batch = false # flipped by the test") && text.starts_with("# The admin test's policy."),
        "written back with its comments:\n{text}"
    );
}

#[tokio::test]
async fn unauthenticated_and_wrong_token_calls_get_401_and_change_nothing() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let before = std::fs::read_to_string(a.file()).expect("read");
    for headers in [
        vec![],
        vec![("authorization", "Bearer wrong-token-0123456789abcdef")],
        vec![("authorization", "Basic YWRtaW46YWRtaW4=")],
    ] {
        for (method, path) in [
            ("PUT", "/admin/routes/r/flags/micro_batch"),
            ("GET", "/admin/policy"),
            ("GET", "/nothing"),
        ] {
            let r = send(method, a.admin, path, &headers, "true").await;
            assert_eq!(r.status, 401, "{method} {path} with {headers:?}: {}", r.text());
            assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"tiergate-admin\""));
        }
    }
    assert_eq!(std::fs::read_to_string(a.file()).expect("read"), before);
    assert_eq!(a.gw.policy().load().version(), 1);
    assert!(a.audit().is_empty());
    let ok = a.call("GET", "/admin/policy", &[], "").await;
    assert_eq!(ok.status, 200, "{}", ok.text());
}

#[tokio::test]
async fn paths_that_are_not_plain_are_refused_and_the_console_page_takes_no_query() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let auth = format!("Bearer {TOKEN}");
    for path in [
        "/admin/ui/./index.html",
        "/admin/ui/../policy",
        "/admin//policy",
        "/admin/%2e%2e/policy",
        "/admin/ui%2Findex.html",
        "/admin/policy/..",
    ] {
        for headers in [vec![], vec![("authorization", auth.as_str())]] {
            let r = send("GET", a.admin, path, &headers, "").await;
            assert_eq!(r.status, 400, "{path}: {}", r.text());
            assert!(r.text().contains("plainly"), "{path}: {}", r.text());
        }
    }
    let page = send("GET", a.admin, "/admin/ui/index.html", &[], "").await;
    assert_eq!(page.status, 200, "the page itself");
    let queried = send("GET", a.admin, "/admin/ui/index.html?/../../stats", &[], "").await;
    assert_eq!(
        queried.status,
        401,
        "not the page, and no data without the token: {}",
        queried.text()
    );
    let ok = send(
        "GET",
        a.admin,
        "/admin/policy/",
        &[("authorization", auth.as_str())],
        "",
    )
    .await;
    assert_eq!(ok.status, 200, "a trailing slash is plain: {}", ok.text());
}

#[tokio::test]
async fn admin_paths_are_not_served_on_the_data_or_metrics_ports() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let auth = format!("Bearer {TOKEN}");
    for addr in [a.gw.http_addr(), a.gw.metrics_addr()] {
        for (method, path) in [("GET", "/admin/policy"), ("PUT", "/admin/routes/r/flags/micro_batch")] {
            let r = send(method, addr, path, &[("authorization", &auth)], "true").await;
            assert_eq!(r.status, 404, "{method} {path} on {addr}");
        }
    }
    assert_eq!(a.gw.policy().load().version(), 1);
}

#[tokio::test]
async fn concurrent_edits_with_the_same_etag_one_wins_the_other_gets_412() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let got = a.call("GET", "/admin/routes/r", &[], "").await;
    assert_eq!(got.status, 200);
    let etag = got.header("etag").expect("ETag").to_owned();
    assert_eq!(got.json()["spec"]["flags"]["micro_batch"], json!(false));
    let patch = |percent: u32| {
        let etag = etag.clone();
        let a = &a;
        async move {
            let body = json!({"flags": {"micro_batch": true, "micro_batch_percent": percent}}).to_string();
            a.call("PATCH", "/admin/routes/r", &[("if-match", &etag)], &body).await
        }
    };
    let (x, y) = tokio::join!(patch(10), patch(20));
    let mut statuses = [x.status, y.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 412], "{} / {}", x.text(), y.text());
    let stale = if x.status == 412 { &x } else { &y };
    assert_eq!(stale.json()["error"]["code"], "stale_version");
    let winner = if x.status == 200 { &x } else { &y };
    let fresh = winner.header("etag").expect("new ETag").to_owned();
    assert_ne!(fresh, etag);
    // The winner's ETag is current: an edit with it goes through.
    let third = a.set_flag("micro_batch_percent", "100").await;
    assert_eq!(third.status, 200);
    let stale_again = a.call("PATCH", "/admin/routes/r", &[("if-match", &fresh)], "{}").await;
    assert_eq!(stale_again.status, 412, "an ETag from before the third edit is stale");
    assert_eq!(a.audit().len(), 2);
}

#[tokio::test]
async fn invalid_edits_get_400_with_every_problem_and_its_path() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let body = json!({"micro_batch": {"max_batch": 0, "max_wait": "1h"}, "realtime": {"endpoints": ["http://169.254.169.254"]}});
    let r = a.call("PATCH", "/admin/routes/r", &[], &body.to_string()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "invalid_policy");
    let paths: Vec<&str> = v["error"]["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    for expected in ["routes.r.micro_batch.max_batch", "routes.r.micro_batch.max_wait"] {
        assert!(paths.contains(&expected), "{expected} in {paths:?}");
    }
    // Outside the backend allowlist (SSRF through the admin API): refused with its path.
    let ssrf = json!({"realtime": {"endpoints": ["http://169.254.169.254"]}});
    let r = a.call("PATCH", "/admin/routes/r", &[], &ssrf.to_string()).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["problems"][0]["path"],
        "routes.r.realtime.endpoints[0]"
    );
    // A typo'd key, a bad flag value, an unknown flag, bad JSON.
    let r = a
        .call("PATCH", "/admin/routes/r", &[], r#"{"flags": {"micro_bach": true}}"#)
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["problems"][0]["path"].as_str()),
        (400, Some("routes.r.flags.micro_bach"))
    );
    assert_eq!(a.set_flag("micro_batch", "\"maybe\"").await.status, 400);
    assert_eq!(a.set_flag("turbo", "true").await.status, 400);
    assert_eq!(a.call("PATCH", "/admin/routes/r", &[], "{not json").await.status, 400);
    assert_eq!(a.call("PATCH", "/admin/routes/nope", &[], "{}").await.status, 404);
    assert_eq!(a.gw.policy().load().version(), 1, "nothing changed");
    assert!(a.audit().is_empty());
}

#[tokio::test]
async fn dry_run_reports_decisions_and_changes_nothing_then_rollback_restores_them() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    let before = std::fs::read_to_string(a.file()).expect("read");
    let dry = a
        .call("PUT", "/admin/routes/r/flags/micro_batch?dry_run=true", &[], "true")
        .await;
    assert_eq!(dry.status, 200, "{}", dry.text());
    let v = dry.json();
    assert_eq!(
        (v["dry_run"].as_bool(), v["changed"].as_bool()),
        (Some(true), Some(true))
    );
    let decisions = v["decisions"].as_array().expect("decisions");
    assert!(
        decisions
            .iter()
            .any(|d| d["request"] == "model m, budget 300ms to under 1m"
                && d["before"] == "realtime (micro_batch_off)"
                && d["after"] == "micro_batch (budget_micro_batch)"),
        "{decisions:#?}"
    );
    assert!(v["diff"].as_str().expect("diff").contains("+micro_batch = true"));
    assert_eq!(
        std::fs::read_to_string(a.file()).expect("read"),
        before,
        "dry run writes nothing"
    );
    assert_eq!(a.tier().await.tier(), (Some("realtime"), Some("micro_batch_off")));
    assert!(a.audit().is_empty());

    assert_eq!(a.set_flag("micro_batch", "\"on\"").await.status, 200);
    let on = a.tier().await;
    assert_eq!(
        (on.tier().0, on.header("x-tiergate-policy-version")),
        (Some("micro_batch"), Some("2"))
    );
    let history = a.call("GET", "/admin/policy/history", &[], "").await.json();
    assert_eq!(history["current"], 2);
    assert_eq!(history["versions"][0]["who"], "admin (alice)");

    let back = a
        .call(
            "POST",
            "/admin/policy/rollback",
            &[("if-match", "\"v2\"")],
            r#"{"version": 1}"#,
        )
        .await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(back.json()["version_after"], 3);
    let restored = a.tier().await;
    assert_eq!(
        restored.tier(),
        (Some("realtime"), Some("micro_batch_off")),
        "decisions are back"
    );
    assert_eq!(restored.header("x-tiergate-policy-version"), Some("3"));
    assert_eq!(
        std::fs::read_to_string(a.file()).expect("read"),
        before,
        "the file is back too"
    );
    let audit = a.audit();
    assert_eq!(audit.len(), 2, "one entry per accepted change");
    assert_eq!(audit[1]["action"], "rollback");
    assert_eq!(
        (audit[1]["version_before"].as_u64(), audit[1]["version_after"].as_u64()),
        (Some(2), Some(3))
    );
}

#[tokio::test]
async fn explain_describes_the_decision_and_the_learned_cost_without_sending() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let a = admined(&rt, &batch).await;
    assert_eq!(a.set_flag("micro_batch", "true").await.status, 200);
    for _ in 0..10 {
        assert_eq!(a.tier().await.status, 200);
    }
    let served_before = batch.sim.stats("m").expect("stats").requests;
    let r = a
        .call("POST", "/admin/explain", &[], r#"{"model": "m", "budget_ms": 2000}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["tier"], "micro_batch");
    assert_eq!(v["result"]["reason"], "budget_micro_batch");
    assert_eq!(v["result"]["budget_source"], "x-tiergate-budget-ms");
    let cost = &v["micro_batch"]["learned_cost"];
    assert!(cost["samples"].as_u64().is_some_and(|n| n >= 8), "{v:#}");
    assert!(cost["full_batch_ms"].as_f64().is_some());
    assert_eq!(
        batch.sim.stats("m").expect("stats").requests,
        served_before,
        "explain sends nothing"
    );
    let async_ = a
        .call(
            "POST",
            "/admin/explain",
            &[],
            r#"{"route": "r", "headers": {"prefer": "respond-async"}}"#,
        )
        .await;
    assert_eq!(async_.json()["result"]["reason"], "offline_off");
    let none = a.call("POST", "/admin/explain", &[], r#"{"model": "zzz"}"#).await;
    assert_eq!(none.status, 404);
    let bad = a
        .call("POST", "/admin/explain", &[], r#"{"model": "m", "path": "/x"}"#)
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn the_admin_api_stays_off_without_a_token_and_refuses_insecure_exposure() {
    let rt = backend(&["m"]).await;
    let toml = route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml();
    let mut config = config();
    config.listen.admin = "127.0.0.1:0".parse().expect("addr");
    let gw = Gateway::start(&config, policy(&toml)).await.expect("starts");
    assert_eq!(gw.admin_addr(), None, "no token: no admin listener");
    gw.stop().await.expect("stops");

    let mut config = common::config();
    config.listen.admin = "0.0.0.0:0".parse().expect("addr");
    config.admin.insecure_no_auth = true;
    let err = Gateway::start(&config, policy(&toml)).await.expect_err("refused");
    assert!(matches!(err, StartError::Invalid(_)), "{err}");
    assert!(
        err.to_string()
            .contains("admin.insecure_no_auth: is only allowed on a loopback address"),
        "{err}"
    );
}

#[tokio::test]
async fn a_policy_outside_the_backend_allowlist_does_not_start() {
    let toml = route_r("http://10.1.2.3:8000", "http://127.0.0.1:1")
        .flags(&["realtime"])
        .toml();
    let err = Gateway::start(&common::config(), policy(&toml))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("routes.r.realtime.endpoints[0]"), "{err}");
    let mut config = common::config();
    config.backends.allow = vec!["10.0.0.0/8".into(), "127.0.0.1".into()];
    let gw = Gateway::start(&config, policy(&toml)).await.expect("allowed");
    gw.stop().await.expect("stops");
}
