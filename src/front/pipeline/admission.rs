//! Admission: what a request must pass before the gateway spends anything on it.
//!
//! At the doors, before the body is read. Two kinds of limits, checked in this order:
//!
//! - **Global** (like an overload manager): requests in flight, request body bytes
//!   held, and resident memory when `limits.max_rss_bytes` is set. Past any of them new
//!   work is shed with 503 + `Retry-After`, so a flood cannot grow the process until it
//!   is at risk; what is already admitted is served.
//! - **Rate limits** per route and per tenant (a header such as an API key), token
//!   buckets from `governor`: 429 with `Retry-After` (the real wait) and `RateLimit-*`.
//!
//! A [`Ticket`] holds a request's share of the global limits until it is dropped.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota as Bucket};
use http::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::Limits;
use crate::decision::key_hash;
use crate::error::{Error, Kind, Quota};
use crate::metrics;
use crate::policy::{Rate, RateLimits, Route};
use crate::tenant::Tenant;

/// Tenants remembered per route before idle ones are forgotten early.
const MAX_TENANTS: usize = 100_000;
/// Body bytes are accounted in units of this many bytes.
const UNIT: usize = 1024;
/// How often resident memory is read when `max_rss_bytes` is set and it is past half
/// the limit; below half, every [`RSS_EVERY_BELOW_HALF`] (memory grows by held bodies,
/// themselves bounded, so it cannot cross the other half in one such wait unnoticed by
/// the body budget).
const RSS_EVERY: Duration = Duration::from_millis(100);
/// How often resident memory is read while it is below half of `max_rss_bytes`.
const RSS_EVERY_BELOW_HALF: Duration = Duration::from_secs(1);

/// The gateway's admission control, shared by both doors.
#[derive(Debug)]
pub struct Admission {
    requests: Arc<Semaphore>,
    max_requests: usize,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    over_memory: Arc<AtomicBool>,
    routes: DashMap<String, Arc<RouteLimiter>>,
}

/// A request's share of the global limits, given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    _request: OwnedSemaphorePermit,
    bytes: Option<OwnedSemaphorePermit>,
    admission: Arc<Admission>,
}

/// One route's buckets, kept while its limits are unchanged.
struct RouteLimiter {
    spec: Arc<RateLimits>,
    route: Option<DefaultDirectRateLimiter>,
    tenants: Option<DefaultKeyedRateLimiter<u64>>,
}

impl std::fmt::Debug for RouteLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteLimiter").field("spec", &self.spec).finish()
    }
}

impl Admission {
    /// Admission under `limits`; watches resident memory until `shutdown` when asked to.
    pub fn new(limits: &Limits, shutdown: CancellationToken) -> Arc<Admission> {
        let max_requests = limits.max_in_flight_requests.clamp(1, Semaphore::MAX_PERMITS);
        let max_bytes = limits
            .max_in_flight_body_bytes
            .div_ceil(UNIT)
            .clamp(1, Semaphore::MAX_PERMITS);
        let admission = Arc::new(Admission {
            requests: Arc::new(Semaphore::new(max_requests)),
            max_requests,
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
            over_memory: Arc::new(AtomicBool::new(false)),
            routes: DashMap::new(),
        });
        if limits.max_rss_bytes > 0 {
            watch_rss(limits.max_rss_bytes, admission.over_memory.clone(), shutdown);
        }
        admission
    }

    /// Admits a request on `route` with `headers`, or says why not.
    pub fn admit(self: &Arc<Self>, route: &Route, headers: &HeaderMap, tenant: &Tenant) -> Result<Ticket, Error> {
        let ticket = self.admit_any()?;
        if let Some(spec) = &route.limits {
            self.limiter(&route.name, spec).check(route, headers, tenant)?;
        }
        Ok(ticket)
    }

    /// Admits a request within the global limits alone (one of no route: the Batch
    /// API's), or says why not.
    pub fn admit_any(self: &Arc<Self>) -> Result<Ticket, Error> {
        if self.over_memory.load(Ordering::Relaxed) {
            return Err(shed(
                "rss",
                "limits.max_rss_bytes reached: the gateway's resident memory is above its limit",
            )
            .knob("limits.max_rss_bytes"));
        }
        let Ok(request) = self.requests.clone().try_acquire_owned() else {
            let message = format!(
                "limits.max_in_flight_requests {} reached ({} requests in flight)",
                self.max_requests, self.max_requests
            );
            return Err(shed("requests", &message).knob("limits.max_in_flight_requests"));
        };
        Ok(Ticket {
            _request: request,
            bytes: None,
            admission: self.clone(),
        })
    }

    fn limiter(&self, route: &str, spec: &Arc<RateLimits>) -> Arc<RouteLimiter> {
        if let Some(l) = self.routes.get(route) {
            if Arc::ptr_eq(&l.spec, spec) || *l.spec == **spec {
                return l.clone();
            }
        }
        let fresh = Arc::new(RouteLimiter {
            spec: spec.clone(),
            route: spec.route.map(|r| governor::RateLimiter::direct(bucket(r))),
            tenants: spec.tenant.map(|r| governor::RateLimiter::keyed(bucket(r))),
        });
        self.routes.insert(route.to_owned(), fresh.clone());
        fresh
    }
}

