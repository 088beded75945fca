//! The report of a run: a `Summary` computed from a `Recording`, printed as text and
//! written as JSON (`--json`). Milliseconds everywhere, with µs resolution.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::record::Recording;

/// The result of one run, or of one target of a comparison (its phases merged).
/// Field names are stable; the JSON shape is:
///
/// ```text
/// {
///   "label": "baseline",                // --label, or null
///   "url": "http://127.0.0.1:8000",     // base URL
///   "model": "resnet50",
///   "schedule": "constant 200/s",
///   "duration_s": 10.0,                 // measured window(s); warmup excluded
///   "warmup_s": 2.0,                    // per phase
///   "offered_rps": 200.0,               // scheduled / duration_s
///   "achieved_rps": 199.9,              // responses that ended inside the window / duration_s
///   "scheduled": 2000,                  // requests intended inside the window
///   "completed": 2000,                  // of those, got an HTTP response (any status)
///   "dropped_client_side": 0,           // not sent: --max-in-flight reached
///   "failures": 0,                      // transport errors + dropped + status >= 400
///   "latency_ms": {"count": 2000, "mean": 0.61, "p50": 0.512, "p90": 0.7, "p99": 1.2,
///                  "p999": 2.3, "max": 3.4},  // intended send time -> end of body
///   "send_lag_ms": { same shape },      // intended send time -> task start (generator lag)
///   "latency_distribution": [{"percentile": 0.0, "ms": 0.2}, ..., {"percentile": 99.99, "ms": 4.1}],
///                                       // 41 points, log-spaced towards the tail
///   "status_counts": {"200": 2000},
///   "errors": {"timeout": 1},           // transport errors by kind
///   "tiers": {"realtime": {"count": 2000, "p50_ms": 0.5, "p99_ms": 1.2}},  // "none" if no header
///   "series": [{"second": 0, "count": 200, "p50_ms": 0.5, "p99_ms": 1.1, "errors": 0}]
/// }
/// ```
///
/// `series` has one entry per second of intended send time; for a comparison the
/// target's phases follow each other.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Free text from `--label`.
    pub label: Option<String>,
    /// Base URL of the target.
    pub url: String,
    /// KServe v2 model name.
    pub model: String,
    /// The schedule, human-readable.
    pub schedule: String,
    /// Length of the measured window(s), s.
    pub duration_s: f64,
    /// Warmup before each measured window, s.
    pub warmup_s: f64,
    /// Requests per second the schedule intended in the window.
    pub offered_rps: f64,
    /// Responses per second that ended inside the window.
    pub achieved_rps: f64,
    /// Requests intended inside the window.
    pub scheduled: u64,
    /// Of those, how many got an HTTP response.
    pub completed: u64,
    /// Of those, how many were not sent because of `--max-in-flight`.
    pub dropped_client_side: u64,
    /// Transport errors + dropped + responses with status >= 400.
    pub failures: u64,
    /// Latency from intended send time to end of body.
    pub latency_ms: Percentiles,
    /// Latency of the 2xx responses only.
    pub ok_latency_ms: Percentiles,
    /// 2xx responses that arrived within the request budget (`--budget-ms`), when one
    /// was set; latency counts from the intended send time, so this is strict.
    pub ok_within_budget: Option<u64>,
    /// Lag of the generator: intended send time to the start of the request's task.
    pub send_lag_ms: Percentiles,
    /// Latency at percentiles `100 * (1 - 10^-x)` for x = 0, 0.1, ..., 4 (0% to 99.99%).
    pub latency_distribution: Vec<Quantile>,
    /// Responses by HTTP status code.
    pub status_counts: BTreeMap<String, u64>,
    /// Transport errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Latency by the `x-tiergate-tier` response header.
    pub tiers: BTreeMap<String, TierStats>,
    /// One entry per second of intended send time.
    pub series: Vec<SecondStats>,
}

/// Distribution of a histogram, ms.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Number of values.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
}

/// One point of a latency distribution.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Quantile {
    /// Percentile, 0 to 100.
    pub percentile: f64,
    /// Latency at that percentile, ms.
    pub ms: f64,
}

/// Latency of one tier.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct TierStats {
    /// Responses served by this tier.
    pub count: u64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
}

/// One second of the time series.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct SecondStats {
    /// Second index from the start of the measured window.
    pub second: usize,
    /// Responses to requests intended in this second.
    pub count: u64,
    /// Their median latency, ms.
    pub p50_ms: f64,
    /// Their 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Failures among requests intended in this second.
    pub errors: u64,
}

/// Facts about a run that the recording does not hold.
#[derive(Clone, Debug)]
pub struct Meta {
    /// `--label`.
    pub label: Option<String>,
    /// Base URL.
    pub url: String,
    /// Model name.
    pub model: String,
    /// The schedule, human-readable.
    pub schedule: String,
    /// Warmup per phase.
    pub warmup: Duration,
    /// The budget sent with every request, if any.
    pub budget_ms: Option<u64>,
}

