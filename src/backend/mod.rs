//! Backends: the model servers tiergate calls, grouped into pools.
//!
//! The bottom of the request path. [`Pool`] sends calls to the endpoints of one tier
//! of one route (endpoint choice, circuits, limits, errors), over `h1` (HTTP/1.1, its
//! own client), `h2` (HTTP/2) or, for `grpc://` endpoints, `grpc`, with the messages of
//! `message` (end-to-end headers only), a streamed answer read as it comes ([`stream`]);
//! `endpoint` holds what they and the active
//! `checks` share; `sequences` keeps each Triton sequence to one endpoint, in order;
//! `tls` is how `https://` and `grpcs://` endpoints are verified
//! ([`Trust`]); [`Pools`] finds or builds the pool for a route's current spec, so a
//! tier keeps its connections and counters for as long as a route's pool is unchanged
//! and gets fresh ones when a policy reload changes it.

mod checks;
mod endpoint;
mod grpc;
mod h1;
mod h2;
pub mod health;
mod latency;
mod message;
pub use message::copy;
mod pool;
mod retry;
pub(crate) mod sequences;
pub mod stream;
mod tls;

use std::sync::Arc;

use dashmap::DashMap;

use crate::decision::Tier;
use crate::policy::PoolSpec;

pub use pool::{EndpointView, InputFailed, Pool};
pub use tls::Trust;

/// What every pool of a gateway is built with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The largest backend answer read, in bytes (`limits.max_response_bytes`).
    pub max_response_bytes: usize,
    /// Whom TLS endpoints must prove themselves to (`backends.ca_file`).
    pub trust: Trust,
}

impl Settings {
    /// Answers up to `max_response_bytes`, TLS endpoints verified against the
    /// platform's CA certificates.
    pub fn new(max_response_bytes: usize) -> Self {
        Settings {
            max_response_bytes,
            trust: Trust::platform(),
        }
    }

    /// The same, TLS endpoints verified against `trust` instead.
    pub fn trusting(self, trust: Trust) -> Self {
        Settings { trust, ..self }
    }
}

/// What a pool serves, and so what it is named in logs, errors and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A tier's calls: its endpoints' circuits, checks and latency are exported with
    /// `tier="..."`.
    Tier(Tier),
    /// Model metadata, readiness and config (the control plane): its own connections
    /// and circuits, no active checks, and nothing on the tiers' series.
    Control,
    /// A route's shadow candidate: its own connections, circuits and checks, exported
    /// with `tier="shadow"`.
    Shadow,
    /// A route's fallback pool, serving its real-time calls while the real-time pool
    /// cannot: its own connections, circuits and checks, exported with `tier="fallback"`.
    Fallback,
}

impl Role {
    /// The name used in messages, spans and metrics (`realtime`, `micro_batch`,
    /// `control`, `shadow`, `fallback`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Tier(tier) => tier.as_str(),
            Role::Control => "control",
            Role::Shadow => "shadow",
            Role::Fallback => "fallback",
        }
    }
}

/// The pools of one role (a tier, or the control plane), by route name.
#[derive(Debug)]
pub struct Pools {
    role: Role,
    settings: Settings,
    /// Hashed with foldhash (see `policy::model::Index`): one lookup per call.
    by_route: DashMap<String, (Arc<PoolSpec>, Arc<Pool>), foldhash::fast::RandomState>,
}

impl Pools {
    /// An empty registry for `role`, its pools built with `settings`.
    pub fn new(role: Role, settings: Settings) -> Self {
        Pools {
            role,
            settings,
            by_route: DashMap::default(),
        }
    }

    /// The pool serving `route` now and its spec, if one was built.
    pub fn find(&self, route: &str) -> Option<(Arc<PoolSpec>, Arc<Pool>)> {
        self.by_route.get(route).map(|entry| entry.value().clone())
    }

    /// The pool serving `route` as `spec` describes it, built on first use and rebuilt
    /// when the spec changes.
    pub fn get(&self, route: &str, spec: &Arc<PoolSpec>) -> Arc<Pool> {
        // Fast path: a shared lock on one shard and a pointer comparison.
        if let Some(entry) = self.by_route.get(route) {
            if Arc::ptr_eq(&entry.0, spec) {
                return entry.1.clone();
            }
        }
        let mut entry = self
            .by_route
            .entry(route.to_owned())
            .or_insert_with(|| (spec.clone(), self.build(route, spec)));
        let (known, pool) = entry.value_mut();
        if !Arc::ptr_eq(known, spec) {
            if **known != **spec {
                *pool = self.build(route, spec);
            }
            // Same settings from a newer snapshot keep the warm pool.
            *known = spec.clone();
        }
        pool.clone()
    }

    /// Whether `route`'s pool, as `spec` describes it, has every endpoint ejected. A pool
    /// no call has used yet has not been built, so it is not ejected.
    pub fn all_ejected(&self, route: &str, spec: &PoolSpec) -> bool {
        self.by_route
            .get(route)
            .is_some_and(|entry| *entry.0 == *spec && entry.1.all_ejected())
    }

    /// `route`'s pool's endpoints not ejected now, as `spec` describes it (all of
    /// them for a pool no call has used yet).
    pub fn healthy(&self, route: &str, spec: &PoolSpec) -> usize {
        match self.by_route.get(route) {
            Some(entry) if *entry.0 == *spec => entry.1.healthy(),
            _ => spec.endpoints.len(),
        }
    }

    /// `route`'s pool's endpoints now, as `spec` describes it; `None` for a pool no
    /// call has used yet.
    pub fn endpoints_now(&self, route: &str, spec: &PoolSpec) -> Option<Vec<EndpointView>> {
        match self.by_route.get(route) {
            Some(entry) if *entry.0 == *spec => Some(entry.1.endpoints_now()),
            _ => None,
        }
    }

    fn build(&self, route: &str, spec: &PoolSpec) -> Arc<Pool> {
        Arc::new(Pool::new(route, self.role, spec, &self.settings))
    }
}
