//! Endpoint health: outlier ejection and a circuit breaker per backend endpoint.
//!
//! Beside every backend call. Each endpoint of a pool has a circuit: **closed** (it
//! takes traffic and counts consecutive failures), **open** (ejected: it takes none
//! until its ejection ends) and **half-open** (one probe call is let through; success
//! closes the circuit, failure opens it again for twice as long, up to 10x). A failure
//! is an unreachable endpoint, a 5xx, a timeout, or a call still running after
//! `slow_call` (counted the moment it gets there, so a stalled backend costs at most one
//! short wait before traffic moves away). Active checks, when the pool has a
//! `check_path`, poll every endpoint: a failing check counts like a failed call, and a
//! passing one lets an ejected endpoint be probed again.
//!
//! A failure that may be its input's rather than the endpoint's (an answer, or its
//! absence, after the request was sent) counts once per input in a run of failures
//! ([`Health::failed_on`]): one caller sending the same poison input again and again
//! adds one failure, not one a call, so ejection needs evidence from several inputs.
//! The pool decides which failures are the endpoint's alone (see `backend::pool`).

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::metrics;
use crate::policy::HealthSpec;

/// Longest ejection, as a multiple of `eject_for`.
const MAX_BACKOFF: u32 = 10;

/// Inputs a run of failures remembers (the last ones counted).
const INPUTS: usize = 8;

/// The circuit of one endpoint.
#[derive(Debug)]
pub struct Health {
    spec: HealthSpec,
    state: Mutex<State>,
    circuit_gauge: ::metrics::Gauge,
    labels: [(&'static str, String); 3],
    /// Whether its circuit and ejections are exported (a tier's pool) or not (control).
    exported: bool,
}

#[derive(Debug, Clone, Copy)]
struct State {
    failures: u32,
    trips: u32,
    /// The inputs of the failures counted since the last success, the latest ones.
    inputs: [Option<u64>; INPUTS],
    circuit: Circuit,
    /// When the last active check ended, and whether it passed.
    last_check: Option<(SystemTime, bool)>,
}

/// An endpoint's circuit as the admin API shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitView {
    /// `closed`, `open` (ejected) or `half_open` (a probe may go, or is going).
    pub state: &'static str,
    /// How long it stays ejected, while open.
    pub ejected_for: Option<Duration>,
    /// Failed calls in a row.
    pub failures: u32,
    /// Ejections in a row (each one longer).
    pub trips: u32,
    /// When the last active check ended, and whether it passed.
    pub last_check: Option<(SystemTime, bool)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// Whether a call may go to an endpoint now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Yes: the circuit is closed.
    Yes,
    /// Yes, as the one probe of a half-open circuit.
    Probe,
    /// No: ejected until this instant (or while another call probes it).
    No(Instant),
}

impl Health {
    /// A closed circuit for `endpoint` of `route`'s `tier` pool.
    pub fn new(spec: HealthSpec, route: &str, tier: &'static str, endpoint: &str) -> Self {
        let health = Self::closed(spec, route, tier, endpoint, true);
        health.circuit_gauge.set(0.0);
        health
    }

    /// A closed circuit for `endpoint` of `route`'s control pool, on no exported series.
    pub fn unexported(spec: HealthSpec, route: &str, endpoint: &str) -> Self {
        Self::closed(spec, route, "control", endpoint, false)
    }

    fn closed(spec: HealthSpec, route: &str, tier: &'static str, endpoint: &str, exported: bool) -> Self {
        let labels = [
            ("route", route.to_owned()),
            ("tier", tier.to_owned()),
            ("endpoint", endpoint.to_owned()),
        ];
        let circuit_gauge = if exported {
            ::metrics::gauge!(metrics::BACKEND_CIRCUIT, &labels)
        } else {
            ::metrics::Gauge::noop()
        };
        Health {
            spec,
            state: Mutex::new(State {
                failures: 0,
                trips: 0,
                inputs: [None; INPUTS],
                circuit: Circuit::Closed,
                last_check: None,
            }),
            circuit_gauge,
            labels,
            exported,
        }
    }

    /// Whether a call may go now; a half-open circuit admits exactly one probe.
    pub fn admit(&self, now: Instant) -> Admit {
        let mut s = self.lock();
        match s.circuit {
            Circuit::Closed => Admit::Yes,
            Circuit::Open { until } if now < until => Admit::No(until),
            Circuit::Open { .. } | Circuit::HalfOpen { probing: false } => {
                s.circuit = Circuit::HalfOpen { probing: true };
                self.circuit_gauge.set(2.0);
                Admit::Probe
            }
            Circuit::HalfOpen { probing: true } => Admit::No(now + Duration::from_millis(100)),
        }
    }

