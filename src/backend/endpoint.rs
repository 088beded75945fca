//! What every part of a pool shares about one backend endpoint: where it is, its load
//! and its circuit ([`Endpoint`]), how a call to it ended ([`Failure`], [`Verdict`]),
//! and how an error reads ([`chain`]). A leaf under the pool, its transports
//! (`h1`, `h2`, `grpc`) and its checks.

use std::sync::atomic::{AtomicUsize, Ordering};

use http::uri::Authority;
use tokio::time::Instant;

use super::health::Health;

/// One backend endpoint of a pool: where it is, its load and its circuit.
#[derive(Debug)]
pub(super) struct Endpoint {
    pub(super) authority: Authority,
    pub(super) in_flight: AtomicUsize,
    pub(super) health: Health,
}

/// A pool's endpoints, shared with its health checks.
pub(super) type Endpoints = Vec<Endpoint>;

/// Marks one call in flight on an endpoint until dropped.
pub(super) struct InFlight<'a>(&'a AtomicUsize);

/// How a call to one endpoint failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// No connection could be made: the request never left, so it may go elsewhere.
    Connect(String),
    /// The request may have left, and no byte of an answer came: the connection closed
    /// or failed first.
    Unanswered(String),
    /// The exchange failed after connecting.
    Other(String),
    /// The response body was unreadable or too large.
    Body(String),
    /// A successful answer that is not one (see `protocol::answer_envelope`).
    Garbled(&'static str),
    /// The deadline passed.
    Deadline,
}

/// The health outcome of one call, given once; a probe dropped before it is given
/// frees the endpoint's probe slot.
pub(super) struct Verdict<'a> {
    pub(super) health: &'a Health,
    pub(super) probe: bool,
    pub(super) given: bool,
}

impl Verdict<'_> {
    pub(super) fn pass(&mut self) {
        if !std::mem::replace(&mut self.given, true) {
            self.health.succeeded();
        }
    }

    pub(super) fn fail(&mut self, why: &'static str) {
        if !std::mem::replace(&mut self.given, true) {
            self.health.failed(why, Instant::now());
        }
    }
}

impl Drop for Verdict<'_> {
    fn drop(&mut self) {
        if self.probe && !self.given {
            self.health.abandoned();
        }
    }
}

impl<'a> InFlight<'a> {
    pub(super) fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An error and its causes on one line: `client error (Connect): tcp connect error: Connection refused`.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_every_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        #[derive(Debug, thiserror::Error)]
        #[error("connect failed")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(chain(&Outer(io)), "connect failed: refused");
    }
}
