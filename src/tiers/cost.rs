//! The learned cost of a batch pool: `t(n) ≈ a + b·n`, estimated online from the
//! latencies the micro-batch tier observes.
//!
//! Beside the batcher, which asks it when growing a batch would make the earliest
//! deadline miss, and the micro-batch tier, which asks it whether a new request can
//! still be answered in time. The estimate is a least-squares line through recent
//! `(rows, seconds)` observations, with exponential forgetting so it follows a backend
//! whose speed changes. Until it has seen enough batches (and at least two sizes), it
//! predicts nothing and nobody is refused on its word.

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
}

/// Exponentially weighted sums for the least-squares fit.
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
    samples: u64,
}

impl Cost {
    /// A cost model that knows nothing yet.
    pub fn new() -> Self {
        Cost::default()
    }

    /// Records that a batch of `rows` rows took `took`.
    pub fn observe(&self, rows: u64, took: Duration) {
        let (n, t) = (rows as f64, took.as_secs_f64());
        let mut s = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        s.w = s.w * FORGET + 1.0;
        s.n = s.n * FORGET + n;
        s.nn = s.nn * FORGET + n * n;
        s.t = s.t * FORGET + t;
        s.nt = s.nt * FORGET + n * t;
        s.samples += 1;
    }

    /// The current fit, once enough batches were seen.
    pub fn estimate(&self) -> Option<Estimate> {
        let s = *self.sums.lock().unwrap_or_else(|e| e.into_inner());
        if s.samples < WARM_UP {
            return None;
        }
        let det = s.w * s.nn - s.n * s.n;
        let mean_t = s.t / s.w;
        // Every batch the same size (or nearly): the line is flat at the mean.
        let (a, b) = if det.abs() <= 1e-9 * s.w * s.nn.max(1.0) {
            (mean_t, 0.0)
        } else {
            let b = ((s.w * s.nt - s.n * s.t) / det).max(0.0);
            let a = ((s.t - b * s.n) / s.w).max(0.0);
            (a, b)
        };
        Some(Estimate {
            fixed: secs(a),
            per_row: secs(b),
            samples: s.samples,
        })
    }

    /// `t(1)`, only once the batches seen can tell it: their sizes spread (a standard
    /// deviation of at least a tenth of their mean) so the line reaches one row, or
    /// they were of about one row each. A line through batches of one size is flat at
    /// their mean, which says nothing of one row.
    pub fn one(&self) -> Option<Duration> {
        let estimate = self.estimate()?;
        let s = *self.sums.lock().unwrap_or_else(|e| e.into_inner());
        let mean = s.n / s.w;
        let spread = (s.nn / s.w - mean * mean).max(0.0).sqrt();
        (mean <= 1.5 || spread >= 0.1 * mean).then(|| estimate.predict(1))
    }

    /// Predicted time of a batch of `rows` rows; `None` while still learning.
    pub fn predict(&self, rows: u64) -> Option<Duration> {
        self.estimate().map(|e| e.predict(rows))
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
