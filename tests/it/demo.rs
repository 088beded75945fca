//! The demo (`cargo run --release -- demo`) starts and every example answers as it says.
//!
//! The demo's simulated pools listen where `policies/demo.toml` points (ports 9100 and
//! 9101), so this one test uses fixed ports; the gateway itself binds port 0.

use std::process::Command;

#[test]
fn demo_self_check_passes() {
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args([
            "demo",
            "--self-check",
            "--http",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("demo self-check passed"), "{text}");
}
