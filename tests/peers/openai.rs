//! Conformance: the official OpenAI Python SDK (`openai`, from PyPI via
//! `tests/conformance/venv.sh openai`) drives the Batch API end to end against tiergate,
//! and its LLM doors: chat, completions and Responses, streamed and whole, embeddings,
//! chat lines in a Batch API file, an error mid-stream.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_streams_chat_completions_and_responses_and_runs_chat_batches() {
    use tiergate::sim::LlmProfile;
    let python = python("openai");
    let tiny = LlmProfile::named("llm-tiny").expect("profile");
    let instant = Profile::named("instant").expect("profile");
    let (rt, batch) = (
        backend_with(vec![ModelSpec::llm("llama", tiny), ModelSpec::new("m", instant)]).await,
        backend_with(vec![ModelSpec::llm("llama", tiny)]).await,
    );
    let faulty = backend_with(vec![ModelSpec::llm("faulty", tiny)]).await;
    let paths = r#"paths = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]"#;
    let policy = format!(
        r#"
[routes.chat]
models = ["llama"]
{paths}
default_budget = "2s"
realtime_below = "5s"
[routes.chat.flags]
micro_batch = true
offline = true
[routes.chat.realtime]
endpoints = ["{rt}"]
[routes.chat.micro_batch]
endpoints = ["{batch}"]
[routes.faulty]
models = ["faulty"]
{paths}
default_budget = "2s"
realtime_below = "5s"
[routes.faulty.realtime]
endpoints = ["{faulty}"]
[routes.embeddings]
models = ["m"]
paths = ["/v1/embeddings"]
[routes.embeddings.realtime]
endpoints = ["{rt}"]
"#,
        rt = rt.url(),
        batch = batch.url(),
        faulty = faulty.url(),
    );
    let gw = gateway(&policy).await;
    run_conformance(
        python,
        "openai_llm_test.py",
        vec![gw.http_addr().to_string(), faulty.addr.to_string()],
        std::path::Path::new(""),
    )
    .await;
    gw.stop().await.expect("stops");
}
