//! `tiergate serve --check`: the startup checks without serving. Every problem in the
//! settings is reported at once, each with its key, and the exit code says whether the
//! gateway would start.

use std::process::Command;

fn serve_check(env: &[(&str, &str)]) -> std::process::Output {
    let root = env!("CARGO_MANIFEST_DIR");
    let data = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_tiergate"));
    command
        .args(["serve", "--check"])
        .env_clear()
        .env("TIERGATE_POLICY_DIR", format!("{root}/policies"))
        .env("TIERGATE_DATA_DIR", data.path());
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("tiergate runs")
}

#[test]
fn every_problem_is_reported_with_its_key_and_nothing_is_bound() {
    let out = serve_check(&[
        ("TIERGATE_THREADS__BATCH_NICE", "25"),
        ("TIERGATE_LIMITS__BUDGET_RESERVE", "0.9"),
        ("TIERGATE_SHUTDOWN__DRAIN_DELAY", "1m"),
        ("TIERGATE_BACKENDS__ALLOW", "not a host!"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for key in [
        "threads.batch_nice",
        "limits.budget_reserve",
        "shutdown.drain_delay",
        "backends.allow",
    ] {
        assert!(stderr.contains(&format!("{key}: ")), "{key} in:\n{stderr}");
    }
}

#[test]
fn good_settings_pass_and_say_what_would_be_served() {
    let out = serve_check(&[("TIERGATE_LISTEN__HTTP", "127.0.0.1:0")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("ok: 3 route(s)"), "{stdout}");
}

#[test]
fn a_startup_error_is_said_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["serve", "--check", "--config", "/nonexistent/tiergate.toml"])
        .env_clear()
        .output()
        .expect("tiergate runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("not found").count(),
        1,
        "the cause once, not again after the message that quotes it: {stderr}"
    );
}
