//! Each route's meters, which the dispatch finds once per request: its request
//! instruments (Prometheus handles) and its usage counters (the ledger's), one set per
//! route name for as long as the gateway runs (so a reload finds the same series), and
//! for the running snapshot a table of them in its routes' order, so a request finds
//! its route's by index. And what the dispatch charges the ledger for a request.

use std::sync::Arc;

use arc_swap::ArcSwap;
use dashmap::DashMap;

use crate::decision::Tier;
use crate::error::{Error, Kind};
use crate::metrics::RouteInstruments;
use crate::policy::{Policy, Route, Store};
use crate::protocol::Reply;
use crate::usage::{ns, Field, Figures, Ledger, RouteUsage, Saved, Source, Whose};

/// One route's meters.
#[derive(Debug)]
pub(super) struct Meters {
    /// Its request instruments.
    pub instruments: RouteInstruments,
    /// Its usage counters.
    pub usage: Arc<RouteUsage>,
}

/// Every route's meters (see the module's docs).
#[derive(Debug)]
pub(super) struct MeterTable {
    ledger: Arc<Ledger>,
    names: DashMap<String, Arc<Meters>>,
    table: ArcSwap<Table>,
}

/// The meters of one snapshot's routes, by [`Route::index`].
#[derive(Debug, Default)]
struct Table {
    version: u64,
    routes: Vec<Arc<Meters>>,
}

impl MeterTable {
    /// Meters charging `ledger`.
    pub fn new(ledger: Arc<Ledger>) -> Self {
        MeterTable {
            ledger,
            names: DashMap::new(),
            table: ArcSwap::default(),
        }
    }

    /// The ledger the meters charge.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// `route`'s meters: from the running snapshot's table, by the route's index, when
    /// the route belongs to it (nearly always); else by its name.
    pub fn get(&self, route: &Route, policy: &Store) -> Arc<Meters> {
        let table = self.table.load();
        if table.version == route.policy_version() {
            if let Some(found) = table.routes.get(route.index()) {
                return found.clone();
            }
        }
        self.rebuild(&policy.load());
        self.by_name(&route.name)
    }

    fn by_name(&self, route: &str) -> Arc<Meters> {
        if let Some(found) = self.names.get(route) {
            return found.clone();
        }
        let made = || {
            Arc::new(Meters {
                instruments: RouteInstruments::default(),
                usage: self.ledger.route(route),
            })
        };
        self.names.entry(route.to_owned()).or_insert_with(made).clone()
    }

    /// Makes the table for `policy` unless it is the one there.
    fn rebuild(&self, policy: &Policy) {
        if self.table.load().version == policy.version() {
            return;
        }
        let routes = policy.routes().iter().map(|r| self.by_name(&r.name)).collect();
        self.table.store(Arc::new(Table {
            version: policy.version(),
            routes,
        }));
    }
}

/// Charges `whose` request on `tier` to `usage`: a request, and refused when the tier
/// refused it for its capacity (no backend call); a real-time call (its fallback's
/// too) also the backend time it took (`took`, the tier's time), a row and a call when
/// answered. A micro-batch's rows and time are charged when its batch is sent
/// (`tiers::micro_batch`); an offline job accepted is charged (a request, its rows and
/// time) when it ends (`tiers::offline`), as a Batch API line is.
pub(super) fn charge(
    usage: &RouteUsage,
    tier: Tier,
    whose: &Whose,
    result: &Result<Reply, Error>,
    took: std::time::Duration,
) {
    let figures = Figures::default().with(Field::Requests, 1);
    match result {
        Err(e) if e.knob.is_some() || e.kind == Kind::Shed => {
            usage.add(Source::of(tier), whose.name(), &figures.with(Field::Refused, 1));
        }
        _ if tier != Tier::Realtime => {
            if tier == Tier::MicroBatch || result.is_err() {
                usage.add(Source::of(tier), whose.name(), &figures);
            }
        }
        // Answered, or failed after it left (a timeout, a backend error): its time was spent.
        answer => usage.add_call(Source::Realtime, whose.name(), ns(took), answer.is_ok()),
    }
}

/// Charges `whose` request answered with no call of its own (`saved`: a kept or
/// precomputed answer, or a coalesced follower's) to `usage`, as the cache's: a
/// request, a row, and what it would have cost (the route's recent cost per request).
pub(super) fn saved(usage: &RouteUsage, whose: &Whose, saved: Saved) {
    let figures = saved
        .figures(1, usage.recent_cost())
        .with(Field::Requests, 1)
        .with(Field::Rows, 1);
    usage.add(Source::Cache, whose.name(), &figures);
}

/// The refusal of a request whose tenant has spent one of `quotas` on `route`: 429,
/// naming the quota, its use and when it resets, with `Retry-After` until then.
#[cold]
pub(super) fn quota_spent(
    ledger: &Ledger,
    route: &crate::policy::Route,
    quotas: &crate::policy::usage::RouteQuotas,
    whose: &Whose,
) -> Option<Error> {
    let now = crate::usage::unix(std::time::SystemTime::now());
    let spent = ledger.quotas.spent(&route.name, whose.name(), quotas, now)?;
    let wait = std::time::Duration::from_secs(u64::try_from(spent.resets_at - now).unwrap_or(0).max(1));
    Some(
        Error::new(Kind::RateLimited, spent.message)
            .knob(spent.knob)
            .retry_in(wait),
    )
}