impl Summary {
    /// Summarises a recording.
    pub fn new(meta: &Meta, rec: &Recording) -> Self {
        let secs = rec.window.as_secs_f64();
        let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        Self {
            label: meta.label.clone(),
            url: meta.url.clone(),
            model: meta.model.clone(),
            schedule: meta.schedule.clone(),
            duration_s: secs,
            warmup_s: meta.warmup.as_secs_f64(),
            offered_rps: per_sec(rec.scheduled),
            achieved_rps: per_sec(rec.completed_in_window),
            scheduled: rec.scheduled,
            completed: rec.completed(),
            dropped_client_side: rec.dropped_client_side,
            failures: rec.failures(),
            latency_ms: Percentiles::new(&rec.latency),
            ok_latency_ms: Percentiles::new(&rec.ok),
            ok_within_budget: meta.budget_ms.map(|b| rec.ok.count_between(0, b.saturating_mul(1000))),
            send_lag_ms: Percentiles::new(&rec.send_lag),
            latency_distribution: distribution(&rec.latency),
            status_counts: rec.statuses.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            errors: rec.errors.clone(),
            tiers: rec.tiers.iter().map(|(t, h)| (t.clone(), TierStats::new(h))).collect(),
            series: rec.series.iter().enumerate().map(SecondStats::new).collect(),
        }
    }
}

impl Percentiles {
    /// Percentiles of a µs histogram, in ms.
    pub fn new(h: &Histogram<u64>) -> Self {
        Self {
            count: h.len(),
            mean: h.mean().round() / 1000.0,
            p50: quantile_ms(h, 0.5),
            p90: quantile_ms(h, 0.9),
            p99: quantile_ms(h, 0.99),
            p999: quantile_ms(h, 0.999),
            max: ms(h.max()),
        }
    }
}

impl TierStats {
    fn new(h: &Histogram<u64>) -> Self {
        Self {
            count: h.len(),
            p50_ms: quantile_ms(h, 0.5),
            p99_ms: quantile_ms(h, 0.99),
        }
    }
}

impl SecondStats {
    fn new((second, s): (usize, &crate::record::Second)) -> Self {
        let h = &s.latency;
        Self {
            second,
            count: h.len(),
            p50_ms: quantile_ms(h, 0.5),
            p99_ms: quantile_ms(h, 0.99),
            errors: s.errors,
        }
    }
}

/// Points of the classic HdrHistogram plot: evenly spaced in `-log10(1 - q)`.
fn distribution(h: &Histogram<u64>) -> Vec<Quantile> {
    (0..=40)
        .map(|tenths| {
            let q = 1.0 - 10f64.powf(-f64::from(tenths) / 10.0);
            // Round so that 90, 99, 99.9... print as such.
            Quantile {
                percentile: (q * 1e8).round() / 1e6,
                ms: quantile_ms(h, q),
            }
        })
        .collect()
}

/// A µs value as ms (exact to 3 decimals).
pub fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// A quantile of a µs histogram, in ms.
pub fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    ms(h.value_at_quantile(q))
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.label.as_deref().map(|l| format!("{l}: ")).unwrap_or_default();
        writeln!(f, "{label}{} model {}", self.url, self.model)?;
        writeln!(
            f,
            "schedule     {} for {:.3}s (warmup {:.3}s)",
            self.schedule, self.duration_s, self.warmup_s
        )?;
        writeln!(
            f,
            "offered      {:.1} req/s ({} scheduled)",
            self.offered_rps, self.scheduled
        )?;
        writeln!(
            f,
            "achieved     {:.1} req/s ({} completed)",
            self.achieved_rps, self.completed
        )?;
        writeln!(f, "latency ms   {}", self.latency_ms)?;
        writeln!(f, "send lag ms  {}", self.send_lag_ms)?;
        writeln!(f, "status       {}", counts(self.status_counts.iter()))?;
        let dropped = ("dropped_client_side".to_owned(), self.dropped_client_side);
        let errors = self
            .errors
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .chain(Some(dropped).filter(|d| d.1 > 0));
        writeln!(
            f,
            "errors       {}",
            counts(errors.collect::<Vec<_>>().iter().map(|(k, n)| (k, n)))
        )?;
        for (tier, t) in &self.tiers {
            writeln!(
                f,
                "tier         {tier:<12} n={:<8} p50 {:.3}  p99 {:.3}",
                t.count, t.p50_ms, t.p99_ms
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Percentiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  (mean {:.3}, n={})",
            self.p50, self.p90, self.p99, self.p999, self.max, self.mean, self.count
        )
    }
}

fn counts<'a, K: fmt::Display + 'a>(items: impl Iterator<Item = (K, &'a u64)>) -> String {
    let parts: Vec<String> = items.map(|(k, n)| format!("{k}={n}")).collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join("  ")
    }
}

#[cfg(test)]
mod tests;
