//! Whose a failed call's failure is: its endpoint's, or its input's.
//!
//! A failure after the request was sent (a 5xx, an answer that is not one, a timeout
//! past the pool's limit) may be the input's: an input that makes the model run out of
//! memory or raise fails on every endpoint. Such a failure is held, not charged, while
//! the call goes again to another endpoint where the pool's `retry.on` allows
//! ([`super::again`]), and the outcome there decides:
//!
//! - an answer there makes the held failures their endpoints' own;
//! - the same failure there makes them the request's: no endpoint is charged, the
//!   request is not sent again, and its input is remembered ([`Blamed`]) for a minute,
//!   so its copies are neither retried nor charged;
//! - a retry its caller's share of the retry budget refuses charges nobody: a pool short
//!   of retries cannot tell whose its failures are;
//! - with no comparison possible (the retry policy, the deadline, one endpoint), each is
//!   charged once per input in its endpoint's run of failures
//!   (`health::Health::failed_on`): the same input failing again adds nothing.
//!
//! So one caller's poison input, however often sent, ejects no endpoint and spends at
//! most one retry; several inputs of its own spend only its share of the retries. A
//! failure before the request left (an unreachable endpoint) and a failed active check
//! are the endpoint's alone; a call still running at `slow_call` is charged at once (it
//! moves traffic away), once per input.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{Fitted, InputFailed, Pool};
use crate::backend::endpoint::Failure;

/// How long an input found failing on two endpoints is remembered.
const REMEMBERED_FOR: Duration = Duration::from_secs(60);
/// Inputs remembered at once (the oldest forgotten first).
const REMEMBERED: usize = 256;
/// Bytes of a body at each end that its fingerprint reads.
const SAMPLE: usize = 4096;

/// A failure held for comparison: the endpoint it happened on and its reason.
pub(super) type Held = (usize, &'static str);

/// Inputs known to fail on every endpoint, by fingerprint, each with when it was last seen.
#[derive(Debug, Default)]
pub(super) struct Blamed(Mutex<Vec<(u64, Instant)>>);

impl Blamed {
    /// Whether `input` failed on two endpoints within the last minute.
    fn contains(&self, input: u64, now: Instant) -> bool {
        self.lock()
            .iter()
            .any(|(i, at)| *i == input && now.saturating_duration_since(*at) < REMEMBERED_FOR)
    }

    /// Remembers `input` as failing everywhere, seen `now`.
    fn remember(&self, input: u64, now: Instant) {
        let mut inputs = self.lock();
        inputs.retain(|(i, at)| *i != input && now.saturating_duration_since(*at) < REMEMBERED_FOR);
        if inputs.len() >= REMEMBERED {
            inputs.remove(0);
        }
        inputs.push((input, now));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a call's outcome is an answer (not a server error): a 4xx is one too, the
/// endpoint was well enough to say the request is wrong.
pub(super) fn is_answer(result: &Result<http::Response<bytes::Bytes>, Failure>) -> bool {
    matches!(result, Ok(answer) if !answer.status().is_server_error())
}

/// A request body's fingerprint: its length and its first and last 4 KiB, hashed.
/// Bodies that differ only in their middle share one, which errs towards charging an
/// endpoint less, never more.
pub(super) fn fingerprint(body: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    let head = &body[..body.len().min(SAMPLE)];
    let tail = &body[body.len().saturating_sub(SAMPLE)..];
    foldhash::quality::FixedState::with_seed(0x7469_6572_6761_7465).hash_one((body.len(), head, tail))
}

impl Pool {
    /// Whether a call whose failures are held may go to another endpoint to compare:
    /// not when its input is already known to fail on every endpoint (then nobody is
    /// charged: the request's own).
    pub(super) fn comparable(&self, fitted: &mut Fitted) -> bool {
        if fitted.held.is_empty() {
            return true;
        }
        if self.blamed.contains(fingerprint(&fitted.body), Instant::now()) {
            fitted.held.clear();
            return false;
        }
        true
    }

    /// Settles the failures `fitted` holds when no other endpoint could be tried (the
    /// retry policy, the deadline, the endpoints left): each charged to its endpoint once
    /// per input in its run of failures.
    #[cold]
    pub(super) fn settle_alone(&self, fitted: &mut Fitted) {
        if fitted.held.is_empty() {
            return;
        }
        let (input, now) = (fingerprint(&fitted.body), Instant::now());
        if self.blamed.contains(input, now) {
            fitted.held.clear();
            return;
        }
        for (at, why) in fitted.held.drain(..) {
            self.endpoints[at].health.failed_on(why, input, now);
        }
    }

    /// Failures held from endpoints the call has left, now that it was answered by
    /// another: their endpoints' own.
    pub(super) fn theirs(&self, held: impl IntoIterator<Item = Held>) {
        let now = Instant::now();
        for (at, why) in held {
            self.endpoints[at].health.failed(why, now);
        }
    }

    /// The call failed alike on two endpoints with `result`: the request's. Nobody is
    /// charged (the caller drops what it held), its input is remembered so its copies
    /// are neither sent again nor charged, and an answer says so ([`InputFailed`]).
    pub(super) fn inputs(&self, fitted: &Fitted, result: &mut Result<http::Response<bytes::Bytes>, Failure>) {
        self.blamed.remember(fingerprint(&fitted.body), Instant::now());
        self.count(crate::backend::retry::REFUSED, "input");
        if let Ok(answer) = result {
            answer.extensions_mut().insert(InputFailed);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_the_length_and_both_ends() {
        let a = vec![1u8; 20_000];
        let mut b = a.clone();
        b[10_000] = 2;
        assert_eq!(fingerprint(&a), fingerprint(&b), "the middle is not read");
        b[19_999] = 2;
        assert_ne!(fingerprint(&a), fingerprint(&b), "the tail is");
        assert_ne!(fingerprint(&a[..19_999]), fingerprint(&a), "and the length");
        assert_ne!(fingerprint(b"{\"id\":\"1\"}"), fingerprint(b"{\"id\":\"2\"}"));
    }

    #[test]
    fn an_input_is_remembered_for_a_minute() {
        let blamed = Blamed::default();
        let t0 = Instant::now();
        blamed.remember(7, t0);
        assert!(blamed.contains(7, t0 + Duration::from_secs(59)));
        assert!(!blamed.contains(7, t0 + REMEMBERED_FOR));
        assert!(!blamed.contains(8, t0));
        for i in 0..REMEMBERED as u64 + 1 {
            blamed.remember(100 + i, t0);
        }
        assert!(!blamed.contains(100, t0), "the oldest is forgotten first");
        assert!(blamed.contains(100 + REMEMBERED as u64, t0));
    }
}
