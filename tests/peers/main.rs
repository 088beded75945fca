//! The conformance suites against real peers, one binary: NVIDIA Triton's server (the
//! same model behind it and behind tiergate), Triton's own Python client, MLServer,
//! and the OpenAI SDK's Batch API calls. Each peer is installed in a virtual
//! environment by tests/conformance/venv.sh.

#[path = "../common/mod.rs"]
mod common;

mod mlserver;
mod openai;
mod triton;
mod tritonclient;
