//! The demo (`cargo run --release -- demo`): every example answers as it says, and every
//! line it prints runs as printed.
//!
//! Everything binds port 0: the gateway's listeners and, through `--realtime-pool` and
//! `--batch-pool`, the simulated pools that `policies/demo.toml` puts on 9100 and 9101.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

/// The demo's flags that put every listener on a free port.
const ANY_PORTS: [&str; 12] = [
    "--http",
    "127.0.0.1:0",
    "--grpc",
    "127.0.0.1:0",
    "--metrics",
    "127.0.0.1:0",
    "--admin",
    "127.0.0.1:0",
    "--realtime-pool",
    "127.0.0.1:0",
    "--batch-pool",
    "127.0.0.1:0",
];

#[test]
fn demo_self_check_passes() {
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["demo", "--self-check"])
        .args(ANY_PORTS)
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("the same 2 s budget over gRPC"), "{text}");
    assert!(text.contains("demo self-check passed"), "{text}");
}

/// Runs the demo as a newcomer does and pastes every command it prints into a shell:
/// each must exit 0 (the curl lines with `-si` print what they got; the 404 example
/// is a 404 answered, which curl does not count as a failure).
#[test]
fn every_line_the_demo_prints_runs_as_printed() {
    let mut demo = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .arg("demo")
        .args(ANY_PORTS)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let stdout = demo.stdout.take().expect("piped");
    let mut printed = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("utf-8");
        if line.starts_with("Ctrl-C") {
            break;
        }
        printed.push(line);
    }
    let commands: Vec<&String> = printed
        .iter()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('#')
                && !l.starts_with("tiergate demo:")
                && !l.starts_with("simulated pools:")
                && !l.starts_with("the batch pool has learned")
        })
        .collect();
    assert!(commands.len() >= 12, "the demo prints its examples: {printed:#?}");
    let mut failed = Vec::new();
    for command in &commands {
        // The job id line names a placeholder, `ID`, which the text above it explains.
        if command.contains("/v1/jobs/ID") {
            continue;
        }
        let out = Command::new("bash").args(["-c", command]).output().expect("bash runs");
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            failed.push(format!("{command}\n  -> {}: {said}", out.status));
        }
    }
    // SIGTERM, as Ctrl-C: the demo removes its temporary directory on the way out.
    let pid = rustix::process::Pid::from_raw(demo.id() as i32).expect("a child's pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = demo.wait().expect("waits");
    assert!(
        failed.is_empty(),
        "lines the demo printed that do not run:\n{}",
        failed.join("\n")
    );
    assert!(status.success(), "the demo stops cleanly on SIGTERM: {status}");
}
