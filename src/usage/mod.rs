//! The usage ledger: what the backends did for whom, and what tiergate saved them.
//!
//! Every backend call's time is charged to the requests whose rows it carried: a
//! real-time call by its measured time, a micro-batch by its share of the pool's time
//! ([`Shares`]: calls that overlap on an endpoint share it) split over its callers by
//! their rows (each row of a batch costs the same share of `t(n) = a + b·n`, so a
//! caller with `k` of the `n` rows pays `k/n` of the batch and the shares add up to the
//! batch's). Beside what was used, each row's **per-request equivalent**: what serving
//! it alone would have cost, `t(1)` as its pool's calls' service times tell it (a row whose
//! pool cannot tell it yet is counted as unpriced rather than guessed). Rows that cost nothing are counted as
//! saved, by cause: the cache (a kept answer), precomputed answers (kept by a batch or
//! a Kafka source), dedupe (a coalesced follower, a row sent once for its batch-mates).
//!
//! The request path only adds to atomic counters of its route (one set per route,
//! source and tenant: [`RouteUsage`]); a ticker drains them every [`TICK`] (2 s)
//! ([`Ledger::tick`]) into the Prometheus totals, the capacity signal
//! ([`capacity`]) and, every few seconds, the store in the data directory
//! ([`store`]: per minute, rolled into hours after a day, hours kept 90 days by
//! default). [`report`] reads it back as the table `GET /admin/usage` and
//! `tiergate usage` print.

pub mod capacity;
mod figures;
pub mod fleet;
pub mod limits;
pub mod quota;
pub mod report;
mod shares;
pub mod store;
mod tokens;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;

pub use figures::{ns, Field, Figures, Saved, Source, Whose, FIELDS};
pub use shares::{Call, Shares};
pub use tokens::TokenMeter;

/// The counters a request path adds to.
#[derive(Debug, Default)]
struct Tally([AtomicU64; FIELDS]);

impl Tally {
    fn add(&self, figures: &Figures) {
        for (cell, value) in self.0.iter().zip(figures.0) {
            if value != 0 {
                cell.fetch_add(value, Relaxed);
            }
        }
    }

    /// A request answered by one call of its own that took `used_ns` (a row and a call
    /// when `answered`; the time whatever the answer): the real-time path's one charge,
    /// five adds without a [`Figures`] built.
    fn call(&self, used_ns: u64, answered: bool) {
        let at = |field: Field| &self.0[field as usize];
        at(Field::Requests).fetch_add(1, Relaxed);
        if answered {
            at(Field::Rows).fetch_add(1, Relaxed);
        }
        at(Field::CallsMicro).fetch_add(1_000_000, Relaxed);
        at(Field::UsedNs).fetch_add(used_ns, Relaxed);
        at(Field::AloneNs).fetch_add(used_ns, Relaxed);
    }

    fn take(&self) -> Figures {
        let mut out = Figures::default();
        for (value, cell) in out.0.iter_mut().zip(&self.0) {
            if cell.load(Relaxed) != 0 {
                *value = cell.swap(0, Relaxed);
            }
        }
        out
    }
}

/// Named tenants kept apart per route and source; past it, the rest as [`OTHER`].
const MAX_TENANTS: usize = 10_000;
/// The tenant the ones past the 10,000th named on a route and source are counted as.
pub const OTHER: &str = "(other)";

/// One route's counters: per source, the anonymous tenant's and each named tenant's.
#[derive(Debug)]
pub struct RouteUsage {
    route: Arc<str>,
    by_source: [SourceTally; Source::ALL.len()],
    /// What an answered request cost its backends lately (real-time and micro-batch,
    /// averaged by the ticker), nanoseconds; 0: nothing answered yet.
    recent_ns: AtomicU64,
}

#[derive(Debug, Default)]
struct SourceTally {
    anonymous: Tally,
    named: DashMap<Box<str>, Tally, foldhash::fast::RandomState>,
    /// Whether `named` has ever held a tenant (the drain skips its shards until then).
    any_named: std::sync::atomic::AtomicBool,
}

impl RouteUsage {
    fn new(route: &str) -> Self {
        RouteUsage {
            route: Arc::from(route),
            by_source: Default::default(),
            recent_ns: AtomicU64::new(0),
        }
    }

