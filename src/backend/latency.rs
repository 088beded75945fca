//! What a pool has learned of its own latency, so that a caller's budget is never taken
//! for an endpoint's fault.
//!
//! Beside every call of a pool. Each answered call's time is counted in a log-linear
//! histogram (four buckets per doubling, 25% wide) of two generations: the one filling
//! and the one before it, so the figures follow the last 512 to 1,024 answers and a pool
//! whose backends speed up or slow down is read afresh within a generation. From it the
//! pool keeps three figures, refreshed every 32 answers so a call reads one atomic each:
//!
//! - **p99**, the limit a call cut by its deadline must have passed before the cut
//!   counts against the endpoint (a caller's 1 ms budget on a 5 ms backend says nothing
//!   about the backend);
//! - **p95**, how long a hedged call runs before its second copy goes (unless the
//!   pool's `hedge.after` sets it);
//! - **the floor**, the time nine calls in ten take: a call whose budget left is below
//!   it is refused before it is sent (it would only load the backend and then fail).
//!
//! Until [`WARM_UP`] calls were answered all are unknown: no deadline cut counts,
//! nobody is refused on the pool's word and no call is hedged on it.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Answers counted before the pool's figures are believed.
pub const WARM_UP: u32 = 20;
/// Answers in one generation.
const GENERATION: u32 = 512;
/// Answers between two refreshes of the figures.
const REFRESH: u32 = 32;
/// Buckets: four per doubling of microseconds, up to 2^27 µs (about 134 s).
const BUCKETS: usize = 28 * 4;
/// A figure not known yet.
const UNKNOWN: u64 = u64::MAX;

/// The learned latency of one pool's calls.
#[derive(Debug)]
pub struct Latency {
    counts: [[AtomicU32; BUCKETS]; 2],
    /// The generation filling now (0 or 1) and how many it holds.
    filling: AtomicUsize,
    filled: AtomicU32,
    /// Answers counted in all, to [`WARM_UP`] (saturating).
    seen: AtomicU32,
    /// The figures, in microseconds ([`UNKNOWN`] until warmed up).
    p99: AtomicU64,
    p95: AtomicU64,
    floor: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            filling: AtomicUsize::new(0),
            filled: AtomicU32::new(0),
            seen: AtomicU32::new(0),
            p99: AtomicU64::new(UNKNOWN),
            p95: AtomicU64::new(UNKNOWN),
            floor: AtomicU64::new(UNKNOWN),
        }
    }
}

impl Latency {
    /// Counts an answered call that took `took`.
    #[inline]
    pub fn answered(&self, took: Duration) {
        let generation = self.filling.load(Ordering::Relaxed) & 1;
        self.counts[generation][bucket(took)].fetch_add(1, Ordering::Relaxed);
        let filled = self.filled.fetch_add(1, Ordering::Relaxed) + 1;
        let warmed =
            self.seen.load(Ordering::Relaxed) < WARM_UP && self.seen.fetch_add(1, Ordering::Relaxed) + 1 == WARM_UP;
        if filled >= GENERATION {
            // The one call that fills the generation turns it over: the older one is
            // emptied and fills next. A call racing the turn may count in either.
            let next = generation ^ 1;
            for count in &self.counts[next] {
                count.store(0, Ordering::Relaxed);
            }
            self.filling.store(next, Ordering::Relaxed);
            self.filled.store(0, Ordering::Relaxed);
        }
        if warmed || filled % REFRESH == 0 {
            self.refresh();
        }
    }

    /// The time 99 calls in 100 stay within, once learned.
    pub fn p99(&self) -> Option<Duration> {
        known(self.p99.load(Ordering::Relaxed))
    }

    /// The time 19 calls in 20 take at most, once learned: when a hedged call's
    /// second copy goes.
    pub fn p95(&self) -> Option<Duration> {
        known(self.p95.load(Ordering::Relaxed))
    }

    /// The time 9 calls in 10 take at least, once learned.
    pub fn floor(&self) -> Option<Duration> {
        known(self.floor.load(Ordering::Relaxed))
    }

