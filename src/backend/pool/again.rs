//! A pool's calls sent again: a failed call retried on another endpoint within its
//! caller's share of the pool's retry budget, a slow one hedged to another within its
//! duplicate-work budget (see [`super::super::retry`]), and their counters; what the
//! call meets there settles whose its earlier failures were (see `blame`). The rare
//! branches of [`Pool::call`](super::Pool), boxed there so the common call stays small.

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::time::Instant;

use super::blame::is_answer;
use super::{Fitted, Pool};
use crate::backend::endpoint::Failure;
use crate::backend::retry::{retry_counter, Reason, RetryFamily, HEDGED, REFUSED, RETRIED};
use crate::backend::Role;
use crate::error::Error;
use crate::policy::RetryOn;
use crate::timing::Spent;

impl Pool {
    /// How long a call with `parts` runs before it is hedged, when the pool hedges and
    /// the call is safe to repeat (its `retry.on` has `reset`) and the delay is known.
    #[inline(always)]
    pub(super) fn hedge_after(&self, parts: &http::request::Parts) -> Option<Duration> {
        let hedge = self.hedge?;
        if !self.retried_on(parts).reset {
            return None;
        }
        hedge.after.or_else(|| self.latency.p95())
    }

    /// Sends a hedged call: when the call to `first` has not answered after `after` and
    /// a second copy may go ([`Pool::hedge_to`]), the copy goes to another endpoint and
    /// the first answer that is not a failure is taken. The other call is dropped
    /// unfinished, which closes its HTTP/1.1 connection or resets its HTTP/2 stream, so
    /// the backend stops working on it (and its endpoint's cost learns what it took so
    /// far). When both fail, the call is retried as any other.
    #[cold]
    pub(super) async fn hedged(
        &self,
        mut fitted: Fitted,
        deadline: Instant,
        (first, started): ((usize, bool), Instant),
        after: Duration,
    ) -> Result<Response<Bytes>, Error> {
        let mut copy = fitted.clone();
        let (tried, at, mut result) = {
            let one = self.send(first, &mut fitted, deadline, started);
            tokio::pin!(one);
            let early = tokio::select! {
                biased;
                done = &mut one => Some(done),
                () = tokio::time::sleep_until(started + after) => None,
            };
            let second = match early {
                Some(done) => Err(Some(done)),
                None => self.hedge_to(first.0, deadline).ok_or(None),
            };
            match second {
                Err(Some(done)) => (vec![first.0], first.0, done),
                Err(None) => (vec![first.0], first.0, one.await),
                Ok(second) => {
                    let hedged_at = Instant::now();
                    let two = self.send(second, &mut copy, deadline, hedged_at);
                    tokio::pin!(two);
                    let (done, by_hedge) = tokio::select! {
                        done = &mut one => (done, false),
                        done = &mut two => (done, true),
                    };
                    let answered = matches!(&done, Ok(answer) if !answer.status().is_server_error());
                    // The taken outcome: the first answer, else the other call's.
                    let (result, hedge_taken) = match (answered, by_hedge) {
                        (true, _) => {
                            let (loser, since) = match by_hedge {
                                true => (first.0, started),
                                false => (second.0, hedged_at),
                            };
                            self.cancelled(loser, since);
                            (done, by_hedge)
                        }
                        (false, true) => (one.await, false),
                        (false, false) => (two.await, true),
                    };
                    if hedge_taken {
                        self.count(HEDGED, "won");
                    }
                    let at = if hedge_taken { second.0 } else { first.0 };
                    (vec![first.0, second.0], at, result)
                }
            }
        };
        if let (Ok(answer), Some(first), Some(copy)) = (&mut result, fitted.sent_at, copy.sent_at) {
            if at != tried[0] {
                crate::timing::set(
                    answer.extensions_mut(),
                    &[(Spent::Backend, copy.elapsed()), (Spent::Hedge, copy - first)],
                );
            }
        }
        // The two calls compared: an answer from either makes the other's failure its
        // endpoint's own; both failing alike makes them the request's.
        let (mine, theirs) = (std::mem::take(&mut fitted.held), std::mem::take(&mut copy.held));
        if is_answer(&result) {
            self.theirs(mine.into_iter().chain(theirs));
        } else if !mine.is_empty() && !theirs.is_empty() {
            self.inputs(&fitted, &mut result);
            return result.map_err(|f| self.error(at, f).tried(tried.len()));
        } else {
            fitted.held = mine.into_iter().chain(theirs).collect();
        }
        match self.retryable(&result, &fitted.parts) {
            None => {
                self.settle_alone(&mut fitted);
                result.map_err(|f| self.error(at, f).tried(tried.len()))
            }
            Some(reason) => self.again(fitted, deadline, tried, at, result, reason).await,
        }
    }

