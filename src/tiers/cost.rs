//! The learned cost of a batch pool: `t(n) ≈ a + b·n`, estimated online from the
//! latencies the micro-batch tier observes.
//!
//! Beside the batcher, which asks it when growing a batch would make the earliest
//! deadline miss, and the micro-batch tier, which asks it whether a new request can
//! still be answered in time. The estimate is a least-squares line through recent
//! `(rows, seconds)` observations, with exponential forgetting so it follows a backend
//! whose speed changes. Until it has seen enough batches (and at least two sizes), it
//! predicts nothing and nobody is refused on its word. [`BySize`] is the same line
//! with each range of sizes remembered apart, for the usage ledger's `t(1)`.

use std::sync::Mutex;
use std::time::Duration;

/// Weight kept by past observations at each new one (a memory of about 50 batches).
const FORGET: f64 = 0.98;
/// Observations needed before any prediction.
const WARM_UP: u64 = 8;

/// The learned cost of one batch pool.
#[derive(Debug, Default)]
pub struct Cost {
    sums: Mutex<Sums>,
}

/// The fitted line: `t(n) = fixed + per_row·n`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Fixed cost per batch (`a`).
    pub fixed: Duration,
    /// Cost per row (`b`).
    pub per_row: Duration,
    /// Batches observed.
    pub samples: u64,
    /// How far the recent batches fall from the line: the root mean square of their
    /// differences (weighted as the fit weighs them).
    pub rms_error: Duration,
}

/// Exponentially weighted sums for the least-squares fit.
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
    tt: f64,
    samples: u64,
}

impl Cost {
    /// A cost model that knows nothing yet.
    pub fn new() -> Self {
        Cost::default()
    }

    /// Records that a batch of `rows` rows took `took`.
    pub fn observe(&self, rows: u64, took: Duration) {
        self.sums.lock().unwrap_or_else(|e| e.into_inner()).add(rows, took);
    }

    /// The current fit, once enough batches were seen.
    pub fn estimate(&self) -> Option<Estimate> {
        self.sums.lock().unwrap_or_else(|e| e.into_inner()).fit()
    }

    /// Predicted time of a batch of `rows` rows; `None` while still learning.
    pub fn predict(&self, rows: u64) -> Option<Duration> {
        self.estimate().map(|e| e.predict(rows))
    }
}

/// Size ranges [`BySize`] remembers apart: 1, 2–3, 4–7, … rows, the last 128 and more.
const SIZES: usize = 8;

/// A learned cost that remembers each range of batch sizes apart (1, 2–3, 4–7, …
/// rows), each its last 50 or so batches: a pool that has sent only full batches for
/// an hour still knows what the smaller ones it sent before cost, so the line through
/// them still reaches one row. What the usage ledger prices a row alone with.
#[derive(Debug, Default)]
pub struct BySize {
    sums: Mutex<[Sums; SIZES]>,
}

impl BySize {
    /// Records that a batch of `rows` rows took `took`.
    pub fn observe(&self, rows: u64, took: Duration) {
        let range = (rows.max(1).ilog2() as usize).min(SIZES - 1);
        self.sums.lock().unwrap_or_else(|e| e.into_inner())[range].add(rows, took);
    }

    /// `t(1)`, once the batches remembered can tell it: enough of them, their sizes
    /// spread (a standard deviation of at least a tenth of their mean) so the line
    /// reaches one row, or of about one row each. A line through batches of one size
    /// is flat at their mean, which says nothing of one row.
    pub fn one(&self) -> Option<Duration> {
        let all = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        let s = all.iter().fold(Sums::default(), |sum, s| sum.with(s));
        let mean = s.n / s.w;
        let spread = (s.nn / s.w - mean * mean).max(0.0).sqrt();
        let tells = mean <= 1.5 || spread >= 0.1 * mean;
        s.fit().filter(|_| tells).map(|e| e.predict(1))
    }
}

impl Sums {
    /// Adds a batch of `rows` rows that took `took`, the past weighing [`FORGET`] less.
    fn add(&mut self, rows: u64, took: Duration) {
        let (n, t) = (rows as f64, took.as_secs_f64());
        self.w = self.w * FORGET + 1.0;
        self.n = self.n * FORGET + n;
        self.nn = self.nn * FORGET + n * n;
        self.t = self.t * FORGET + t;
        self.nt = self.nt * FORGET + n * t;
        self.tt = self.tt * FORGET + t * t;
        self.samples += 1;
    }

    /// These and `other` together.
    fn with(self, other: &Sums) -> Sums {
        Sums {
            w: self.w + other.w,
            n: self.n + other.n,
            nn: self.nn + other.nn,
            t: self.t + other.t,
            nt: self.nt + other.nt,
            tt: self.tt + other.tt,
            samples: self.samples + other.samples,
        }
    }