    /// Whether [`Health::admit`] would let a call through at `now`, asked without
    /// taking a probe's place.
    pub fn would_admit(&self, now: Instant) -> bool {
        match self.lock().circuit {
            Circuit::Closed | Circuit::HalfOpen { probing: false } => true,
            Circuit::Open { until } => now >= until,
            Circuit::HalfOpen { probing: true } => false,
        }
    }

    /// A call (or probe) succeeded: the failure count resets and the circuit closes.
    pub fn succeeded(&self) {
        let mut s = self.lock();
        if s.circuit != Circuit::Closed {
            tracing::info!(endpoint = %self.labels[2].1, route = %self.labels[0].1, "backend endpoint recovered");
            self.circuit_gauge.set(0.0);
        }
        s.failures = 0;
        s.trips = 0;
        s.inputs = [None; INPUTS];
        s.circuit = Circuit::Closed;
    }

    /// A call failed for `why` (`unreachable`, `status_5xx`, `timeout`, `slow`, `check`),
    /// the endpoint's own fault.
    pub fn failed(&self, why: &'static str, now: Instant) {
        let mut s = self.lock();
        self.count(&mut s, why, now);
    }

    /// A call with `input` (a fingerprint of the request) failed for `why` in a way its
    /// input may have caused: counted unless a failure of the same input already was
    /// since the last success (nor does it end a probe then: the next call probes).
    pub fn failed_on(&self, why: &'static str, input: u64, now: Instant) {
        let mut s = self.lock();
        if s.inputs.contains(&Some(input)) {
            if s.circuit == (Circuit::HalfOpen { probing: true }) {
                s.circuit = Circuit::HalfOpen { probing: false };
            }
            return;
        }
        let slot = s.failures as usize % INPUTS;
        s.inputs[slot] = Some(input);
        self.count(&mut s, why, now);
    }

    /// One more failure in a row for `why`, ejecting when it is one too many.
    fn count(&self, s: &mut State, why: &'static str, now: Instant) {
        s.failures = s.failures.saturating_add(1);
        let eject = match s.circuit {
            Circuit::Closed => self.spec.eject_after > 0 && s.failures >= self.spec.eject_after,
            Circuit::HalfOpen { .. } => true,
            Circuit::Open { .. } => false,
        };
        if eject {
            s.trips = s.trips.saturating_add(1);
            let factor = 1u32 << (s.trips - 1).min(4);
            let length = self.spec.eject_for.saturating_mul(factor.min(MAX_BACKOFF));
            s.circuit = Circuit::Open { until: now + length };
            self.circuit_gauge.set(1.0);
            if self.exported {
                let mut labels = self.labels.to_vec();
                labels.push(("reason", why.to_owned()));
                ::metrics::counter!(metrics::BACKEND_EJECTIONS, &labels).increment(1);
            }
            tracing::warn!(
                endpoint = %self.labels[2].1, route = %self.labels[0].1, tier = %self.labels[1].1,
                reason = why, failures = s.failures, ejected_for = ?length,
                "backend endpoint ejected"
            );
        }
    }

    /// A probe that was admitted but never ran (its caller left): let another probe.
    pub fn abandoned(&self) {
        let mut s = self.lock();
        if s.circuit == (Circuit::HalfOpen { probing: true }) {
            s.circuit = Circuit::HalfOpen { probing: false };
        }
    }

    /// An active check ended at `at`: a failed one counts as a failed call; a passed
    /// one lets an ejected endpoint be probed by the next call.
    pub fn checked(&self, passed: bool, at: SystemTime) {
        self.lock().last_check = Some((at, passed));
        match passed {
            true => self.check_passed(),
            false => self.failed("check", Instant::now()),
        }
    }

    /// An active check passed: an ejected endpoint may be probed by the next call.
    pub fn check_passed(&self) {
        let mut s = self.lock();
        if let Circuit::Open { .. } = s.circuit {
            s.circuit = Circuit::HalfOpen { probing: false };
            self.circuit_gauge.set(2.0);
        } else if s.circuit == Circuit::Closed {
            s.failures = 0;
        }
    }