impl Ticket {
    /// Holds `bytes` of request body against the global budget, or sheds; refuses
    /// (413) a body the whole budget could never hold.
    pub fn hold(&mut self, bytes: usize) -> Result<(), Error> {
        let units = bytes.div_ceil(UNIT);
        if units == 0 {
            return Ok(());
        }
        let held = self.bytes.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        if units.saturating_add(held) > self.admission.max_bytes {
            // More than the whole budget: never admitted, however long the client waits.
            return Err(Error::new(
                Kind::TooLarge,
                format!(
                    "request body of {} KiB is over limits.max_in_flight_body_bytes ({} KiB), the most the gateway \
                     holds of all bodies at once; send a smaller body",
                    units.saturating_add(held),
                    self.admission.max_bytes
                ),
            )
            .knob("limits.max_in_flight_body_bytes"));
        }
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        match self.admission.bytes.clone().try_acquire_many_owned(units) {
            Ok(permit) => {
                // One permit for all a request holds (merged: no list to grow).
                match self.bytes.as_mut() {
                    Some(held) => held.merge(permit),
                    None => self.bytes = Some(permit),
                }
                Ok(())
            }
            Err(_) => {
                let message = format!(
                    "limits.max_in_flight_body_bytes reached: the gateway holds its limit of request bodies in memory \
                     ({} KiB)",
                    self.admission.max_bytes
                );
                Err(shed("body_bytes", &message).knob("limits.max_in_flight_body_bytes"))
            }
        }
    }
}

impl RouteLimiter {
    /// The tenant's bucket is the one [`Route::tenant`] names: its authenticated name
    /// when it has one, else the route's `tenant_header` (which any client can set).
    fn check(&self, route: &Route, headers: &HeaderMap, tenant: &Tenant) -> Result<(), Error> {
        let (name, route) = (route.tenant(tenant, headers), &route.name);
        if let (Some(limiter), Some(rate)) = (&self.route, self.spec.route) {
            if let Err(not_until) = limiter.check() {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                let message = format!(
                    "limits.rate reached: route {route} is at its rate limit ({})",
                    describe(rate)
                );
                return Err(limited("route", &message, wait, rate).knob("limits.rate"));
            }
        }
        if let (Some(tenants), Some(rate)) = (&self.tenants, self.spec.tenant) {
            let key = match name {
                "" => 0,
                name => key_hash(name.as_bytes()),
            };
            if tenants.len() >= MAX_TENANTS {
                tenants.retain_recent();
                tenants.shrink_to_fit();
            }
            if let Err(not_until) = tenants.check_key(&key) {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                let message = format!(
                    "limits.tenant_rate reached: your tenant ({name:?}) is at its rate limit on route {route} ({})",
                    describe(rate)
                );
                return Err(limited("tenant", &message, wait, rate).knob("limits.tenant_rate"));
            }
        }
        Ok(())
    }
}

fn bucket(rate: Rate) -> Bucket {
    Bucket::with_period(rate.period)
        .unwrap_or_else(|| Bucket::per_second(NonZeroU32::MIN))
        .allow_burst(rate.burst)
}

fn describe(rate: Rate) -> String {
    format!(
        "{:.3} requests/s, bursts of {}",
        1.0 / rate.period.as_secs_f64(),
        rate.burst
    )
}

fn limited(scope: &'static str, message: &str, wait: Duration, rate: Rate) -> Error {
    ::metrics::counter!(metrics::ADMISSION_REFUSALS, "reason" => scope).increment(1);
    let window = rate.period.saturating_mul(rate.burst.get());
    Error::new(Kind::RateLimited, message)
        .retry_in(wait.max(Duration::from_millis(1)))
        .with_quota(Quota {
            limit: rate.burst.get(),
            window_secs: window.as_secs().max(1),
        })
}

fn shed(reason: &'static str, message: &str) -> Error {
    ::metrics::counter!(metrics::ADMISSION_REFUSALS, "reason" => reason).increment(1);
    Error::new(Kind::Overloaded, message)
}

/// Reads resident memory (every [`RSS_EVERY`] past half of `limit`, every
/// [`RSS_EVERY_BELOW_HALF`] below) and flags when it is above `limit`.
fn watch_rss(limit: u64, over: Arc<AtomicBool>, shutdown: CancellationToken) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let gauge = ::metrics::gauge!(metrics::PROCESS_RSS);
        let mut every = RSS_EVERY;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => return,
            }
            if let Some(rss) = resident_bytes() {
                gauge.set(rss as f64);
                over.store(rss > limit, Ordering::Relaxed);
                every = if rss < limit / 2 {
                    RSS_EVERY_BELOW_HALF
                } else {
                    RSS_EVERY
                };
            }
        }
    });
}

/// This process's resident set size, from `/proc/self/statm` (Linux): one short line,
/// much cheaper for the kernel to make than `/proc/self/status`.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}
