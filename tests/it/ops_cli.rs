//! `tiergate flags`, `tiergate policy diff|apply|history|rollback`, `tiergate explain` and
//! `tiergate shadow` against a running gateway's admin API, with their exit codes.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::app::Gateway;
use tiergate::policy::Policy;

const TOKEN: &str = "cli-admin-token-0123456789abcdef";

/// Runs `tiergate ARGS` with the token file and admin URL set; (exit code, stdout, stderr).
async fn tiergate(admin: &str, token_file: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(args)
        .env("TIERGATE_ADMIN_URL", admin)
        .env("TIERGATE_ADMIN_TOKEN_FILE", token_file)
        .env("USER", "carol")
        .output()
        .await
        .expect("runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// A gateway whose policy directory (under `dir`) holds `policy`, with its admin API on:
/// the gateway, the admin URL, and the token file the CLI reads.
async fn start(dir: &std::path::Path, policy: &str) -> (Gateway, String, std::path::PathBuf) {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).expect("mkdir");
    std::fs::write(policies.join("routes.toml"), policy).expect("write");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("ops:{TOKEN}\n")).expect("write");
    let mut config = config();
    config.policy_dir = policies.clone();
    config.listen.admin = "127.0.0.1:0".parse().expect("addr");
    config.admin.token_file = Some(token_file.clone());
    let gw = Gateway::start(&config, Policy::load_dir(&policies).expect("valid"))
        .await
        .expect("starts");
    let admin = format!("http://{}", gw.admin_addr().expect("admin on"));
    (gw, admin, token_file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_policy_and_explain_from_the_command_line() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let original = route(&rt.url(), &batch.url(), "realtime = true\nmicro_batch = false", "");
    let (gw, admin, token_file) = start(dir.path(), &original).await;
    let policies = dir.path().join("policies");
    let run = |args: &'static [&'static str]| tiergate(&admin, &token_file, args);

    let (code, out, err) = run(&["flags", "get", "r"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("micro_batch = false") && out.contains("etag \"r"), "{out}");

    let (code, out, _) = run(&["flags", "set", "r", "micro_batch", "on", "--dry-run"]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("dry run: nothing applied (policy version 1)"), "{out}");
    assert!(
        out.contains("model m, budget 300ms to under 1m: realtime (micro_batch_off) -> micro_batch"),
        "{out}"
    );

    let (code, out, err) = run(&["flags", "set", "r", "micro_batch", "on"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("applied: policy version 1 -> 2"), "{out}");
    let served = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "2000")], BODY).await;
    assert_eq!(served.tier().0, Some("micro_batch"));

    let (code, out, _) = run(&["flags", "get"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("realtime=on micro_batch=on (100%) offline=off"), "{out}");

    // policy diff / apply with a local copy of the file.
    let edited = dir.path().join("routes.toml");
    std::fs::write(
        &edited,
        original.replace("micro_batch = false", "micro_batch = true\nmicro_batch_percent = 10"),
    )
    .expect("write");
    let edited_arg: &'static str = Box::leak(edited.display().to_string().into_boxed_str());
    let (code, out, _) = tiergate(&admin, &token_file, &["policy", "diff", edited_arg]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("+micro_batch_percent = 10") && out.contains("for 10%"),
        "{out}"
    );
    let (code, out, _) = tiergate(&admin, &token_file, &["policy", "apply", edited_arg]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("applied: policy version 2 -> 3"), "{out}");

    // An invalid file: exit 1, every problem with its path, nothing applied.
    std::fs::write(&edited, original.replace("max_concurrency = 4", "max_concurrency = 0")).expect("write");
    let (code, _, err) = tiergate(&admin, &token_file, &["policy", "apply", edited_arg]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("routes.r.realtime.max_concurrency"), "{err}");

    let (code, out, _) = run(&["policy", "history"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("ops (carol)") && out.contains("put_files"), "{out}");
    let (code, out, err) = run(&["policy", "rollback", "1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("applied: policy version 3 -> 4"), "{out}");
    assert_eq!(
        std::fs::read_to_string(policies.join("routes.toml")).expect("read"),
        original
    );
    let (code, _, _) = run(&["flags", "set", "r", "micro_batch", "on", "--if-match", "\"rstale\""]).await;
    assert_eq!(code, 1, "a stale ETag is refused");

    let (code, out, err) = run(&["explain", "--model", "m", "--budget-ms", "2000"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tier realtime (reason micro_batch_off)") && out.contains("nothing was sent"),
        "{out}"
    );

    // What the gateway would refuse anyway is refused here: exit 2, saying what to give.
    let (code, _, err) = run(&["flags", "set", "r", "micro_batch", "maybe"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("micro_batch is on or off"), "{err}");
    let (code, _, err) = run(&["explain", "--budget-ms", "2000"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--model") && err.contains("--path") && err.contains("--route"),
        "{err}"
    );
    // A refusal for want of a tier names the flags that are off.
    let (code, _, err) = run(&["flags", "set", "r", "realtime", "off"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["explain", "--model", "m", "--budget-ms", "100"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the flags that are off: realtime, micro_batch, offline"),
        "{out}"
    );

    // Wrong token: 3, saying how to give one. Nobody listening: 4.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-token-0123456789").expect("write");
    let (code, _, err) = tiergate(&admin, &wrong, &["flags", "get", "r"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("--token-file") && err.contains("TIERGATE_ADMIN_TOKEN="),
        "{err}"
    );
    // An empty TIERGATE_ADMIN_TOKEN_FILE is no token, not a usage error.
    let empty = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["flags", "get", "r", "--admin", &admin])
        .env("TIERGATE_ADMIN_TOKEN_FILE", "")
        .env_remove("TIERGATE_ADMIN_TOKEN")
        .output()
        .await
        .expect("runs");
    assert_eq!(
        empty.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&empty.stderr)
    );
    // An address without a scheme is an address.
    let bare = admin.trim_start_matches("http://").to_owned();
    let (code, out, err) = tiergate(&bare, &token_file, &["flags", "get", "r"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("route r"), "{out}");
    let dead = format!("http://{}", dead_addr().await);
    let (code, _, err) = tiergate(&dead, &token_file, &["flags", "get", "r"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("cannot reach the admin API"), "{err}");
    // The data port by mistake: said so, with where the admin API is.
    let data = format!("http://{}", gw.http_addr());
    let (code, _, err) = tiergate(&data, &token_file, &["flags", "get", "r"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("is not tiergate's admin API (it answered 404") && err.contains("listen.admin"),
        "{err}"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_report_reset_and_promote_from_the_command_line() {
    let (rt, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let shadow = format!(
        "[routes.r.shadow]\ntiers = [\"realtime\"]\ngate = {{ min_compared = 100 }}\n\
         [routes.r.shadow.candidate]\nendpoints = [\"{}\"]\n",
        candidate.url()
    );
    let text = route(&rt.url(), &rt.url(), "realtime = true\nshadow = true", &shadow);
    let (gw, admin, token_file) = start(dir.path(), &text).await;
    let run = |args: &'static [&'static str]| tiergate(&admin, &token_file, args);
    let body = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]}]}"#;
    for _ in 0..5 {
        let answer = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    wait_for(&candidate, |s| s.requests == 5).await;
    let compared = eventually(Duration::from_secs(10), "five calls compared", || async {
        let (_, out, _) = run(&["shadow", "report", "r", "--since", "5m"]).await;
        out.contains("5 calls compared").then_some(out)
    })
    .await;
    assert!(
        compared.contains("rows: 20 compared, 20 within tolerance (agreement 100.00%)"),
        "{compared}"
    );
    assert!(!compared.contains("null"), "{compared}");
    let (code, _, err) = run(&["shadow", "report", "r", "--since", "soon"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("RFC 3339"), "{err}");

    let (code, _, err) = run(&["shadow", "promote", "r"]).await;
    assert_eq!(code, 1, "refused below the gate");
    assert!(
        err.contains("the gate is not met: 20 rows compared, the gate asks for 100") && err.contains("--force"),
        "each unmet part, with its value and threshold, and the CLI's way round: {err}"
    );
    // A dry run previews the promotion below the gate, saying what is unmet.
    let (code, out, err) = run(&["shadow", "promote", "r", "--dry-run"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("dry run: nothing applied"), "{out}");
    assert!(out.contains("gate not met: 20 rows compared"), "{out}");
    let (code, out, err) = run(&["shadow", "reset", "r"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("route r: shadow report reset at "), "{out}");
    let (_, out, _) = run(&["shadow", "report", "r"]).await;
    assert!(out.contains("0 calls compared"), "{out}");
    let (code, out, err) = run(&["shadow", "promote", "r", "--force"]).await;
    assert_eq!(code, 0, "{err}");
    let applied = out.split_whitespace().last().unwrap_or_default().to_owned();
    let (_, history, _) = run(&["policy", "history"]).await;
    assert!(
        history.lines().any(|l| l.contains("promote")),
        "a promotion is its own action: {history}"
    );
    let version = history
        .lines()
        .find(|l| l.contains("promote"))
        .and_then(|l| l.trim_start_matches('*').split_whitespace().next())
        .expect("its version")
        .to_owned();
    let diff = tiergate(&admin, &token_file, &["policy", "history", "--diff", &version]).await;
    assert_eq!(diff.0, 0, "{}", diff.2);
    assert!(
        diff.1.contains("-[routes.r.shadow]") || diff.1.contains("shadow"),
        "its diff: {}",
        diff.1
    );
    assert!(!applied.is_empty());

    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_cache_is_shown_and_invalidated_from_the_command_line() {
    let rt = backend(&["m"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let text = route(
        &rt.url(),
        &rt.url(),
        "realtime = true\ncache = true",
        "[routes.r.cache]\nttl = \"1h\"\n",
    );
    let (gw, admin, token_file) = start(dir.path(), &text).await;
    let run = |args: &'static [&'static str]| tiergate(&admin, &token_file, args);
    let ask = || infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY);
    assert_eq!(ask().await.header("x-tiergate-cache"), Some("miss"));
    assert_eq!(ask().await.header("x-tiergate-cache"), Some("hit"));
    let body = dir.path().join("body.json");
    std::fs::write(&body, BODY).expect("write");
    let explain = [
        "explain",
        "--model",
        "m",
        "--budget-ms",
        "100",
        "--body",
        body.to_str().expect("utf-8"),
    ];
    let (code, out, err) = tiergate(&admin, &token_file, &explain).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("  cache: would hit\n"), "{out}");
    let (code, out, err) = run(&["cache", "show", "r"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("route r cache on: 1 entries, "), "{out}");
    assert!(out.contains("ttl 1h"), "{out}");
    let (code, out, err) = run(&["cache", "invalidate", "r"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("route r: 1 entries invalidated\nroute r cache on: 0 entries"),
        "{out}"
    );
    let (_, out, _) = tiergate(&admin, &token_file, &explain).await;
    assert!(out.contains("  cache: would miss\n"), "{out}");
    assert_eq!(ask().await.header("x-tiergate-cache"), Some("miss"), "asked afresh");
    let (code, _, err) = run(&["cache", "show", "nope"]).await;
    assert_eq!(code, 1, "{err}");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_simulator_binds_port_0_says_where_and_makes_a_noisy_model_on_demand() {
    use tokio::io::AsyncBufReadExt;
    let mut sim = tokio::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args([
            "sim",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--model",
            "m:instant",
            "--noise",
            "0.5",
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let mut lines = tokio::io::BufReader::new(sim.stdout.take().expect("piped")).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("says where it listens")
        .expect("reads")
        .expect("a line");
    let http = first
        .strip_prefix("listening http=")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{first}"));
    assert!(first.contains(" grpc=127.0.0.1:"), "{first}");
    let addr: std::net::SocketAddr = http.parse().expect("an address");
    assert_ne!(addr.port(), 0);
    let negative = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[-1,-2]}]}"#;
    let mut answers = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let answer = infer(addr, "m", &[], negative).await;
        answers.insert(answer.json()["outputs"][1]["data"][0].to_string());
    }
    assert!(
        answers.len() > 1,
        "a noisy model does not answer the same twice: {answers:?}"
    );
    sim.kill().await.expect("stops");
}