    /// The endpoint a hedge of a call on `first` goes to, or `None` when none may go:
    /// the budget left does not cover the pool's calls, the duplicate-work budget is
    /// spent (counted), or no other endpoint takes a call.
    fn hedge_to(&self, first: usize, deadline: Instant) -> Option<(usize, bool)> {
        let now = Instant::now();
        if now >= deadline || self.meetable(deadline - now).is_err() {
            return None;
        }
        if !self.budget.hedge(now) {
            self.count(HEDGED, "over_budget");
            return None;
        }
        let next = self.pick_untried(&[first], now)?;
        self.count(HEDGED, "sent");
        Some(next)
    }

    /// A call on endpoint `at`, sent at `since`, dropped unfinished because its hedge
    /// (or the call it hedged) answered first: counted, and what it ran so far taught
    /// to the endpoint's cost.
    #[cold]
    fn cancelled(&self, at: usize, since: Instant) {
        self.count(HEDGED, "cancelled");
        self.endpoints[at].cost.at_least(since.elapsed(), self.clock(since));
    }

    /// Retries a call that failed on endpoint `last` (having `tried` these) for
    /// `reason`: on an endpoint it has not tried, while the pool allows another retry
    /// (`max_retries`), the budget left covers what the pool's calls take, and its
    /// caller's share of the retry budget has one to give. What each attempt meets
    /// settles the failures held before it (see `blame`): the request's own ends the
    /// retries. The last outcome is the answer.
    #[cold]
    pub(super) async fn again(
        &self,
        mut fitted: Fitted,
        deadline: Instant,
        mut tried: Vec<usize>,
        mut last: usize,
        mut result: Result<Response<Bytes>, Failure>,
        mut reason: Reason,
    ) -> Result<Response<Bytes>, Error> {
        let first_sent = fitted.sent_at;
        let caller = caller_of(&fitted.parts);
        if !self.comparable(&mut fitted) {
            // An input known to fail on every endpoint: not sent again.
            return result.map_err(|f| self.error(last, f).tried(tried.len()));
        }
        loop {
            let next = match self.retry_to(&tried, reason, deadline, caller) {
                Ok(next) => next,
                Err(unsent) => {
                    match unsent {
                        // A pool short of retries cannot tell whose its failures are:
                        // nobody is charged, so a flood of failing inputs ejects nothing.
                        Unsent::Budget => fitted.held.clear(),
                        Unsent::Nowhere => self.settle_alone(&mut fitted),
                    }
                    return result.map_err(|f| self.error(last, f).tried(tried.len()));
                }
            };
            tried.push(next.0);
            last = next.0;
            let earlier = std::mem::take(&mut fitted.held);
            result = self.send(next, &mut fitted, deadline, Instant::now()).await;
            if let (Ok(answer), Some(first), Some(this)) = (&mut result, first_sent, fitted.sent_at) {
                crate::timing::set(
                    answer.extensions_mut(),
                    &[(Spent::Backend, this.elapsed()), (Spent::Retry, this - first)],
                );
            }
            if is_answer(&result) {
                self.theirs(earlier);
            } else if !earlier.is_empty() && !fitted.held.is_empty() {
                fitted.held.clear();
                self.inputs(&fitted, &mut result);
                return result.map_err(|f| self.error(last, f).tried(tried.len()));
            } else {
                fitted.held.extend(earlier);
            }
            match self.retryable(&result, &fitted.parts) {
                Some(again) => reason = again,
                None => {
                    self.settle_alone(&mut fitted);
                    return result.map_err(|f| self.error(last, f).tried(tried.len()));
                }
            }
        }
    }