    /// The least-squares line, once [`WARM_UP`] batches were seen.
    fn fit(&self) -> Option<Estimate> {
        if self.samples < WARM_UP {
            return None;
        }
        let det = self.w * self.nn - self.n * self.n;
        let mean_t = self.t / self.w;
        // Every batch the same size (or nearly): the line is flat at the mean.
        let (a, b) = if det.abs() <= 1e-9 * self.w * self.nn.max(1.0) {
            (mean_t, 0.0)
        } else {
            let b = ((self.w * self.nt - self.n * self.t) / det).max(0.0);
            let a = ((self.t - b * self.n) / self.w).max(0.0);
            (a, b)
        };
        // Σw(t − a − b·n)², expanded over the sums kept.
        let squares =
            self.tt - 2.0 * a * self.t - 2.0 * b * self.nt + a * a * self.w + 2.0 * a * b * self.n + b * b * self.nn;
        Some(Estimate {
            fixed: secs(a),
            per_row: secs(b),
            samples: self.samples,
            rms_error: secs((squares.max(0.0) / self.w).sqrt()),
        })
    }
}

impl Estimate {
    /// `fixed + per_row·rows`, saturating.
    pub fn predict(&self, rows: u64) -> Duration {
        let rows = u32::try_from(rows).unwrap_or(u32::MAX);
        self.fixed.saturating_add(self.per_row.saturating_mul(rows))
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(micros: u64) -> Duration {
        Duration::from_micros(micros)
    }

    fn close(got: Duration, want: Duration) -> bool {
        got.abs_diff(want) <= us(5)
    }

    #[test]
    fn knows_nothing_until_warmed_up() {
        let cost = Cost::new();
        for _ in 0..WARM_UP - 1 {
            cost.observe(4, us(1_000));
        }
        assert_eq!(cost.predict(4), None);
        cost.observe(4, us(1_000));
        assert!(close(cost.predict(4).expect("warm"), us(1_000)));
    }

    #[test]
    fn learns_a_line_from_exact_points() {
        let cost = Cost::new();
        for rows in [1, 8, 16, 32, 64, 2, 48, 24, 10] {
            cost.observe(rows, us(7_500 + 85 * rows));
        }
        let e = cost.estimate().expect("warm");
        assert!(close(e.fixed, us(7_500)), "{e:?}");
        assert!(close(e.per_row, us(85)), "{e:?}");
        assert!(close(cost.predict(128).expect("warm"), us(7_500 + 85 * 128)));
        assert!(e.rms_error <= us(2), "points on the line: {e:?}");
    }

    #[test]
    fn says_how_far_the_batches_fall_from_the_line() {
        // Every size alike, alternately 1 ms above and below the line: 1 ms off each.
        let cost = Cost::new();
        for i in 0..400u64 {
            let rows = 1 + i % 16;
            let off: i64 = if (i / 16) % 2 == 0 { 1_000 } else { -1_000 };
            cost.observe(rows, us((5_000 + 100 * rows as i64 + off) as u64));
        }
        let e = cost.estimate().expect("warm");
        assert!(e.rms_error.abs_diff(us(1_000)) < us(100), "{e:?}");
        assert!(e.per_row.abs_diff(us(100)) < us(20), "{e:?}");
    }

    #[test]
    fn follows_a_backend_that_slows_down() {
        let cost = Cost::new();
        for i in 0..50 {
            cost.observe(1 + i % 8, us(1_000 + 100 * (1 + i % 8)));
        }
        for i in 0..300 {
            cost.observe(1 + i % 8, us(4_000 + 400 * (1 + i % 8)));
        }
        let e = cost.estimate().expect("warm");
        assert!(e.fixed.abs_diff(us(4_000)) < us(100), "{e:?}");
        assert!(e.per_row.abs_diff(us(400)) < us(20), "{e:?}");
    }

    #[test]
    fn by_size_keeps_the_smaller_batches_while_only_full_ones_come() {
        let learned = BySize::default();
        for rows in [1, 8, 16, 32, 2, 48, 24, 10, 4, 64] {
            learned.observe(rows, us(7_500 + 85 * rows));
        }
        let one = learned.one().expect("spread");
        assert!(close(one, us(7_585)), "{one:?}");
        // An hour of full batches, a little slower than the line: the small ones are
        // still remembered, and the line still reaches one row.
        for _ in 0..5_000 {
            learned.observe(64, us(7_500 + 85 * 64 + 100));
        }
        let one = learned.one().expect("still spread");
        assert!(one.abs_diff(us(7_585)) < us(300), "{one:?}");
        // Only ever one size: it cannot tell.
        let full = BySize::default();
        for _ in 0..100 {
            full.observe(64, us(13_000));
        }
        assert_eq!(full.one(), None);
        // Only ever one row: it can.
        let single = BySize::default();
        for _ in 0..10 {
            single.observe(1, us(7_600));
        }
        assert!(close(single.one().expect("one row each"), us(7_600)));
    }

    #[test]
    fn never_predicts_negative_or_nonsense() {
        let cost = Cost::new();
        // Bigger batches faster (noise): the slope clamps at zero.
        for (rows, t) in [
            (1, 900),
            (2, 800),
            (4, 700),
            (8, 600),
            (16, 500),
            (32, 400),
            (64, 300),
            (128, 200),
        ] {
            cost.observe(rows, us(t));
        }
        let e = cost.estimate().expect("warm");
        assert_eq!(e.per_row, Duration::ZERO);
        assert!(e.fixed > Duration::ZERO);
        assert!(e.predict(u64::MAX) >= e.fixed);
    }
}
