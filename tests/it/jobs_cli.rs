//! `tiergate jobs` against a running gateway: submit (following progress), status,
//! results, cancel, and a file with bad lines reported by line number.

use crate::common;

use common::*;
use serde_json::{json, Value};

fn policy(rt: &str, batch: &str) -> String {
    format!(
        "[routes.cli]\nmodels = [\"m\"]\n[routes.cli.flags]\nrealtime = true\noffline = true\n\
         [routes.cli.realtime]\nendpoints = [\"{rt}\"]\n[routes.cli.micro_batch]\nendpoints = [\"{batch}\"]\n"
    )
}

async fn jobs(args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = jobs_code(args).await;
    (code == Some(0), out, err)
}

/// `tiergate jobs ARGS`: (exit code, stdout, stderr).
async fn jobs_code(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .arg("jobs")
        .args(args)
        .output()
        .await
        .expect("runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn line(i: usize, url: &str) -> String {
    json!({"custom_id": format!("r{i}"), "method": "POST", "url": url,
           "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]}})
    .to_string()
}

/// A batch input file of `n` lines for model `m` in `dir`: its path and its lines.
fn input_file(dir: &tempfile::TempDir, n: usize) -> (String, Vec<String>) {
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = (0..n).map(|i| line(i, "/v2/models/m/infer")).collect();
    std::fs::write(&input, lines.join("\n")).expect("write");
    (input.to_str().expect("utf-8").to_owned(), lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_status_results_and_cancel() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy(&rt.url(), &batch.url())).await;
    let url = format!("http://{}", gw.http_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = (0..500).map(|i| line(i, "/v2/models/m/infer")).collect();
    std::fs::write(&input, lines.join("\n")).expect("write");
    let input = input.to_str().expect("utf-8");

    let (ok, stdout, stderr) = jobs(&["submit", input, "--endpoint", "/v2/models/m/infer", "--gateway", &url]).await;
    assert!(ok, "{stderr}");
    let id = stdout.trim().to_owned();
    assert!(id.starts_with("batch_"), "{stdout}");
    assert!(
        stderr.contains("500/500 done, 0 failed (completed)"),
        "progress: {stderr}"
    );
    let end = stderr.lines().last().unwrap_or_default();
    assert!(
        end.starts_with(&format!("{id}: completed in "))
            && end.contains("500 of 500 requests done (")
            && end.contains("/s)"),
        "the elapsed time and rate at the end: {end}"
    );

    let (ok, summary, _) = jobs(&["status", &id, "--gateway", &url]).await;
    assert!(ok);
    assert!(
        summary.starts_with(&format!("{id}: completed, 500 of 500 requests done, 0 failed")),
        "{summary}"
    );
    let (ok, status, _) = jobs(&["status", &id, "--json", "--gateway", &url]).await;
    assert!(ok);
    let status: Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(
        status["request_counts"],
        json!({"total": 500, "completed": 500, "failed": 0})
    );

    let out = dir.path().join("out.jsonl");
    let (ok, _, stderr) = jobs(&["results", &id, "-o", out.to_str().expect("utf-8"), "--gateway", &url]).await;
    assert!(ok, "{stderr}");
    let results = std::fs::read_to_string(&out).expect("results written");
    assert_eq!(results.lines().count(), 500);

    let (ok, cancelled, _) = jobs(&["cancel", &id, "--gateway", &url]).await;
    assert!(ok);
    assert!(
        cancelled.contains("had already ended (completed): nothing was cancelled"),
        "a finished batch stays completed, and says so: {cancelled}"
    );
    let (ok, out, err) = jobs(&["status", "batch_nope", "--gateway", &url]).await;
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("batch_nope: 404 no batch batch_nope"),
        "errors on stderr: {err}"
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        format!("{}\nnot json\n{}", line(0, "/v2/models/m/infer"), line(1, "/nope")),
    )
    .expect("write");
    let (ok, _, stderr) = jobs(&[
        "submit",
        bad.to_str().expect("utf-8"),
        "--endpoint",
        "/v2/models/m/infer",
        "--gateway",
        &url,
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("line 2:") && stderr.contains("line 3:"), "{stderr}");

    let (ok, _, stderr) = jobs(&["status", "batch_nope", "--gateway", "http://127.0.0.1:1"]).await;
    assert!(!ok);
    assert!(stderr.contains("cannot reach the gateway"), "{stderr}");
    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_completes_with_failed_requests_exits_2() {
    let rt = backend(&["m"]).await;
    let dead = format!("http://{}", dead_addr().await);
    let mut config = config();
    config.offline.max_attempts = 1;
    let gw = gateway_with(config, &policy(&rt.url(), &dead)).await;
    let url = format!("http://{}", gw.http_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        (0..3).map(|i| line(i, "/v2/models/m/infer") + "\n").collect::<String>(),
    )
    .expect("write");
    let input = input.to_str().expect("utf-8");
    let (code, _, stderr) = jobs_code(&["submit", input, "--endpoint", "/v2/models/m/infer", "--gateway", &url]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("3 of 3 requests failed"), "{stderr}");
    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_batch_says_how_the_candidate_did_and_its_comparison_is_downloaded() {
    let (batch, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = format!(
        "[routes.cli]\nmodels = [\"m\"]\n[routes.cli.flags]\nrealtime = false\noffline = true\nshadow = true\n\
         [routes.cli.micro_batch]\nendpoints = [\"{}\"]\n\
         [routes.cli.shadow]\npercent = 0\n[routes.cli.shadow.candidate]\nendpoints = [\"{}\"]\n",
        batch.url(),
        candidate.url()
    );
    let gw = gateway(&text).await;
    let url = format!("http://{}", gw.http_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = input_file(&dir, 30);
    let input = input.as_str();
    let submit = [
        "submit",
        input,
        "--endpoint",
        "/v2/models/m/infer",
        "--shadow",
        "--gateway",
        &url,
    ];
    let (ok, stdout, stderr) = jobs(&submit).await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("shadow: 30 of 30 lines compared, 60 rows of 60 within tolerance (agreement 1.0)"),
        "{stderr}"
    );
    let out = dir.path().join("out.jsonl");
    let id = stdout.trim();
    let (ok, _, stderr) = jobs(&["results", id, "-o", out.to_str().expect("utf-8"), "--gateway", &url]).await;
    assert!(ok, "{stderr}");
    let comparison = std::fs::read_to_string(dir.path().join("out.comparison.jsonl")).expect("comparison written");
    assert_eq!(comparison.lines().count(), 30);
    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precomputing_batch_keeps_its_answers_for_the_real_time_calls_after_it() {
    let batch = backend(&["m"]).await;
    let text = format!(
        "[routes.pre]\nmodels = [\"m\"]\n[routes.pre.flags]\nrealtime = false\noffline = true\ncache = true\n\
         [routes.pre.micro_batch]\nendpoints = [\"{}\"]\n[routes.pre.cache]\n",
        batch.url()
    );
    let gw = gateway(&text).await;
    let url = format!("http://{}", gw.http_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, lines) = input_file(&dir, 10);
    let with = |flag: &'static str| {
        [
            "submit",
            &input,
            "--endpoint",
            "/v2/models/m/infer",
            "--precompute",
            flag,
            "--gateway",
            &url,
        ]
        .map(str::to_owned)
    };
    let (ok, _, stderr) = jobs(&with("2h").iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("precompute: its 10 answers are kept in the route's cache for 2h"),
        "{stderr}"
    );
    let first: serde_json::Value = serde_json::from_str(&lines[0]).expect("a line");
    let answer = infer(gw.http_addr(), "m", &[], &first["body"].to_string()).await;
    assert_eq!(answer.header("x-tiergate-cache"), Some("hit"), "{}", answer.text());
    let (code, _, stderr) = jobs_code(&with("9d").iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("must be a duration from 1s to 7d"), "{stderr}");
    gw.stop().await.expect("stops");
}
