//! Doors: the listeners clients talk to, first on the request path.
//!
//! [`http`] is the KServe v2 HTTP door (plus JSON routes), [`grpc`] the KServe v2 gRPC
//! door, `kafka_source` (with the `kafka` feature) a door that reads requests from
//! topics; [`batch_api`] is the OpenAI-shaped Batch API the HTTP door routes `/v1/files`
//! and `/v1/batches` to, [`job_status`] its `/v1/jobs/{id}`. Every door then takes a
//! request through the [`pipeline`]: admission, the body budget, [`meta`] (what the
//! classifier needs from the request's head), and the [`pipeline::dispatch`]: classify,
//! serve on its tier, count (on a route with a cache, the cache first). [`auth`] tells
//! each door who is calling, [`ready`] whether the gateway should be sent new work;
//! `paths` maps a path to its route, [`body`] reads bodies within their budget,
//! `encoding` decodes compressed bodies and compresses answers when asked, `extensions`
//! answers Triton's protocol extensions, `failures` logs the gateway's own 5xx answers
//! (rate-limited), and [`relay`] passes a backend's stream to the client event by event
//! (the pipeline makes the relay; every door writes it). The doors run on [`crate::server`], the
//! connection loop every listener here shares.

pub mod auth;
pub mod batch_api;
pub mod body;
mod encoding;
pub mod errors;
mod extensions;
mod failures;
pub mod grpc;
pub mod http;
pub mod job_status;
#[cfg(feature = "kafka")]
pub mod kafka_source;
pub mod meta;
mod openai;
mod paths;
pub mod pipeline;
pub mod ready;
pub mod relay;
mod tokens;
