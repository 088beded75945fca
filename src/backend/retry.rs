//! A pool's retry budget: how many of its failed calls may go again to another endpoint.
//!
//! As Finagle's retry budget: every call deposits, every retry withdraws, over a window
//! of the last [`WINDOW`] seconds; a retry is allowed while the retries in the window
//! stay under `budget_per_mille` of the calls plus `min_per_second` per second of the
//! window. So a pool whose endpoints all fail is called at most about 10% harder (the
//! default), never twice as hard, while a pool with one bad endpoint among many has its
//! few failures retried. The budget is shared fairly by the callers who retry: while
//! others have retried in the window, a caller may take only its share (the budget over
//! the callers retrying), and a newcomer may go past the budget to take its own (the
//! retries of a window stay under twice the budget), so one caller's failing calls
//! cannot spend the retries another's need. Callers are told apart by their tenant's
//! credential (every caller without one is the same caller). A call costs one atomic
//! add in the slot of its second; only a retry looks at callers. Hedges
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
    /// The backend answered 500, 502 or 504, or with something that is not an answer.
    Error,
}

impl Reason {
    /// The label value.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Reason::Unreachable => "unreachable",
            Reason::Reset => "reset",
            Reason::Unavailable => "unavailable",
            Reason::Error => "error",
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
    /// Retries by caller over the window, for the callers who retried lately.
    callers: std::sync::Mutex<Vec<(u64, Slots)>>,
}

/// Callers whose retries a budget remembers at once (those with none in the window are
/// forgotten first).
const CALLERS: usize = 64;

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
            callers: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A call was sent at `at` (a retry is a call too).
    #[inline]
    pub(super) fn deposit(&self, at: Instant) {
        self.calls.add(self.second(at));
    }

    /// Takes a retry of `caller` at `now` out of the budget; `false` when its share of
    /// the window has none left (see the module's docs).
    pub(super) fn withdraw(&self, now: Instant, caller: u64) -> bool {
        let second = self.second(now);
        let allowed = self.calls.sum(second) * self.per_mille / 1000 + self.min_per_second * WINDOW;
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        let (mut own, mut others) = (0, 0u64);
        for (who, slots) in callers.iter() {
            match (*who == caller, slots.sum(second)) {
                (true, n) => own = n,
                (false, 0) => {}
                (false, _) => others += 1,
            }
        }
        let share = match allowed {
            0 => 0,
            allowed => (allowed / (others + 1)).max(1),
        };
        if own >= share || !self.retries.take(second, allowed.saturating_mul(2)) {
            return false;
        }
        match callers.iter().position(|(who, _)| *who == caller) {
            Some(i) => callers[i].1.add(second),
            None => {
                if callers.len() >= CALLERS {
                    callers.retain(|(_, slots)| slots.sum(second) > 0);
                }
                if callers.len() >= CALLERS {
                    callers.remove(0);
                }
                let slots = Slots::default();
                slots.add(second);
                callers.push((caller, slots));
            }
        }
        true
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
        assert!(!budget.withdraw(t0, 0), "no calls yet: no retries");
        for _ in 0..50 {
            budget.deposit(t0);
        }
        let allowed = (0..10).take_while(|_| budget.withdraw(t0, 0)).count();
        assert_eq!(allowed, 5, "10% of 50 calls");
        for _ in 0..10 {
            budget.deposit(t0 + Duration::from_secs(3));
        }
        assert!(
            budget.withdraw(t0 + Duration::from_secs(3), 0),
            "60 calls allow a sixth"
        );
        assert!(!budget.withdraw(t0 + Duration::from_secs(3), 0));
    }

    #[test]
    fn the_window_forgets_what_is_older_than_ten_seconds() {
        let budget = Budget::new(&spec(100, 0), 0);
        let t0 = budget.started;
        for _ in 0..20 {
            budget.deposit(t0);
        }
        assert!(budget.withdraw(t0, 0) && budget.withdraw(t0, 0));
        assert!(!budget.withdraw(t0 + Duration::from_secs(9), 0), "still in the window");
        let later = t0 + Duration::from_secs(10);
        assert!(
            !budget.withdraw(later, 0),
            "the calls left the window with their retries"
        );
        for _ in 0..10 {
            budget.deposit(later);
        }
        assert!(
            budget.withdraw(later, 0),
            "a slot reused for a later second starts again"
        );
        assert!(!budget.withdraw(later, 0));
    }

    #[test]
    fn one_caller_cannot_spend_the_retries_another_needs() {
        let budget = Budget::new(&spec(100, 0), 0);
        let t0 = budget.started;
        for _ in 0..100 {
            budget.deposit(t0);
        }
        let greedy = (0..20).take_while(|_| budget.withdraw(t0, 1)).count();
        assert_eq!(
            greedy, 10,
            "alone, a caller may take the whole budget: 10% of 100 calls"
        );
        let (victim, greedy) = (2, 1);
        let mine = (0..20).take_while(|_| budget.withdraw(t0, victim)).count();
        assert_eq!(
            mine, 5,
            "a newcomer still has its share, half of the budget beside one other"
        );
        assert!(!budget.withdraw(t0, greedy), "past its share, the first caller waits");
        let more = |caller| (0..20).take_while(|_| budget.withdraw(t0, caller)).count();
        assert_eq!((more(3), more(4)), (3, 2), "a third of the budget, a fourth");
        assert_eq!(more(5), 0, "and the window stays under twice the budget");
        let later = t0 + Duration::from_secs(WINDOW);
        for _ in 0..100 {
            budget.deposit(later);
        }
        assert!(budget.withdraw(later, greedy), "a new window forgets");
    }

    #[test]
    fn a_floor_per_second_holds_without_calls() {
        let budget = Budget::new(&spec(0, 3), 0);
        let t0 = budget.started;
        let allowed = (0..100).take_while(|_| budget.withdraw(t0, 0)).count();
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
        assert!(budget.withdraw(t0, 0), "hedges take nothing from the retries");
    }
}
