//! A pool's retry budget: how many of its failed calls may go again to another endpoint.
//!
//! As Finagle's retry budget: every call deposits, every retry withdraws, over a window
//! of the last [`WINDOW`] seconds; a retry is allowed while the retries in the window
//! stay under `budget_per_mille` of the calls plus `min_per_second` per second of the
//! window. So a pool whose endpoints all fail is called at most about 10% harder (the
//! default), never twice as hard, while a pool with one bad endpoint among many has its
//! few failures retried. A call costs one atomic add in the slot of its second. Hedges
//! (a second copy of a slow call) are counted against the same calls in their own
//! share, the duplicate-work budget, with no floor. The counters of retries and hedges
//! are made here too, for the pool and its calls sent again.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::policy::RetrySpec;

/// Seconds the budget looks back over.
pub(super) const WINDOW: u64 = 10;

/// Why a call went again to another endpoint: the `reason` label of
/// `tiergate_backend_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    /// No connection could be made: the request never left.
    Unreachable,
    /// The connection closed or was reset before any byte of the answer.
    Reset,
    /// The backend answered 503 (or gRPC `UNAVAILABLE`).
    Unavailable,
}

impl Reason {
    /// The label value.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Reason::Unreachable => "unreachable",
            Reason::Reset => "reset",
            Reason::Unavailable => "unavailable",
        }
    }
}

/// Calls, retries and hedges per second over the window, each slot tagged with its
/// second.
#[derive(Debug)]
pub(super) struct Budget {
    started: Instant,
    per_mille: u64,
    min_per_second: u64,
    hedge_per_mille: u64,
    calls: Slots,
    retries: Slots,
    hedges: Slots,
}

/// One counter per second of the window: the second (high 32 bits) and the count.
#[derive(Debug, Default)]
struct Slots([AtomicU64; WINDOW as usize]);

impl Budget {
    /// The budget `spec` sets for retries, and `hedge_per_mille` for hedges; empty.
    pub(super) fn new(spec: &RetrySpec, hedge_per_mille: u32) -> Budget {
        Budget {
            started: Instant::now(),
            per_mille: u64::from(spec.budget_per_mille),
            min_per_second: u64::from(spec.min_per_second),
            hedge_per_mille: u64::from(hedge_per_mille),
            calls: Slots::default(),
            retries: Slots::default(),
            hedges: Slots::default(),
        }
    }

    /// A call was sent at `at` (a retry is a call too).
    #[inline]
    pub(super) fn deposit(&self, at: Instant) {
        self.calls.add(self.second(at));
    }

    /// Takes a retry at `now` out of the budget; `false` when the window has none left.
    pub(super) fn withdraw(&self, now: Instant) -> bool {
        let second = self.second(now);
        let allowed = self.calls.sum(second) * self.per_mille / 1000 + self.min_per_second * WINDOW;
        self.retries.take(second, allowed)
    }

    /// Takes a hedge at `now` out of the duplicate-work budget (hedges within
    /// `hedge_per_mille` of the calls over the window, no floor); `false` when the
    /// window has none left.
    pub(super) fn hedge(&self, now: Instant) -> bool {
        let second = self.second(now);
        let allowed = self.calls.sum(second) * self.hedge_per_mille / 1000;
        self.hedges.take(second, allowed)
    }

    /// Seconds since the budget began, as kept in a slot (wraps after 136 years).
    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_secs() & u64::from(u32::MAX)
    }
}

impl Slots {
    /// One more in `second`'s slot (emptied first when it last counted an older second).
    fn add(&self, second: u64) {
        let slot = &self.0[(second % WINDOW) as usize];
        let mut seen = slot.load(Ordering::Relaxed);
        loop {
            let next = match seen >> 32 == second {
                true => seen + 1,
                false => (second << 32) | 1,
            };
            match slot.compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
    }

    /// One more in `second`'s slot if the window holds fewer than `allowed`.
    fn take(&self, second: u64, allowed: u64) -> bool {
        if self.sum(second) >= allowed {
            return false;
        }
        self.add(second);
        true
    }

    /// The counts of the window ending at `second`.
    fn sum(&self, second: u64) -> u64 {
        self.0
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|v| second.wrapping_sub(v >> 32) < WINDOW)
            .map(|v| v & u64::from(u32::MAX))
            .sum()
    }
}

