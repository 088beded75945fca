//! tiergate: a hybrid tiered inference gateway.
//!
//! tiergate sits in front of KServe v2 model servers and serves every request on the
//! tier its latency budget and its route's flags call for: `realtime` (one request,
//! one backend call), `micro_batch` (coalesced with other callers into one batch) or
//! `offline` (a durable queue drained later). The real-time and micro-batch tiers have
//! their own connection pools, limits and queues; the offline tier drains through the
//! batch pool's spare capacity, and a request crosses pools only where its route's
//! `borrow` rules allow it.
//!
//! # Layout
//!
//! Modules follow the request path, from the client to the backend:
//!
//! - [`server`]: the connection loop every listener runs on (limits, deadlines, TLS,
//!   drain), below the doors and the admin API alike.
//! - [`front`]: the doors (KServe v2 over HTTP and gRPC, JSON routes, the Batch API,
//!   Kafka sources) and the pipeline each request takes through them.
//! - [`protocol`]: KServe v2 wire formats, JSON and Triton's binary tensor extension.
//! - [`llm`]: what the gateway reads of LLM traffic: server-sent events, OpenAI's API.
//! - [`cache`]: before any tier, answers kept per route and identical calls in flight
//!   sharing one backend call.
//! - [`classify`]: the pure decision function, (route, flags, budget) → tier + reason,
//!   over the leaf [`decision`] (tiers, reasons, budget sources, doors).
//! - [`tiers`]: the tier router and the tiers.
//! - [`shadow`]: beside the tiers, a candidate model scored on a share of their calls.
//! - [`backend`]: pools of backend endpoints and the calls to them.
//! - [`queue`]: the offline tier's durable job store, below the offline tier.
//!
//! Beside the path: [`policy`] (files → validated snapshot), [`control`] (every change
//! to the running policy: validated, written back, versioned, audited), [`reload`]
//! (watching the policy directory), [`admin`] (the admin API), [`metrics`], [`config`]
//! (startup settings), [`cpu`] (where and how urgently threads run), [`error`] (one
//! table from failure to status), [`headers`] (tiergate's own header names), [`timing`]
//! (an answer's `Server-Timing`: where its time went), [`tenant`]
//! (whose a request's work is), [`files`] (private files and directories), [`trace`]
//! (request ids, trace context and spans) and [`telemetry`] (logs and span export);
//! [`sim`], the simulated model server; and [`app`], which composes a running
//! [`app::Gateway`]. The command line (`src/cli`) is the binary's, not the library's.

pub mod server;

pub mod front;
pub mod llm;
pub mod protocol;

pub mod cache;

pub mod classify;
pub mod decision;
pub mod tiers;

pub mod shadow;

pub mod backend;
pub mod queue;

pub mod admin;
pub mod app;
pub mod config;
pub mod control;
pub mod cpu;
pub mod error;
pub mod files;
pub mod headers;
pub mod metrics;
pub mod policy;
pub mod reload;
pub mod sim;
pub mod telemetry;
pub mod tenant;
pub mod timing;
pub mod trace;
pub mod usage;
