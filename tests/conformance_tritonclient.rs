//! Conformance: Triton's own Python client (`tritonclient`, HTTP and gRPC) against
//! tiergate in front of the simulator. The Python environment comes from
//! `tests/conformance/venv.sh`, which installs the client from PyPI on first use.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_http_and_grpc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = python("tritonclient");

    let rt = backend(&["m"]).await;
    // Room for the clients' concurrent calls: this test is about the protocol, not shedding.
    let policy = route(&rt.url(), &rt.url(), "realtime = true\nmicro_batch = true", "")
        .replace("max_concurrency = 4", "max_concurrency = 64");
    let gw = gateway(&policy).await;
    let script = root.join("tests/conformance/tritonclient_test.py");
    let (http, grpc) = (gw.http_addr().to_string(), gw.grpc_addr().to_string());
    let out = tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(http).arg(grpc).output())
        .await
        .expect("joins")
        .expect("python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    assert!(out.status.success(), "tritonclient conformance failed:\n{report}");
    assert!(report.contains("OK"), "{report}");
    gw.stop().await.expect("stops");
}