    /// The route's name.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// What an answered request cost its backends lately, once one was answered: what
    /// a request answered without a call would have cost.
    pub fn recent_cost(&self) -> Option<Duration> {
        match self.recent_ns.load(Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    /// Moves the recent cost towards `answered` requests having cost `used_ns`.
    fn learn(&self, answered: u64, used_ns: u64) {
        if answered == 0 || used_ns == 0 {
            return;
        }
        let now = (used_ns / answered).max(1);
        let before = self.recent_ns.load(Relaxed);
        let next = match before {
            0 => now,
            // A memory of about 8 seconds of traffic.
            b => b - b / 8 + now / 8,
        };
        self.recent_ns.store(next.max(1), Relaxed);
    }

    /// Charges `figures` to `tenant` ("" is the anonymous one) for answers from `source`.
    pub fn add(&self, source: Source, tenant: &str, figures: &Figures) {
        let at = &self.by_source[source.index()];
        if tenant.is_empty() {
            return at.anonymous.add(figures);
        }
        if let Some(tally) = at.named.get(tenant) {
            return tally.add(figures);
        }
        let name = match at.named.len() < MAX_TENANTS {
            true => tenant,
            false => OTHER,
        };
        at.named.entry(name.into()).or_default().add(figures);
        at.any_named.store(true, Relaxed);
    }

    /// Charges `tenant` a request on `source` answered by one call of its own that took
    /// `used_ns`: a request, the call, its time (and the row, when `answered`).
    pub fn add_call(&self, source: Source, tenant: &str, used_ns: u64, answered: bool) {
        let at = &self.by_source[source.index()];
        if tenant.is_empty() {
            return at.anonymous.call(used_ns, answered);
        }
        match at.named.get(tenant) {
            Some(tally) => tally.call(used_ns, answered),
            // The tenant's first charge here: through the map's way in.
            None => {
                let figures = Figures::default()
                    .with(Field::Requests, 1)
                    .with(Field::Rows, u64::from(answered))
                    .with(Field::CallsMicro, 1_000_000)
                    .with(Field::UsedNs, used_ns)
                    .with(Field::AloneNs, used_ns);
                self.add(source, tenant, &figures);
            }
        }
    }

    /// Takes every counter's value since the last take, resetting it.
    fn take(&self, into: &mut Vec<(Source, String, Figures)>) {
        for (source, at) in Source::ALL.into_iter().zip(&self.by_source) {
            let anonymous = at.anonymous.take();
            if !anonymous.is_zero() {
                into.push((source, String::new(), anonymous));
            }
            if !at.any_named.load(Relaxed) {
                continue;
            }
            for tenant in at.named.iter() {
                let figures = tenant.value().take();
                if !figures.is_zero() {
                    into.push((source, tenant.key().to_string(), figures));
                }
            }
        }
    }
}

/// A pool's totals since start, and their Prometheus handles.
type Exported = (Figures, crate::metrics::UsageHandles);

/// A minute's figures not yet in the store: by (minute's start, route, source, tenant).
type Pending = Fast<(i64, Arc<str>, Source, String), Figures>;

/// A map hashed with foldhash (see `policy::model::Index`): the ticker's maps, looked up
/// every tick.
pub(crate) type Fast<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Every how many ticks the ticker writes what it drained to the store (10 s: a write
/// costs more than a tick, and a `kill -9` loses at most what is not written).
const WRITE_EVERY: u64 = 5;

/// How often the ticker drains the counters (the capacity signal's resolution; a
/// quota is held to its use up to the last tick). Each tick wakes the batch threads
/// once, so it is not every second.
pub const TICK: Duration = Duration::from_secs(2);

/// The gateway's usage ledger (one per gateway; cheap to share behind an `Arc`).
#[derive(Debug, Default)]
pub struct Ledger {
    /// Each route's counters (named when a route first meets the ledger: rare; read
    /// whole by each drain).
    routes: std::sync::RwLock<HashMap<Box<str>, Arc<RouteUsage>>>,
    /// Drained, not yet written.
    pending: Mutex<Pending>,
    /// Where it is kept; `None`: in memory only (tests of one tier).
    store: Option<store::Store>,
    /// Each pool's capacity signal.
    pub capacity: capacity::Signals,
    /// Each tenant's use in the current day and month, for its quotas.
    pub quotas: quota::Uses,
    /// The token limits' counts (this replica's, or every replica's in Redis).
    pub limits: Arc<limits::Limits>,
    /// Totals since start, and their Prometheus handles.
    exported: Mutex<Fast<(Arc<str>, Source), Exported>>,
    /// Per-tenant series: off (`None`), or the tenants that have their own (at most
    /// the limit; the rest are `other`).
    tenant_series: Option<Mutex<TenantSeries>>,
    /// Where the replicas share their ledgers, when they do (the Kafka queue).
    fleet: Option<Arc<dyn fleet::Fleet>>,
    /// The periods written and not published to the fleet yet.
    unpublished: Mutex<fleet::Unpublished>,
}

/// The tenants whose usage has series of their own.
#[derive(Debug, Default)]
struct TenantSeries {
    limit: usize,
    named: std::collections::HashSet<String>,
}

impl TenantSeries {
    /// The `tenant` label for `tenant` (`anonymous` for ""): its own while there is
    /// room, else `other`.
    fn label(&mut self, tenant: &str) -> String {
        let name = if tenant.is_empty() { "anonymous" } else { tenant };
        if self.named.contains(name) {
            return name.to_owned();
        }
        if self.named.len() < self.limit {
            self.named.insert(name.to_owned());
            return name.to_owned();
        }
        "other".to_owned()
    }
}

impl Ledger {
    /// A ledger kept in memory only.
    pub fn in_memory() -> Self {
        Ledger::default()
    }

    /// A ledger kept in `store`, its tenants' use this month read back from it.
    pub fn kept_in(store: store::Store) -> Result<Self, String> {
        let ledger = Ledger::default();
        let month = quota::month_start(unix(SystemTime::now()));
        for row in store.since(month)? {
            let route = ledger.route(&row.route).route.clone();
            ledger
                .quotas
                .add(row.period.max(month), &route, &row.tenant, answered(&row.figures));
        }
        Ok(Ledger {
            store: Some(store),
            ..ledger
        })
    }

    /// The same ledger, exporting per-tenant series for up to `limit` tenants.
    pub fn with_tenant_series(mut self, limit: usize) -> Self {
        self.tenant_series = Some(Mutex::new(TenantSeries {
            limit,
            ..TenantSeries::default()
        }));
        self
    }

    /// The same ledger, its token limits held with `limits`.
    pub fn with_limits(mut self, limits: limits::Limits) -> Self {
        self.limits = Arc::new(limits);
        self
    }

    /// The same ledger, shared with the other replicas through `fleet`: what it
    /// writes is published there, and reads are the fleet's.
    pub fn with_fleet(mut self, fleet: Arc<dyn fleet::Fleet>) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// `route`'s counters (made the first time a route is named).
    pub fn route(&self, route: &str) -> Arc<RouteUsage> {
        if let Some(found) = self.routes.read().unwrap_or_else(|e| e.into_inner()).get(route) {
            return found.clone();
        }
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        routes
            .entry(route.into())
            .or_insert_with(|| Arc::new(RouteUsage::new(route)))
            .clone()
    }

    /// Drains every route's counters into the minute they are in (pending until
    /// [`Ledger::write`]), the quotas' use and the Prometheus totals; returns each
    /// pool's figures for the capacity signal.
    pub fn drain(&self, now: SystemTime) -> Vec<(Arc<str>, Source, Figures)> {
        let minute = minute_of(now);
        let mut taken = Vec::new();
        let mut by_pool: Fast<(Arc<str>, Source), Figures> = Fast::default();
        let routes: Vec<Arc<RouteUsage>> = self
            .routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for usage in &routes {
            taken.clear();
            usage.take(&mut taken);
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let (mut served, mut used) = (0, 0);
            for (_, _, figures) in taken
                .iter()
                .filter(|t| matches!(t.0, Source::Realtime | Source::MicroBatch))
            {
                let (ns, requests) = answered(figures);
                (served, used) = (served + requests, used + ns);
            }
            usage.learn(served, used);
            for (source, tenant, figures) in taken.drain(..) {
                self.quotas.add(minute, &usage.route, &tenant, answered(&figures));
                if let Some(series) = &self.tenant_series {
                    let label = series.lock().unwrap_or_else(|e| e.into_inner()).label(&tenant);
                    let counts = (figures.get(Field::Requests), figures.get(Field::UsedNs));
                    crate::metrics::tenant_usage_added(&usage.route, &label, counts);
                }
                by_pool.entry((usage.route.clone(), source)).or_default().add(&figures);
                pending
                    .entry((minute, usage.route.clone(), source, tenant))
                    .or_default()
                    .add(&figures);
            }
        }
        let mut exported = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        let drained: Vec<_> = by_pool.into_iter().map(|((r, s), f)| (r, s, f)).collect();
        for (route, source, figures) in &drained {
            let get = |field| figures.get(field);
            let counts = [get(Field::Requests), get(Field::Rows)];
            let spent = [get(Field::UsedNs), get(Field::AloneNs)];
            let saved = [get(Field::CacheNs), get(Field::PrecomputedNs), get(Field::DedupeNs)];
            let (total, handles) = exported.entry((route.clone(), *source)).or_insert_with(|| {
                (
                    Figures::default(),
                    crate::metrics::UsageHandles::new(route, source.as_str()),
                )
            });
            handles.add((counts, spent, saved));
            total.add(figures);
        }
        drained
    }

    /// Writes what was drained to the store (rolling old minutes into hours), and notes
    /// the periods it changed for the fleet; the figures stay pending if the write
    /// fails, and the failure is logged.
    pub fn write(&self, now: SystemTime) {
        let Some(store) = &self.store else { return };
        let rows: Pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if rows.is_empty() {
            return;
        }
        match store.add(&rows, unix(now)) {
            Ok(changed) if self.fleet.is_some() => {
                self.unpublished.lock().unwrap_or_else(|e| e.into_inner()).note(changed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the usage ledger could not be written; kept in memory and tried again");
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                for (key, figures) in rows {
                    pending.entry(key).or_default().add(&figures);
                }
            }
        }
    }

    /// Whether anything drained waits to be written.
    fn has_pending(&self) -> bool {
        !self.pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// One tick: drains and feeds the capacity signal.
    pub fn tick(&self, now: SystemTime, pools: &dyn capacity::Pools) {
        let drained = self.drain(now);
        self.capacity.tick(&drained, pools);
    }

    /// Drains and writes now, on a blocking thread, and publishes what changed to the
    /// fleet (when there is one).
    pub async fn flush(self: &Arc<Self>) {
        let ledger = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let now = SystemTime::now();
            ledger.drain(now);
            ledger.write(now);
        })
        .await;
        fleet::share(self).await;
    }

    /// The rows since `since` (unix seconds), everything drained first: the fleet's
    /// (every replica's, summed) when the ledger has one, else this gateway's store and
    /// what it could not write yet.
    pub async fn read(self: &Arc<Self>, since: i64) -> Result<Vec<store::Row>, String> {
        self.flush().await;
        if let Some(fleet) = &self.fleet {
            return fleet.rows(since).await;
        }
        let ledger = self.clone();
        tokio::task::spawn_blocking(move || ledger.local(since))
            .await
            .map_err(|e| e.to_string())?
    }

    /// This gateway's rows since `since`: the store's, and what is not written yet.
    fn local(&self, since: i64) -> Result<Vec<store::Row>, String> {
        let mut rows = match &self.store {
            Some(store) => store.since(since)?,
            None => Vec::new(),
        };
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        rows.extend(pending.iter().filter(|((minute, ..), _)| *minute >= since - 59).map(
            |((minute, route, source, tenant), figures)| store::Row {
                span: 60,
                period: *minute,
                route: route.to_string(),
                source: *source,
                tenant: tenant.clone(),
                figures: *figures,
            },
        ));
        Ok(rows)
    }

    /// Runs the ticker every [`TICK`] until `stop`, writing to the store every fifth
    /// tick (10 s) on a blocking thread (and publishing to the fleet); then drains
    /// and writes what is left.
    pub async fn run(self: Arc<Self>, pools: Arc<dyn capacity::Pools>, stop: tokio_util::sync::CancellationToken) {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = stop.cancelled() => break,
            }
            ticks += 1;
            self.tick(SystemTime::now(), pools.as_ref());
            if ticks % WRITE_EVERY == 0 && self.has_pending() {
                let ledger = self.clone();
                let _ = tokio::task::spawn_blocking(move || ledger.write(SystemTime::now())).await;
                fleet::share(&self).await;
            }
        }
        self.flush().await;
    }
}

/// What `figures` count against a quota: backend nanoseconds, requests answered.
fn answered(figures: &Figures) -> (u64, u64) {
    let requests = figures.get(Field::Requests).saturating_sub(figures.get(Field::Refused));
    (figures.get(Field::UsedNs), requests)
}

/// Unix seconds of `t`.
pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The start of the minute `t` is in, unix seconds.
fn minute_of(t: SystemTime) -> i64 {
    let s = unix(t);
    s - s.rem_euclid(60)
}
