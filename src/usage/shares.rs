//! What a batch pool's time each call is charged: the calls in flight on a pool share
//! its endpoints' time as a processor-sharing server would. The pool runs
//! `healthy endpoints × calls_per_endpoint` calls at once at full speed; with `k` calls
//! in flight each is given `min(1, capacity ÷ k)` of the time meanwhile. A call's
//! charge is what a virtual clock advancing at that rate moved while it was in flight,
//! so the charges of calls that overlap add up to the time the endpoints were busy,
//! never to more (two batches in flight on an endpoint that runs one at a time are
//! charged the wall time once between them, not each its wait behind the other).
//!
//! The calls that had their share to themselves (no more in flight than the pool runs
//! at once, their whole time) measured the endpoint's cost and nothing else: the ledger
//! learns the per-request equivalent `t(1)` from those alone (a pool always saturated
//! keeps what it learned while it was not), and only once the batches seen tell it:
//! sizes spread enough for the line to reach one row, or one row each.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::tiers::cost::Cost;

/// A batch pool's shared time and the cost learned from its uncontended calls.
#[derive(Debug)]
pub struct Shares {
    clock: Mutex<Clock>,
    /// Calls one endpoint runs at once at full speed (the pool's `calls_per_endpoint`).
    per_endpoint: AtomicU32,
    /// `t(n)` learned from calls that had their share to themselves.
    alone: Cost,
}

#[derive(Debug)]
struct Clock {
    /// When `virtual_ns` was last moved.
    at: Instant,
    /// Nanoseconds of one call's share since the pool was last idle.
    virtual_ns: f64,
    in_flight: u32,
}

/// A call in flight on the pool, from [`Shares::begin`] until [`Call::end`] (or its
/// drop, for a call whose future was let go).
#[derive(Debug)]
pub struct Call<'a> {
    shares: &'a Shares,
    started: Instant,
    virtual_ns: f64,
    ended: bool,
}

impl Default for Shares {
    fn default() -> Self {
        Shares {
            clock: Mutex::new(Clock {
                at: Instant::now(),
                virtual_ns: 0.0,
                in_flight: 0,
            }),
            per_endpoint: AtomicU32::new(1),
            alone: Cost::new(),
        }
    }
}

impl Shares {
    /// Sets the calls one endpoint runs at once (from the pool's `[capacity]`).
    pub fn calls_per_endpoint(&self, calls: u32) {
        let calls = calls.max(1);
        if self.per_endpoint.load(Relaxed) != calls {
            self.per_endpoint.store(calls, Relaxed);
        }
    }

    /// A call starts on the pool, which has `healthy` endpoints now.
    pub fn begin(&self, healthy: usize) -> Call<'_> {
        let now = Instant::now();
        let mut clock = self.lock();
        self.advance(&mut clock, now, healthy);
        clock.in_flight += 1;
        Call {
            shares: self,
            started: now,
            virtual_ns: clock.virtual_ns,
            ended: false,
        }
    }

    /// `t(1)` as the pool's uncontended calls tell it; `None` until they do.
    pub fn one(&self) -> Option<Duration> {
        self.alone.one()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the clock to `now` at the rate each of the calls in flight was given.
    fn advance(&self, clock: &mut Clock, now: Instant, healthy: usize) {
        let elapsed = now.saturating_duration_since(clock.at).as_nanos() as f64;
        clock.at = now;
        if clock.in_flight == 0 {
            // Idle: nobody holds a reading, so the clock starts again from zero (and
            // never grows past a float's exact range).
            clock.virtual_ns = 0.0;
            return;
        }
        let capacity = healthy.max(1) as f64 * f64::from(self.per_endpoint.load(Relaxed));
        clock.virtual_ns += elapsed * (capacity / f64::from(clock.in_flight)).min(1.0);
    }

    fn leave(&self, healthy: usize) -> (Instant, f64) {
        let now = Instant::now();
        let mut clock = self.lock();
        self.advance(&mut clock, now, healthy);
        clock.in_flight = clock.in_flight.saturating_sub(1);
        (now, clock.virtual_ns)
    }
}

