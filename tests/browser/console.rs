//! The console in a real browser: Debian's chromium driven through its chromedriver
//! against a gateway with simulated pools and traffic (see
//! tests/conformance/console_browser.py for what it checks).

use crate::common;

use std::time::Duration;

use common::*;

const TOKEN: &str = "console-admin-token";

/// Debian's chromium and chromedriver, installed when missing (tests/conformance/browser.sh).
fn browser() -> (String, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("tests/conformance/browser.sh"))
        .output()
        .expect("browser.sh runs");
    assert!(
        out.status.success(),
        "no browser: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines().map(str::to_owned);
    (lines.next().expect("driver"), lines.next().expect("browser"))
}

#[tokio::test]
async fn a_browser_logs_in_sees_live_rates_and_changes_the_policy_through_a_dry_run() {
    let (realtime, batch) = (backend(&["m", "n", "o"]).await, backend(&["m"]).await);
    let candidate = backend(&["n", "o"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut policy = format!(
        "[routes.ui]\nmodels = [\"m\"]\n[routes.ui.flags]\nrealtime = true\nmicro_batch = false\ncache = true\n\
         [routes.ui.realtime]\nendpoints = [\"{}\"]\nmax_concurrency = 16\ncost_per_hour = 2.48\n\
         [routes.ui.micro_batch]\nendpoints = [\"{}\"]\n[routes.ui.cache]\n",
        realtime.url(),
        batch.url()
    );
    // Two routes shadowing a candidate that answers as their primary does: `ro`'s gate
    // is met after five comparisons, `held`'s never.
    for (route, model, gate) in [("ro", "n", 5), ("held", "o", 1_000_000)] {
        policy += &format!(
            "[routes.{route}]\nmodels = [\"{model}\"]\n[routes.{route}.flags]\nrealtime = true\nshadow = true\n\
             [routes.{route}.realtime]\nendpoints = [\"{}\"]\n\
             [routes.{route}.shadow]\ntiers = [\"realtime\"]\npercent = 100\n\
             [routes.{route}.shadow.candidate]\nendpoints = [\"{}\"]\n\
             [routes.{route}.shadow.gate]\nmin_compared = {gate}\n",
            realtime.url(),
            candidate.url()
        );
    }
    // A bulk route whose offline pool takes a second a request, one at a time: its batch
    // is still running when the browser cancels it.
    let slow = tiergate::sim::Profile {
        a: Duration::from_secs(1),
        b: Duration::ZERO,
        floor: Duration::ZERO,
    };
    let bulk = backend_with(vec![tiergate::sim::ModelSpec::new("slow", slow)]).await;
    policy += &format!(
        "[routes.bulk]\nmodels = [\"slow\"]\n[routes.bulk.flags]\nrealtime = true\noffline = true\n\
         [routes.bulk.realtime]\nendpoints = [\"{0}\"]\n\
         [routes.bulk.micro_batch]\nendpoints = [\"{0}\"]\nmax_batch = 1\nmax_in_flight = 1\n",
        bulk.url()
    );
    // An LLM route: its streams on real time and on the batch pool's window, its
    // tenants held to token limits, its tokens priced.
    let llm = backend_with(vec![tiergate::sim::ModelSpec::llm(
        "chat-model",
        tiergate::sim::LlmProfile::named("llm-tiny").expect("profile"),
    )])
    .await;
    policy += &format!(
        "[usage.prices]\nrealtime = {{ prompt = 3.0, completion = 15.0 }}\nmicro_batch = {{ prompt = 2.0, completion = 10.0 }}\n\
         [routes.chat]\nmodels = [\"chat-model\"]\npaths = [\"/v1/chat/completions\"]\n\
         [routes.chat.flags]\nrealtime = true\nmicro_batch = true\n\
         [routes.chat.realtime]\nendpoints = [\"{0}\"]\n\
         [routes.chat.micro_batch]\nendpoints = [\"{0}\"]\n[routes.chat.micro_batch.window]\nmax_sequences = 4\nmax_tokens_in_flight = 4096\n\
         [routes.chat.tokens.default]\ntokens_per_minute = 1000000\ndaily_tokens = 50000000\n",
        llm.url()
    );
    std::fs::write(dir.path().join("ui.toml"), policy).expect("policy");
    let (gw, _config) = admin_gateway(dir.path(), TOKEN).await;
    let batch = bulk_batch(gw.http_addr(), 300).await;
    // Traffic while the browser looks: twenty requests a second until the test ends,
    // every other one asking for a fresh answer (served by a tier), the rest answered
    // by the cache.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (addr, stop) = (gw.http_addr(), stop.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(50));
            let mut fresh = false;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                every.tick().await;
                fresh = !fresh;
                let cache = if fresh { "no-cache" } else { "max-age=60" };
                let headers = [("x-tiergate-budget-ms", "2000"), ("cache-control", cache)];
                infer(addr, "m", &headers, BODY).await;
                for model in ["n", "o"] {
                    infer(addr, model, &[("x-tiergate-budget-ms", "2000")], BODY).await;
                }
                // A chat stream, on real time and on the batch pool's window by turns.
                let budget = if fresh { "200" } else { "2000" };
                let chat = serde_json::json!({"model": "chat-model", "stream": true, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "how is the gateway"}]});
                let headers = [("content-type", "application/json"), ("x-tiergate-budget-ms", budget)];
                send("POST", addr, "/v1/chat/completions", &headers, chat.to_string()).await;
            }
        })
    };
    let (driver, chromium) = browser();
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&out).expect("screenshots dir");
    let admin = format!("http://{}", gw.admin_addr().expect("admin"));
    let data = format!("http://{}", gw.http_addr());
    let args = [
        ("--admin", admin),
        ("--data", data),
        ("--token", TOKEN.to_owned()),
        ("--route", "ui".to_owned()),
        ("--model", "m".to_owned()),
        ("--driver", driver),
        ("--browser", chromium),
        ("--out", out.display().to_string()),
        ("--candidate", candidate.url()),
        ("--batch", batch),
        ("--llm", "chat".to_owned()),
    ];
    let args = args.into_iter().flat_map(|(k, v)| [k.to_owned(), v]).collect();
    let log = out.join("none.log");
    run_conformance(python("console"), "console_browser.py", args, &log).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await.expect("load");
    for page in [
        "login",
        "overview",
        "policy_dry_run",
        "policy",
        "explain",
        "cache",
        "usage",
        "llm",
        "offline",
        "policy_setting",
        "overview_phone",
    ] {
        let shot = out.join(format!("{page}.png"));
        assert!(
            std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000),
            "no screenshot {}",
            shot.display()
        );
    }
}

/// A Batch API batch of `n` requests for the bulk route's model: its id.
async fn bulk_batch(addr: std::net::SocketAddr, n: usize) -> String {
    let file = upload_file(addr, &batch_lines("slow", n), &[]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    create_batch(addr, &file.json()["id"], "slow", &[]).await
}