    /// The endpoint a retry of `caller`'s for `reason` goes to, having `tried` these,
    /// or why it may not go (refusals for the deadline or the retry budget counted).
    fn retry_to(
        &self,
        tried: &[usize],
        reason: Reason,
        deadline: Instant,
        caller: u64,
    ) -> Result<(usize, bool), Unsent> {
        if tried.len() > self.retry.max_retries as usize || tried.len() >= self.endpoints.len() {
            return Err(Unsent::Nowhere);
        }
        let now = Instant::now();
        if now >= deadline || self.meetable(deadline - now).is_err() {
            self.count(REFUSED, "deadline");
            return Err(Unsent::Nowhere);
        }
        if !self.budget.withdraw(now, caller) {
            self.count(REFUSED, "budget");
            return Err(Unsent::Budget);
        }
        let next = self.pick_untried(tried, now).ok_or(Unsent::Nowhere)?;
        self.count(RETRIED, reason.as_str());
        Ok(next)
    }

    /// Why `result` of a call with `parts` may go again to another endpoint, if it may:
    /// a call that never left always may; one that may have left when the pool's
    /// `retry.on` says (by default, KServe v2 inference only).
    #[inline(always)]
    pub(super) fn retryable(
        &self,
        result: &Result<Response<Bytes>, Failure>,
        parts: &http::request::Parts,
    ) -> Option<Reason> {
        match result {
            Ok(answer) if !answer.status().is_server_error() => None,
            Ok(answer) if answer.status() == http::StatusCode::SERVICE_UNAVAILABLE => {
                self.retried_on(parts).unavailable.then_some(Reason::Unavailable)
            }
            Ok(answer) if is_error(answer.status()) => self.retried_on(parts).error.then_some(Reason::Error),
            Ok(_) => None,
            Err(Failure::Connect(_)) => Some(Reason::Unreachable),
            Err(Failure::Unanswered(_)) => self.retried_on(parts).reset.then_some(Reason::Reset),
            Err(Failure::Other(_) | Failure::Garbled(_)) => self.retried_on(parts).error.then_some(Reason::Error),
            Err(Failure::Body(_) | Failure::Deadline) => None,
        }
    }

    /// The failures after a call may have left that are retried for `parts`: by
    /// default all three for KServe v2 inference; a reset or a 503 for an LLM call (its
    /// answer, or its stream's first event, never came: nothing was generated for the
    /// caller; a 500 may have been, so it is not sent again); none for other paths.
    fn retried_on(&self, parts: &http::request::Parts) -> RetryOn {
        self.retry.on.unwrap_or_else(|| {
            let path = parts.uri.path();
            let post = parts.method == http::Method::POST;
            let inference = post && path.starts_with("/v2/") && path.ends_with("/infer");
            let llm = post
                && (crate::llm::openai::is_path(path)
                    || path.starts_with("/v2/")
                        && (path.ends_with("/generate")
                            || path.ends_with("/generate_stream")
                            || path.ends_with(crate::protocol::INFER_STREAM)));
            RetryOn {
                reset: inference || llm,
                unavailable: inference || llm,
                error: inference,
            }
        })
    }

    /// Counts a retry or hedge of `family` ([`RETRIED`] for `reason`, [`REFUSED`] for
    /// `why`, [`HEDGED`] for `outcome`), on a tier pool only (as every series of a pool).
    #[cold]
    pub(super) fn count(&self, family: RetryFamily, value: &'static str) {
        if !matches!(self.role, Role::Control) {
            retry_counter(&self.route, self.role.as_str(), family, value).increment(1);
        }
    }
}

/// Whose retries a call's are: its caller's tenant when it has a credential, else the
/// one anonymous caller (a tenant named by a header alone could be anyone).
fn caller_of(parts: &http::request::Parts) -> u64 {
    use std::hash::BuildHasher;
    match parts.extensions.get::<crate::tenant::Tenant>() {
        Some(tenant) if tenant.is_authenticated() => foldhash::fast::FixedState::with_seed(1).hash_one(tenant.as_str()),
        _ => 0,
    }
}

/// Statuses retried as `error`: a server error other than 503 (retried as
/// `unavailable`) and those that say the request itself cannot be served (501, 505).
fn is_error(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 500 | 502 | 504)
}

/// Why a retry did not go.
enum Unsent {
    /// Its caller's share of the retry budget was spent.
    Budget,
    /// No endpoint, no retry or no time was left for it.
    Nowhere,
}