impl Call<'_> {
    /// The call ended, the pool having `healthy` endpoints now: how long it took and its
    /// share of the pool's time. An answered call of `rows` rows that had the whole of
    /// its share is learned from.
    pub fn end(mut self, healthy: usize, answered: Option<u64>) -> (Duration, Duration) {
        self.ended = true;
        let (now, virtual_ns) = self.shares.leave(healthy);
        let took = now.saturating_duration_since(self.started);
        let share = Duration::from_nanos((virtual_ns - self.virtual_ns).max(0.0) as u64).min(took);
        if let Some(rows) = answered {
            // Given less than the whole of its time (to 0.1%): it shared the pool.
            if share.as_secs_f64() >= took.as_secs_f64() * 0.999 {
                self.shares.alone.observe(rows, took);
            }
        }
        (took, share)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let mut clock = self.shares.lock();
            clock.in_flight = clock.in_flight.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn close(got: Duration, want: Duration) -> bool {
        got.abs_diff(want) <= Duration::from_micros(50)
    }

    #[tokio::test(start_paused = true)]
    async fn overlapping_calls_split_the_time_an_endpoint_runs_one_at_a_time() {
        let shares = Shares::default();
        // A from 0 to 20 ms, B from 0 to 30 ms: together 10 ms each, then B alone.
        let a = shares.begin(1);
        let b = shares.begin(1);
        tokio::time::advance(ms(20)).await;
        let a = a.end(1, Some(4)).1;
        tokio::time::advance(ms(10)).await;
        let b = b.end(1, Some(4)).1;
        assert!(close(a, ms(10)), "{a:?}");
        assert!(close(b, ms(20)), "{b:?}");
        // The shares add up to the time the endpoint was busy.
        assert!(close(a + b, ms(30)));
        // Neither had its share to itself: nothing learned.
        assert_eq!(shares.alone.estimate(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_within_the_capacity_are_each_charged_their_time() {
        let shares = Shares::default();
        shares.calls_per_endpoint(2);
        let a = shares.begin(1);
        let b = shares.begin(1);
        tokio::time::advance(ms(15)).await;
        assert!(close(a.end(1, None).1, ms(15)));
        assert!(close(b.end(1, None).1, ms(15)));
        // Two endpoints of one call each, three calls: two thirds of the time each.
        shares.calls_per_endpoint(1);
        let calls: Vec<_> = (0..3).map(|_| shares.begin(2)).collect();
        tokio::time::advance(ms(30)).await;
        for call in calls {
            assert!(close(call.end(2, None).1, ms(20)));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn learns_one_row_from_the_calls_that_ran_alone_and_only_when_it_can() {
        let shares = Shares::default();
        // Uncontended calls of one size: the line cannot reach one row.
        for _ in 0..10 {
            let call = shares.begin(1);
            tokio::time::advance(Duration::from_micros(7_500 + 85 * 64)).await;
            call.end(1, Some(64));
        }
        assert_eq!(shares.one(), None);
        for rows in [1, 8, 16, 32, 2, 48, 24, 10] {
            let call = shares.begin(1);
            tokio::time::advance(Duration::from_micros(7_500 + 85 * rows)).await;
            call.end(1, Some(rows));
        }
        let one = shares.one().expect("sizes spread");
        assert!(close(one, Duration::from_micros(7_585)), "{one:?}");
        // Contended calls, however slow, teach it nothing.
        for _ in 0..20 {
            let a = shares.begin(1);
            let b = shares.begin(1);
            tokio::time::advance(ms(100)).await;
            a.end(1, Some(1));
            b.end(1, Some(1));
        }
        assert!(close(shares.one().expect("kept"), Duration::from_micros(7_585)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_let_go_leaves_the_pool() {
        let shares = Shares::default();
        drop(shares.begin(1));
        let call = shares.begin(1);
        tokio::time::advance(ms(5)).await;
        assert!(close(call.end(1, None).1, ms(5)));
    }
}
