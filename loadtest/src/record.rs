//! What the generator records: one `Outcome` per request, folded into a `Recording`
//! of HdrHistograms (µs, 3 significant digits, auto-resizing) overall, per tier and per
//! second, with counts by status and by transport error. Recordings of several phases
//! merge, so `compare` can add up its rounds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Response header naming the tier that served the request.
pub const TIER_HEADER: &str = "x-tiergate-tier";
/// Tier recorded for responses without a tier header (e.g. a backend called directly).
pub const NO_TIER: &str = "none";

/// The fate of one request.
#[derive(Debug)]
pub struct Outcome {
    /// When the schedule meant it to be sent: latency is measured from here.
    pub intended: Instant,
    /// When its task started sending it (`intended` + the generator's own lag).
    pub started: Instant,
    /// When the response body ended, or the request failed.
    pub done: Instant,
    /// The response, or why there was none.
    pub result: Result<Reply, Failure>,
}

/// A complete HTTP response.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// Value of `x-tiergate-tier`, or `none`.
    pub tier: String,
}

/// Why a request got no response.
#[derive(Debug)]
pub enum Failure {
    /// Not sent: `--max-in-flight` requests were already outstanding.
    DroppedClientSide,
    /// Sent, but failed in transport; the kind is a short snake_case word.
    Transport(String),
}

/// Aggregates of the measured requests of one phase (or of several, merged).
#[derive(Clone, Debug)]
pub struct Recording {
    /// Latency from intended send time to end of body, µs, of every HTTP response.
    pub latency: Histogram<u64>,
    /// `latency` of the 2xx responses only (the requests the server admitted and served).
    pub ok: Histogram<u64>,
    /// Generator lag (task start - intended send time), µs, of every sent request.
    pub send_lag: Histogram<u64>,
    /// `latency` split by the tier header.
    pub tiers: BTreeMap<String, Histogram<u64>>,
    /// Responses by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Transport failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// Requests not sent because of `--max-in-flight`.
    pub dropped_client_side: u64,
    /// Requests whose intended send time fell in the measured window(s).
    pub scheduled: u64,
    /// Responses (any request, warmup included) that ended inside the measured window(s).
    pub completed_in_window: u64,
    /// Total length of the measured window(s).
    pub window: Duration,
    /// One bucket per second of intended send time, windows concatenated.
    pub series: Vec<Second>,
    /// Start of the (last) measured window; outcomes before it are warmup.
    window_start: Instant,
}

/// Requests of one second of intended send time.
#[derive(Clone, Debug)]
pub struct Second {
    /// Latency of the responses, µs.
    pub latency: Histogram<u64>,
    /// Transport failures, dropped requests and responses with status >= 400.
    pub errors: u64,
}

impl Recording {
    /// An empty recording of the window `[window_start, window_start + window)`.
    pub fn new(window_start: Instant, window: Duration) -> Self {
        Self {
            latency: histogram(),
            ok: histogram(),
            send_lag: histogram(),
            tiers: BTreeMap::new(),
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            dropped_client_side: 0,
            scheduled: 0,
            completed_in_window: 0,
            window,
            series: Vec::new(),
            window_start,
        }
    }

    /// Folds in one outcome. Outcomes intended before the window (warmup) only count
    /// towards `completed_in_window`, so throughput is not biased by the warmup edge.
    pub fn record(&mut self, outcome: Outcome) {
        let window_end = self.window_start + self.window;
        let in_window = |t: Instant| t >= self.window_start && t < window_end;
        if outcome.result.is_ok() && in_window(outcome.done) {
            self.completed_in_window += 1;
        }
        if outcome.intended < self.window_start {
            return;
        }
        self.scheduled += 1;
        let (latency, error) = self.record_result(&outcome);
        let second = self.second(outcome.intended);
        if let Some(us) = latency {
            put(&mut second.latency, us);
        }
        second.errors += u64::from(error);
    }

    /// Records a measured outcome's result; returns its latency (µs) if it got a
    /// response, and whether it counts as an error.
    fn record_result(&mut self, outcome: &Outcome) -> (Option<u64>, bool) {
        let lag = micros(outcome.started.saturating_duration_since(outcome.intended));
        match &outcome.result {
            Ok(reply) => {
                let us = micros(outcome.done.saturating_duration_since(outcome.intended));
                put(&mut self.latency, us);
                if (200..300).contains(&reply.status) {
                    put(&mut self.ok, us);
                }
                put(&mut self.send_lag, lag);
                put(self.tiers.entry(reply.tier.clone()).or_insert_with(histogram), us);
                *self.statuses.entry(reply.status).or_default() += 1;
                (Some(us), reply.status >= 400)
            }
            Err(Failure::DroppedClientSide) => {
                self.dropped_client_side += 1;
                (None, true)
            }
            Err(Failure::Transport(kind)) => {
                put(&mut self.send_lag, lag);
                *self.errors.entry(kind.clone()).or_default() += 1;
                (None, true)
            }
        }
    }