    /// Recomputes the figures from both generations.
    fn refresh(&self) {
        if self.seen.load(Ordering::Relaxed) < WARM_UP {
            return;
        }
        let mut counts = [0u64; BUCKETS];
        for generation in &self.counts {
            for (sum, count) in counts.iter_mut().zip(generation) {
                *sum += u64::from(count.load(Ordering::Relaxed));
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return;
        }
        // The floor is the lower edge of the bucket holding the 10th percentile, p99
        // the upper edge of the one holding the 99th: each errs toward the caller.
        let (mut floor, mut p95, mut p99) = (None, None, None);
        let mut below = 0;
        for (i, n) in counts.iter().enumerate() {
            below += n;
            if floor.is_none() && below * 10 >= total {
                floor = Some(bounds(i).0);
            }
            if p95.is_none() && below * 100 >= total * 95 {
                p95 = Some(bounds(i).1);
            }
            if below * 100 >= total * 99 {
                p99 = Some(bounds(i).1);
                break;
            }
        }
        self.floor.store(floor.unwrap_or(0), Ordering::Relaxed);
        self.p99.store(p99.unwrap_or(UNKNOWN), Ordering::Relaxed);
        self.p95.store(p95.unwrap_or(UNKNOWN), Ordering::Relaxed);
    }
}

fn known(micros: u64) -> Option<Duration> {
    (micros != UNKNOWN).then(|| Duration::from_micros(micros))
}

/// The bucket of `took`: microseconds below 4 on their own, then four a doubling.
fn bucket(took: Duration) -> usize {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    if us < 4 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize;
    let sub = ((us >> (octave - 2)) & 3) as usize;
    (octave * 4 + sub).min(BUCKETS - 1)
}

/// The lower and upper edges of bucket `i`, in microseconds.
fn bounds(i: usize) -> (u64, u64) {
    if i < 4 {
        return (i as u64, i as u64 + 1);
    }
    let (octave, sub) = (i / 4, (i % 4) as u64);
    let width = 1u64 << (octave - 2);
    let lower = (4 + sub) * width;
    (lower, lower + width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn buckets_hold_their_values() {
        for us in [0u64, 1, 3, 4, 5, 7, 8, 100, 999, 5_000, 123_456, 10_000_000] {
            let (lo, hi) = bounds(bucket(Duration::from_micros(us)));
            assert!(lo <= us && us < hi, "{us} µs in [{lo}, {hi})");
            assert!(hi - lo <= lo.max(4) / 4 + 1, "{us}: buckets are 25% wide");
        }
        assert_eq!(
            bucket(Duration::from_secs(100_000)),
            BUCKETS - 1,
            "the last holds the rest"
        );
    }

    #[test]
    fn knows_nothing_until_warmed_up_then_reads_the_distribution() {
        let latency = Latency::default();
        for _ in 0..WARM_UP - 1 {
            latency.answered(ms(5));
        }
        assert_eq!((latency.p99(), latency.floor()), (None, None));
        latency.answered(ms(5));
        let (p99, floor) = (latency.p99().expect("learned"), latency.floor().expect("learned"));
        assert!(p99 >= ms(5) && p99 <= ms(7), "{p99:?}");
        assert!(floor <= ms(5) && floor >= ms(4), "{floor:?}");
        // A slow tail of 2% moves p99 to it, and the floor not at all.
        for i in 0..1_000 {
            latency.answered(if i % 50 == 0 { ms(40) } else { ms(5) });
        }
        let p99 = latency.p99().expect("learned");
        assert!(p99 >= ms(40) && p99 <= ms(50), "{p99:?}");
        let p95 = latency.p95().expect("learned");
        assert!(p95 >= ms(5) && p95 <= ms(7), "a 2% tail is past p95: {p95:?}");
        assert!(latency.floor().expect("learned") <= ms(5));
    }

    #[test]
    fn follows_a_backend_that_slows_down() {
        let latency = Latency::default();
        for _ in 0..2_000 {
            latency.answered(ms(2));
        }
        for _ in 0..2 * GENERATION {
            latency.answered(ms(20));
        }
        let floor = latency.floor().expect("learned");
        assert!(
            floor >= ms(16),
            "within two generations only the new speed is left: {floor:?}"
        );
    }
}
