//! Conformance: the official OpenAI Python SDK (`openai`, from PyPI via
//! `tests/conformance/venv.sh openai`) drives the Batch API end to end against tiergate.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::sim::{ModelSpec, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_drives_the_batch_api() {
    let python = python("openai");
    let slow = Profile {
        a: Duration::from_millis(30),
        ..Profile::default()
    };
    let instant = Profile::named("instant").expect("profile");
    let batch = backend_with(vec![ModelSpec::new("m", instant), ModelSpec::new("slow", slow)]).await;
    let policy = format!(
        r#"
[routes.embeddings]
paths = ["/v1/embeddings"]
[routes.embeddings.flags]
realtime = false
offline = true
[routes.embeddings.micro_batch]
endpoints = ["{url}"]
json_adapter = "openai_embeddings"
max_batch = 64
[routes.slow]
models = ["slow"]
[routes.slow.flags]
realtime = false
offline = true
[routes.slow.micro_batch]
endpoints = ["{url}"]
max_batch = 4
max_in_flight = 1
"#,
        url = batch.url()
    );
    let gw = gateway(&policy).await;
    run_conformance(
        python,
        "openai_batch_test.py",
        vec![gw.http_addr().to_string()],
        std::path::Path::new(""),
    )
    .await;
    gw.stop().await.expect("stops");
}