    /// Adds `other` (a later phase) to `self`: histograms and counts add up, windows add
    /// up, and `other`'s seconds are appended after `self`'s.
    pub fn merge(&mut self, other: Recording) {
        add(&mut self.latency, &other.latency);
        add(&mut self.ok, &other.ok);
        add(&mut self.send_lag, &other.send_lag);
        for (tier, h) in &other.tiers {
            add(self.tiers.entry(tier.clone()).or_insert_with(histogram), h);
        }
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
        self.dropped_client_side += other.dropped_client_side;
        self.scheduled += other.scheduled;
        self.completed_in_window += other.completed_in_window;
        let seconds = self.window.as_secs_f64().ceil() as usize;
        self.series.resize_with(seconds.max(self.series.len()), Second::new);
        self.series.extend(other.series);
        self.window += other.window;
    }

    /// Responses received, any status.
    pub fn completed(&self) -> u64 {
        self.statuses.values().sum()
    }

    /// Failed requests: transport errors + dropped + responses with status >= 400.
    pub fn failures(&self) -> u64 {
        let bad_status: u64 = self.statuses.range(400..).map(|(_, n)| n).sum();
        bad_status + self.errors.values().sum::<u64>() + self.dropped_client_side
    }

    fn second(&mut self, intended: Instant) -> &mut Second {
        let index = intended.saturating_duration_since(self.window_start).as_secs() as usize;
        if self.series.len() <= index {
            self.series.resize_with(index + 1, Second::new);
        }
        &mut self.series[index]
    }
}

impl Second {
    fn new() -> Self {
        Self {
            latency: histogram(),
            errors: 0,
        }
    }
}

/// An empty auto-resizing µs histogram with 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// A duration in whole µs, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Records `us`, growing the histogram as needed. (`saturating_record` would clamp to
/// the current range instead of growing it: a fresh histogram would record 2 µs.)
fn put(h: &mut Histogram<u64>, us: u64) {
    if h.record(us).is_err() {
        // Only when growing fails (beyond usize): clamping is the best left to do.
        h.saturating_record(us);
    }
}

fn add(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    into.add(from).expect("auto-resizing histograms accept any value");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: Instant, intended_ms: u64, latency_ms: u64, status: u16, tier: &str) -> Outcome {
        let intended = start + Duration::from_millis(intended_ms);
        let done = intended + Duration::from_millis(latency_ms);
        Outcome {
            intended,
            started: intended,
            done,
            result: Ok(Reply {
                status,
                tier: tier.into(),
            }),
        }
    }

    #[test]
    fn warmup_only_counts_towards_throughput() {
        let start = Instant::now();
        let mut r = Recording::new(start + Duration::from_secs(1), Duration::from_secs(2));
        r.record(ok(start, 900, 200, 200, "realtime")); // warmup, done inside the window
        r.record(ok(start, 800, 10, 200, "realtime")); // warmup, done before the window
        r.record(ok(start, 2990, 20, 503, "none")); // measured, done after the window
        r.record(ok(start, 1500, 5, 200, "realtime"));
        assert_eq!(r.scheduled, 2);
        assert_eq!(r.completed(), 2);
        assert_eq!(r.completed_in_window, 2);
        assert_eq!(r.statuses, BTreeMap::from([(200, 1), (503, 1)]));
        assert_eq!(r.series.len(), 2);
        assert_eq!(r.series[1].errors, 1);
        assert_eq!(r.failures(), 1);
    }

    #[test]
    fn merge_adds_and_appends() {
        let start = Instant::now();
        let mut a = Recording::new(start, Duration::from_millis(1500));
        a.record(ok(start, 0, 1, 200, "realtime"));
        let mut b = Recording::new(start, Duration::from_secs(1));
        b.record(ok(start, 10, 3, 200, "micro_batch"));
        b.record(Outcome {
            intended: start,
            started: start,
            done: start,
            result: Err(Failure::Transport("timeout".into())),
        });
        a.merge(b);
        assert_eq!(a.latency.len(), 2);
        assert_eq!(a.tiers.len(), 2);
        assert_eq!(a.errors["timeout"], 1);
        assert_eq!(a.window, Duration::from_millis(2500));
        // `a` covered 2 seconds (the second half-empty), then `b`'s one second.
        assert_eq!(a.series.len(), 3);
        assert_eq!(a.series[2].latency.len(), 1);
        assert_eq!(a.series[2].errors, 1);
    }
}
