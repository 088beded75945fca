//! The conformance suites against real peers, one binary: NVIDIA Triton's server (the
//! same model behind it and behind tiergate, a decoupled model's stream among them),
//! Triton's own Python client, MLServer, the OpenAI SDK (the Batch API, and the LLM
//! doors), and llama.cpp's server behind tiergate. Each Python peer is installed in a
//! virtual environment by tests/conformance/venv.sh; llama.cpp's server is built by
//! scripts/llama-server.sh.

#[path = "../common/mod.rs"]
mod common;

mod llama;
mod mlserver;
mod openai;
mod triton;
mod tritonclient;
