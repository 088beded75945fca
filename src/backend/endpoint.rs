//! What every part of a pool shares about one backend endpoint: where it is, its load
//! and its circuit ([`Endpoint`]), how a call to it ended ([`Failure`], [`Verdict`]),
//! and how an error reads ([`chain`]). A leaf under the pool, its transports
//! (`h1`, `h2`, `grpc`) and its checks.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;
use tokio::time::Instant;

use super::health::Health;

/// One backend endpoint of a pool: where it is, its load, its cost and its circuit.
#[derive(Debug)]
pub(super) struct Endpoint {
    pub(super) authority: Authority,
    pub(super) in_flight: AtomicUsize,
    pub(super) health: Health,
    pub(super) cost: Cost,
    /// What its streams take to their first token, and per token after it (moving
    /// averages, as [`Cost`]).
    pub(super) streams: [Cost; 2],
}

/// What a call to one endpoint takes, as it has answered lately: a moving average of
/// its answered calls (each new one weighs 1/8) that halves every 4.096 s
/// ([`Cost::HALF_LIFE_MS`], a power of two) without an answer, so an endpoint that was
/// slow and got no calls for it is tried again. Kept in one word: the average in microseconds (high 32 bits, saturating at
/// about 71 minutes) and when it was last updated, in milliseconds of the pool's clock
/// (wrapping).
#[derive(Debug, Default)]
pub(super) struct Cost(AtomicU64);

impl Cost {
    /// How long the cost takes to halve without an answer, in milliseconds.
    pub(super) const HALF_LIFE_MS: u32 = 1 << 12;

    /// A call answered in `took`, at `at` (ms of the pool's clock).
    pub(super) fn answered(&self, took: Duration, at: u32) {
        let micros = took.as_secs().saturating_mul(1_000_000) + u64::from(took.subsec_micros());
        let took = micros.min(u64::from(u32::MAX));
        let now = self.at(at);
        let average = match now {
            0 => took,
            now => now - now / 8 + took / 8,
        };
        self.0.store(average << 32 | u64::from(at), Ordering::Relaxed);
    }

    /// A call cut at `at` after `took`: it took at least that, which is news only when
    /// above the cost (a caller's short budget never makes an endpoint look cheaper).
    pub(super) fn at_least(&self, took: Duration, at: u32) {
        if took.as_micros() > u128::from(self.at(at)) {
            self.answered(took, at);
        }
    }

    /// The cost at `at` (ms of the pool's clock) in microseconds; 0 when not known.
    #[inline]
    pub(super) fn at(&self, at: u32) -> u64 {
        let word = self.0.load(Ordering::Relaxed);
        // Wrapping: the clock wraps after 49 days; a time a little ahead (another
        // call's update racing this read) is now.
        let since = match at.wrapping_sub(word as u32) {
            ahead if ahead > u32::MAX / 2 => 0,
            since => since >> Self::HALF_LIFE_MS.trailing_zeros(),
        };
        (word >> 32).checked_shr(since).unwrap_or(0)
    }
}

impl Endpoint {
    /// Its calls in flight and its cost at `at` (ms of the pool's clock; 0: not known).
    #[inline]
    pub(super) fn load(&self, at: u32) -> (u64, u64) {
        (self.in_flight.load(Ordering::Relaxed) as u64, self.cost.at(at))
    }
}

/// The pool's clock at `now`: milliseconds since `born`, wrapping (what [`Cost`] is
/// kept in).
#[inline]
pub(super) fn clock(born: Instant, now: Instant) -> u32 {
    let since = now.saturating_duration_since(born);
    (since.as_secs() as u32)
        .wrapping_mul(1000)
        .wrapping_add(since.subsec_millis())
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

    /// A failure `input` (a fingerprint of the request) may have caused: counted once
    /// per input in the endpoint's run of failures.
    pub(super) fn fail_on(&mut self, why: &'static str, input: u64) {
        if !std::mem::replace(&mut self.given, true) {
            self.health.failed_on(why, input, Instant::now());
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

    #[test]
    fn an_endpoints_cost_follows_its_answers_and_fades_without_them() {
        let cost = Cost::default();
        assert_eq!(cost.at(0), 0, "not known before an answer");
        cost.answered(Duration::from_micros(8_000), 100);
        assert_eq!(cost.at(100), 8_000, "the first answer is the cost");
        cost.answered(Duration::from_micros(16_000), 200);
        assert_eq!(cost.at(200), 9_000, "each later answer weighs 1/8");
        assert_eq!(cost.at(200 + 4_095), 9_000);
        assert_eq!(cost.at(200 + 4_096), 4_500, "halved after 4.096 s without an answer");
        assert_eq!(cost.at(200 + 3 * 4_096), 1_125);
        assert_eq!(cost.at(199), 9_000, "a read racing a later update sees it as now");
        assert_eq!(cost.at(200 + 200_000), 0, "forgotten after long enough");
        let slow = Cost::default();
        slow.answered(Duration::from_secs(10_000), u32::MAX);
        assert_eq!(slow.at(5), u64::from(u32::MAX), "saturates; the clock wraps");
    }
}
