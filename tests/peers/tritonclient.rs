//! Conformance: Triton's own Python client (`tritonclient`, HTTP and gRPC) against
//! tiergate in front of the simulator. The Python environment comes from
//! `tests/conformance/venv.sh tritonclient`, which installs the client from PyPI on first use.

use crate::common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_http_and_grpc() {
    let python = python("tritonclient");
    let rt = backend(&["m"]).await;
    // Room for the clients' concurrent calls: this test is about the protocol, not shedding.
    let policy = route(&rt.url(), &rt.url(), "realtime = true\nmicro_batch = true", "")
        .replace("max_concurrency = 4", "max_concurrency = 64");
    let gw = gateway(&policy).await;
    // The model config schema the doors convert with, compared field by field with Triton's.
    let work = tempfile::tempdir().expect("tempdir");
    let descriptors = work.path().join("model_config.bin");
    std::fs::write(&descriptors, tiergate::protocol::grpc::config::descriptor_set()).expect("writes");
    let args = vec![
        gw.http_addr().to_string(),
        gw.grpc_addr().to_string(),
        descriptors.display().to_string(),
    ];
    run_conformance(python, "tritonclient_test.py", args, std::path::Path::new("")).await;
    // Each client's 32 concurrent steps of one Triton sequence reached the backend one
    // call each (a combined call carries no caller's id).
    let ids = rt.sim.stats("m").expect("stats").ids;
    for door in ["http", "grpc"] {
        let prefix = format!("seq-{door}-");
        let steps = ids.iter().filter(|id| id.starts_with(&prefix)).count();
        assert_eq!(steps, 32, "{door} steps sent alone: {ids:?}");
    }
    gw.stop().await.expect("stops");
}
