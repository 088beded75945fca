//! The integration tests, one binary (it links the crate once): a module per behaviour,
//! each against simulated backends and gateways on loopback, or `tiergate` itself as a
//! child process. The suites against real peers (Triton, tritonclient, MLServer, the
//! OpenAI SDK) are the `peers` binary.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod admission;
mod allocations;
mod backend_priority;
mod batch_api;
mod borrow;
mod bulk_door;
mod cache;
mod combined;
mod completions_streams;
mod connections;
mod console;
mod crash;
mod decisions;
mod decoupled;
mod demo;
mod docs;
mod door;
mod grpc;
mod grpc_backends;
mod health;
mod hedging;
mod http1;
mod jobs_cli;
mod kafka;
mod kafka_queue;
mod kserve_http;
mod llm_window;
mod metrics_endpoint;
mod micro_batch;
mod observability;
mod offline;
mod ops_cli;
mod policy_check;
mod readiness;
mod realtime;
mod refusals;
mod reload;
mod retries;
mod scheduling;
mod serve_check;
mod server_timing;
mod shadow;
mod shutdown;
mod streams;
mod tenants;
mod tls;
mod token_limits;
mod traces;
mod usage;
