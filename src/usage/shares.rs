//! What a batch pool's time each call is charged: the calls in flight on a pool share
//! its endpoints' time as a processor-sharing server would. The pool runs
//! `healthy endpoints × calls_per_endpoint` calls at once at full speed; with `k` calls
//! in flight each is given `min(1, capacity ÷ k)` of the time meanwhile. A call's
//! charge is what a virtual clock advancing at that rate moved while it was in flight,
//! so the charges of calls that overlap add up to the time the endpoints were busy,
//! never to more (two batches in flight on an endpoint that runs one at a time are
//! charged the wall time once between them, not each its wait behind the other).
//!
//! The per-request equivalent `t(1)` is learned from each answered call's **service
//! time**, its time less its wait behind the calls ahead of it: the pool is taken as
//! a first-come first-served server of that many places, so a call that found them all
//! taken began when the completion that freed one came (a call that found a free place
//! began at once, and its measured time is the endpoint's work). Batches of every
//! size are remembered apart ([`BySize`]), so a pool that has sent only full batches
//! for an hour still prices one row from the smaller ones it sent before; until the
//! sizes seen can tell `t(1)`, the ledger says the rows are unpriced.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::tiers::cost::BySize;

/// A batch pool's shared time and the cost learned from its calls' service times.
#[derive(Debug)]
pub struct Shares {
    clock: Mutex<Clock>,
    /// Calls one endpoint runs at once at full speed (the pool's `calls_per_endpoint`).
    per_endpoint: AtomicU32,
    /// `t(n)` learned from the calls' service times.
    alone: BySize,
}

/// The completions [`Shares`] remembers the time of: more than a pool has in flight.
const ENDS: usize = 256;

#[derive(Debug)]
struct Clock {
    /// When `virtual_ns` was last moved.
    at: Instant,
    /// Nanoseconds of one call's share since the pool was last idle.
    virtual_ns: f64,
    in_flight: u32,
    /// Calls completed since the pool was made, and when the last [`ENDS`] did.
    done: u64,
    ends: Box<[Instant; ENDS]>,
}

/// A call in flight on the pool, from [`Shares::begin`] until [`Call::end`] (or its
/// drop, for a call whose future was let go).
#[derive(Debug)]
pub struct Call<'a> {
    shares: &'a Shares,
    started: Instant,
    virtual_ns: f64,
    /// Calls in flight when it started, completions counted then, and the places the
    /// pool had: which completion freed its place if it had to wait for one.
    ahead: (u32, u64, u32),
    ended: bool,
}

impl Default for Shares {
    fn default() -> Self {
        Shares {
            clock: Mutex::new(Clock {
                at: Instant::now(),
                virtual_ns: 0.0,
                in_flight: 0,
                done: 0,
                ends: Box::new([Instant::now(); ENDS]),
            }),
            per_endpoint: AtomicU32::new(1),
            alone: BySize::default(),
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
        let ahead = (clock.in_flight, clock.done, self.places(healthy));
        clock.in_flight += 1;
        Call {
            shares: self,
            started: now,
            virtual_ns: clock.virtual_ns,
            ahead,
            ended: false,
        }
    }

    /// `t(1)` as the pool's calls' service times tell it; `None` until they do.
    pub fn one(&self) -> Option<Duration> {
        self.alone.one()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls the pool runs at once at full speed with `healthy` endpoints.
    fn places(&self, healthy: usize) -> u32 {
        u32::try_from(healthy.max(1))
            .unwrap_or(u32::MAX)
            .saturating_mul(self.per_endpoint.load(Relaxed))
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
        let places = f64::from(self.places(healthy));
        clock.virtual_ns += elapsed * (places / f64::from(clock.in_flight)).min(1.0);
    }

    /// `call` leaves the pool: now, the clock then, and when its service began (none
    /// when the completions did not come in the order of a first-come first-served
    /// server, or too long ago to be remembered).
    fn leave(&self, call: &Call<'_>, healthy: usize) -> (Instant, f64, Option<Instant>) {
        let now = Instant::now();
        let mut clock = self.lock();
        self.advance(&mut clock, now, healthy);
        clock.in_flight = clock.in_flight.saturating_sub(1);
        let (ahead, done, places) = call.ahead;
        let began = match ahead.checked_sub(places) {
            None => Some(call.started),
            // Every place taken: it began when the (ahead − places + 1)th completion
            // after it came freed one.
            Some(behind) => {
                let freed = done + u64::from(behind);
                (freed < clock.done && clock.done - freed <= ENDS as u64)
                    .then(|| clock.ends[(freed % ENDS as u64) as usize].max(call.started))
            }
        };
        let slot = (clock.done % ENDS as u64) as usize;
        clock.ends[slot] = now;
        clock.done += 1;
        (now, clock.virtual_ns, began)
    }
}

impl Call<'_> {
    /// The call ended, the pool having `healthy` endpoints now: how long it took and its
    /// share of the pool's time. An answered call of `rows` rows is learned from by its
    /// service time.
    pub fn end(mut self, healthy: usize, answered: Option<u64>) -> (Duration, Duration) {
        self.ended = true;
        let (now, virtual_ns, began) = self.shares.leave(&self, healthy);
        let took = now.saturating_duration_since(self.started);
        let share = Duration::from_nanos((virtual_ns - self.virtual_ns).max(0.0) as u64).min(took);
        if let (Some(rows), Some(began)) = (answered, began) {
            self.shares.alone.observe(rows, now.saturating_duration_since(began));
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

    /// A server of one place, `t(n) = 7.5 ms + 0.085 ms × n`, always sent the next
    /// batch while one is in flight (two in flight, as `max_in_flight = 2`): every
    /// batch but the first waits behind another for the whole of its service.
    async fn pipelined(shares: &Shares, sizes: impl IntoIterator<Item = u64>) -> (Duration, Duration) {
        let service = |n: u64| Duration::from_micros(7_500 + 85 * n);
        let started = Instant::now();
        let mut sizes = sizes.into_iter();
        let Some(first) = sizes.next() else {
            return (Duration::ZERO, Duration::ZERO);
        };
        let mut serving = (shares.begin(1), first);
        let mut charged = Duration::ZERO;
        for next in sizes {
            let waiting = shares.begin(1);
            tokio::time::advance(service(serving.1)).await;
            charged += serving.0.end(1, Some(serving.1)).1;
            serving = (waiting, next);
        }
        tokio::time::advance(service(serving.1)).await;
        charged += serving.0.end(1, Some(serving.1)).1;
        (charged, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn learns_one_row_from_service_times_behind_a_queue() {
        let shares = Shares::default();
        let (charged, wall) = pipelined(&shares, [1, 8, 16, 32, 2, 48, 24, 10, 4, 64]).await;
        // Two always in flight, the time charged once: the shares are the wall time.
        assert!(close(charged, wall), "{charged:?} in {wall:?}");
        let one = shares.one().expect("sizes spread");
        assert!(close(one, Duration::from_micros(7_585)), "{one:?}");
        // Full batches for a long time: the line still reaches one row.
        let (charged, wall) = pipelined(&shares, std::iter::repeat_n(64, 2_000)).await;
        assert!(close(charged, wall), "{charged:?} in {wall:?}");
        assert!(close(shares.one().expect("kept"), Duration::from_micros(7_585)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_that_only_sent_one_size_cannot_price_one_row() {
        let shares = Shares::default();
        pipelined(&shares, std::iter::repeat_n(64, 100)).await;
        assert_eq!(shares.one(), None);
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