    /// Whether the endpoint is ejected now (its circuit open: the state the
    /// `tiergate_backend_circuit_state` gauge shows as 1).
    pub fn is_ejected(&self) -> bool {
        matches!(self.lock().circuit, Circuit::Open { .. })
    }

    /// The circuit now, for the admin API.
    pub fn view(&self, now: Instant) -> CircuitView {
        let s = *self.lock();
        let (state, ejected_for) = match s.circuit {
            Circuit::Closed => ("closed", None),
            Circuit::Open { until } if now < until => ("open", Some(until - now)),
            Circuit::Open { .. } | Circuit::HalfOpen { .. } => ("half_open", None),
        };
        CircuitView {
            state,
            ejected_for,
            failures: s.failures,
            trips: s.trips,
            last_check: s.last_check,
        }
    }

    /// The spec this circuit follows.
    pub fn spec(&self) -> &HealthSpec {
        &self.spec
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(eject_after: u32) -> Health {
        let spec = HealthSpec {
            eject_after,
            eject_for: Duration::from_secs(1),
            slow_call: None,
            check_path: None,
            check_interval: Duration::from_secs(5),
        };
        Health::new(spec, "r", "realtime", "h:1")
    }

    #[test]
    fn ejects_after_consecutive_failures_then_probes_once_and_backs_off() {
        let h = health(3);
        let t0 = Instant::now();
        h.failed("status_5xx", t0);
        h.failed("status_5xx", t0);
        h.succeeded(); // resets the count
        h.failed("timeout", t0);
        h.failed("timeout", t0);
        assert_eq!(h.admit(t0), Admit::Yes);
        h.failed("timeout", t0);
        assert_eq!(h.admit(t0), Admit::No(t0 + Duration::from_secs(1)));
        let later = t0 + Duration::from_secs(1);
        assert_eq!(h.admit(later), Admit::Probe, "one probe when the ejection ends");
        assert!(matches!(h.admit(later), Admit::No(_)), "only one");
        h.failed("timeout", later);
        assert_eq!(
            h.admit(later),
            Admit::No(later + Duration::from_secs(2)),
            "twice as long"
        );
        let again = later + Duration::from_secs(2);
        assert_eq!(h.admit(again), Admit::Probe);
        h.abandoned();
        assert_eq!(h.admit(again), Admit::Probe, "an abandoned probe frees the slot");
        h.succeeded();
        assert_eq!(h.admit(again), Admit::Yes);
    }

    #[test]
    fn a_passing_check_lets_an_ejected_endpoint_be_probed_and_zero_never_ejects() {
        let h = health(1);
        let t0 = Instant::now();
        h.failed("unreachable", t0);
        assert!(matches!(h.admit(t0), Admit::No(_)));
        h.check_passed();
        assert_eq!(h.admit(t0), Admit::Probe);
        let never = health(0);
        for _ in 0..100 {
            never.failed("status_5xx", t0);
        }
        assert_eq!(never.admit(t0), Admit::Yes);
    }

    #[test]
    fn the_same_input_failing_again_counts_once_and_a_success_forgets_it() {
        let h = health(3);
        let t0 = Instant::now();
        for _ in 0..50 {
            h.failed_on("status_5xx", 7, t0);
        }
        assert_eq!(h.admit(t0), Admit::Yes, "one input, however often, is one failure");
        h.failed_on("status_5xx", 8, t0);
        assert_eq!(h.admit(t0), Admit::Yes);
        h.failed_on("status_5xx", 9, t0);
        assert!(
            matches!(h.admit(t0), Admit::No(_)),
            "three inputs failing in a row eject"
        );
        let later = t0 + Duration::from_secs(1);
        assert_eq!(h.admit(later), Admit::Probe);
        h.failed_on("status_5xx", 7, later);
        assert_eq!(
            h.admit(later),
            Admit::Probe,
            "a probe failed by an input already counted proves nothing: the next call probes"
        );
        h.succeeded();
        h.failed_on("status_5xx", 7, later);
        h.failed_on("status_5xx", 7, later);
        assert_eq!(
            h.view(later).failures,
            1,
            "after a success the input counts again, once"
        );
    }

    #[test]
    fn backoff_is_capped() {
        let h = health(1);
        let mut now = Instant::now();
        for _ in 0..20 {
            h.failed("timeout", now);
            let Admit::No(until) = h.admit(now) else {
                panic!("ejected")
            };
            assert!(until - now <= Duration::from_secs(u64::from(MAX_BACKOFF)));
            now = until;
            assert_eq!(h.admit(now), Admit::Probe);
        }
    }
}