/// The families of retry and hedge counters, by their label: `reason` for retries
/// sent, `why` for retries refused, `outcome` for hedges.
pub(super) type RetryFamily = (&'static str, &'static str);
pub(super) const RETRIED: RetryFamily = (crate::metrics::BACKEND_RETRIES, "reason");
pub(super) const REFUSED: RetryFamily = (crate::metrics::BACKEND_RETRIES_REFUSED, "why");
pub(super) const HEDGED: RetryFamily = (crate::metrics::BACKEND_HEDGES, "outcome");

/// The counter of `family` for `route`'s `tier` pool with its label at `value`.
pub(super) fn retry_counter(route: &str, tier: &str, (family, label): RetryFamily, value: &str) -> ::metrics::Counter {
    let labels = [
        ("route", route.to_owned()),
        ("tier", tier.to_owned()),
        (label, value.to_owned()),
    ];
    ::metrics::counter!(family, &labels)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn spec(per_mille: u32, min_per_second: u32) -> RetrySpec {
        RetrySpec {
            on: None,
            max_retries: 2,
            budget_per_mille: per_mille,
            min_per_second,
        }
    }

    #[test]
    fn retries_stay_within_their_share_of_the_calls() {
        let budget = Budget::new(&spec(100, 0), 0);
        let t0 = budget.started;
        assert!(!budget.withdraw(t0), "no calls yet: no retries");
        for _ in 0..50 {
            budget.deposit(t0);
        }
        let allowed = (0..10).take_while(|_| budget.withdraw(t0)).count();
        assert_eq!(allowed, 5, "10% of 50 calls");
        for _ in 0..10 {
            budget.deposit(t0 + Duration::from_secs(3));
        }
        assert!(budget.withdraw(t0 + Duration::from_secs(3)), "60 calls allow a sixth");
        assert!(!budget.withdraw(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn the_window_forgets_what_is_older_than_ten_seconds() {
        let budget = Budget::new(&spec(100, 0), 0);
        let t0 = budget.started;
        for _ in 0..20 {
            budget.deposit(t0);
        }
        assert!(budget.withdraw(t0) && budget.withdraw(t0));
        assert!(!budget.withdraw(t0 + Duration::from_secs(9)), "still in the window");
        let later = t0 + Duration::from_secs(10);
        assert!(!budget.withdraw(later), "the calls left the window with their retries");
        for _ in 0..10 {
            budget.deposit(later);
        }
        assert!(budget.withdraw(later), "a slot reused for a later second starts again");
        assert!(!budget.withdraw(later));
    }

    #[test]
    fn a_floor_per_second_holds_without_calls() {
        let budget = Budget::new(&spec(0, 3), 0);
        let t0 = budget.started;
        let allowed = (0..100).take_while(|_| budget.withdraw(t0)).count();
        assert_eq!(allowed, 30, "3 a second over the 10 s window");
    }

    #[test]
    fn hedges_stay_within_their_own_share_without_a_floor() {
        let budget = Budget::new(&spec(100, 3), 20);
        let t0 = budget.started;
        assert!(
            !budget.hedge(t0),
            "no calls yet: no hedges, whatever the retries' floor"
        );
        for _ in 0..100 {
            budget.deposit(t0);
        }
        let allowed = (0..10).take_while(|_| budget.hedge(t0)).count();
        assert_eq!(allowed, 2, "2% of 100 calls");
        assert!(budget.withdraw(t0), "hedges take nothing from the retries");
    }
}
