//! The prediction cache: answers kept per route and given again to the same question,
//! and identical requests in flight at once sharing one backend call.
//!
//! After the door has read and checked a request and before any tier is chosen (the
//! dispatch asks it first, see `front::pipeline`, its `cached` step): a hit needs no tier. Each route with a
//! `[cache]` table has its own store (moka: concurrent, TinyLFU admission, weighed in
//! bytes against the route's `max_bytes`, each entry kept for `ttl`), rebuilt empty when
//! the table changes. Only successes are kept; an error is never cached. A request the
//! store cannot answer either joins a call already in flight for the same key (when the
//! route coalesces) or leads one, whose answer every follower then gets with its own id.
//!
//! # Layout
//!
//! `key` (what is in a key, canonical form) · `entry` (a kept answer, written back per
//! caller; `Cache-Control`) · `second` (the Redis the replicas share, behind each one's
//! memory).

pub mod entry;
pub mod key;
pub mod second;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::watch;

use crate::metrics;
use crate::policy::{CacheSpec, Route};
pub use entry::Entry;
pub use key::{Key, Question, Scope};
pub use second::SecondLevel;

/// The key and question of `request` on `route` when the cache may answer it: `None`
/// when the request keeps away (`Cache-Control: no-store`), asks for something an
/// answer from the cache would not give (`Prefer: respond-async`: a job to ask about
/// later; an `Idempotency-Key`: its binding to this request, so a reuse is refused), or
/// is not cacheable (see [`key::key`]).
pub fn asked(route: &Route, spec: &CacheSpec, request: &http::Request<bytes::Bytes>) -> Option<(Key, Question)> {
    let headers = request.headers();
    if entry::forbids_storing(headers)
        || crate::headers::prefers_async(headers)
        || headers.contains_key(crate::headers::IDEMPOTENCY_KEY)
    {
        return None;
    }
    key::key(route, spec, &key::tenant(route, request), request)
}

/// Every route's cache.
#[derive(Debug, Clone, Default)]
pub struct Cache {
    routes: Arc<DashMap<String, Arc<RouteCache>>>,
    second: Option<SecondLevel>,
}

/// One route's entries, and the calls in flight that will make more.
#[derive(Debug)]
pub struct RouteCache {
    route: String,
    spec: Arc<CacheSpec>,
    entries: moka::sync::Cache<Key, Kept>,
    flights: Mutex<HashMap<Key, watch::Receiver<Landed>>>,
    second: Option<SecondLevel>,
}

/// An entry in memory, how long it is kept from when it was put there, and whether a
/// batch or a Kafka source precomputed it.
#[derive(Debug, Clone)]
struct Kept {
    entry: Arc<Entry>,
    ttl: Duration,
    precomputed: bool,
}

/// Each entry expires after its own TTL: the route's, or less for one found in the
/// second level (what it has left there).
struct Expiry;

impl moka::Expiry<Key, Kept> for Expiry {
    fn expire_after_create(&self, _: &Key, kept: &Kept, _: std::time::Instant) -> Option<Duration> {
        Some(kept.ttl)
    }

    fn expire_after_update(
        &self,
        _: &Key,
        kept: &Kept,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(kept.ttl)
    }
}

/// What a call in flight ended with, as its followers see it.
#[derive(Debug, Clone, Default)]
enum Landed {
    /// Not yet.
    #[default]
    Flying,
    /// An answer, kept and shared.
    Answer(Arc<Entry>),
    /// Nothing to share (an error, or an answer that is not kept): each follower asks
    /// for itself.
    Nothing,
}

/// How a request that missed goes on.
#[derive(Debug)]
pub enum Joined {
    /// It makes the backend call; the [`Flight`] shares what it brings back.
    Lead(Flight),
    /// A call for the same key is in flight: wait for it with [`Follower::answer`].
    Follow(Follower),
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Self {
        Cache::default()
    }

    /// The same cache, sharing entries through `second` (see [`second`]).
    pub fn with_second_level(mut self, second: Option<SecondLevel>) -> Self {
        self.second = second;
        self
    }

    /// Drops every entry of `route` in the second level, if there is one: how many,
    /// or why not.
    pub async fn invalidate_shared(&self, route: &str) -> Option<Result<u64, String>> {
        let second = self.second.as_ref()?;
        Some(second.invalidate(route, Duration::from_secs(10)).await)
    }

    /// Keeps `reply`, the answer to the request `asked` ([`asked`]) on `route`, as
    /// precomputed for `ttl` (see [`RouteCache::precompute`]); whether it was kept (only
    /// a success is, on a route with a cache).
    pub fn precompute(
        &self,
        route: &Route,
        (key, question): (Key, Question),
        reply: &crate::protocol::Reply,
        ttl: Duration,
    ) -> bool {
        let Some(spec) = &route.cache else {
            return false;
        };
        let Some(entry) = Entry::of(&question, reply) else {
            return false;
        };
        self.route(&route.name, spec).precompute(key, Arc::new(entry), ttl);
        true
    }

    /// `route`'s store under `spec`: a new, empty one when the spec changed.
    pub fn route(&self, route: &str, spec: &Arc<CacheSpec>) -> Arc<RouteCache> {
        if let Some(store) = self.routes.get(route) {
            if Arc::ptr_eq(&store.spec, spec) || *store.spec == **spec {
                return store.clone();
            }
        }
        let store = Arc::new(RouteCache::new(route, spec.clone(), self.second.clone()));
        self.routes.insert(route.to_owned(), store.clone());
        store
    }

    /// Whether `route`'s store under `spec` keeps an entry for `key` (without counting
    /// as a use of it, or making a store).
    pub fn holds(&self, route: &str, spec: &CacheSpec, key: &Key) -> bool {
        self.routes
            .get(route)
            .is_some_and(|store| *store.spec == *spec && store.holds(key))
    }

    /// Drops every entry of `route`; returns how many there were.
    pub fn invalidate(&self, route: &str) -> u64 {
        let Some(store) = self.routes.get(route).map(|s| s.clone()) else {
            return 0;
        };
        store.entries.run_pending_tasks();
        let n = store.entries.entry_count();
        store.entries.invalidate_all();
        store.entries.run_pending_tasks();
        n
    }

    /// `route`'s entries and their bytes, as now (after pending evictions ran).
    pub fn usage(&self, route: &str) -> Option<(u64, u64)> {
        let store = self.routes.get(route)?.clone();
        store.entries.run_pending_tasks();
        Some((store.entries.entry_count(), store.entries.weighted_size()))
    }
}

impl RouteCache {
    fn new(route: &str, spec: Arc<CacheSpec>, second: Option<SecondLevel>) -> Self {
        let evicted = ::metrics::counter!(metrics::CACHE_EVICTIONS, "route" => route.to_owned());
        evicted.absolute(0);
        let (count, bytes) = gauges(route);
        // A new store starts empty (the one it replaces was let go whole).
        count.set(0.0);
        bytes.set(0.0);
        let entries = moka::sync::Cache::builder()
            .max_capacity(spec.max_bytes)
            .weigher(|_: &Key, kept: &Kept| kept.entry.weight())
            .expire_after(Expiry)
            .eviction_listener(move |_, kept: Kept, cause| {
                // Every removal (evicted, expired, replaced, invalidated) is told here.
                count.decrement(1.0);
                bytes.decrement(f64::from(kept.entry.weight()));
                if cause.was_evicted() {
                    evicted.increment(1);
                }
            })
            .build();
        for result in ["hit", "miss", "bypass", "coalesced"] {
            ::metrics::counter!(metrics::CACHE_LOOKUPS, "route" => route.to_owned(), "result" => result).absolute(0);
        }
        ::metrics::counter!(metrics::CACHE_PRECOMPUTED, "route" => route.to_owned()).absolute(0);
        ::metrics::counter!(metrics::CACHE_PRECOMPUTED_HITS, "route" => route.to_owned()).absolute(0);
        for result in ["hit", "deduped", "sent"] {
            ::metrics::counter!(metrics::CACHE_ROWS, "route" => route.to_owned(), "result" => result).absolute(0);
        }
        if second.is_some() {
            for result in ["hit", "miss", "unavailable"] {
                let labels = [("route", route.to_owned()), ("result", result.to_owned())];
                ::metrics::counter!(metrics::CACHE_REDIS_LOOKUPS, &labels).absolute(0);
            }
        }
        RouteCache {
            route: route.to_owned(),
            spec,
            entries,
            flights: Mutex::new(HashMap::new()),
            second,
        }
    }

    /// The settings it keeps entries under.
    pub fn spec(&self) -> &CacheSpec {
        &self.spec
    }

    /// Whether an entry is kept for `key` (without counting as a use of it).
    pub fn holds(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    /// The entry for `key`, if this gateway's memory keeps one, and whether it was
    /// precomputed (a use of it: one that was is counted so).
    pub fn get(&self, key: &Key) -> Option<(Arc<Entry>, bool)> {
        let kept = self.entries.get(key)?;
        if kept.precomputed {
            ::metrics::counter!(metrics::CACHE_PRECOMPUTED_HITS, "route" => self.route.clone()).increment(1);
        }
        Some((kept.entry, kept.precomputed))
    }

    /// The entry for `key` in the second level, if there is one and it keeps one
    /// (then kept in memory too, for what it has left there), and whether it was
    /// precomputed.
    pub async fn get_shared(&self, key: &Key) -> Option<(Arc<Entry>, bool)> {
        let second = self.second.as_ref()?;
        let found = second.get(&self.route, key, self.spec.max_bytes).await;
        let result = match &found {
            second::Found::Entry(..) => "hit",
            second::Found::Nothing => "miss",
            second::Found::Unavailable => "unavailable",
        };
        let labels = [("route", self.route.clone()), ("result", result.to_owned())];
        ::metrics::counter!(metrics::CACHE_REDIS_LOOKUPS, &labels).increment(1);
        let second::Found::Entry(entry, left, precomputed) = found else {
            return None;
        };
        let entry = Arc::new(entry);
        if precomputed {
            ::metrics::counter!(metrics::CACHE_PRECOMPUTED_HITS, "route" => self.route.clone()).increment(1);
        }
        // A precomputed entry keeps the TTL its batch gave it; any other, at most the route's.
        let ttl = if precomputed { left } else { left.min(self.spec.ttl) };
        self.keep(
            *key,
            Kept {
                entry: entry.clone(),
                ttl,
                precomputed,
            },
        );
        Some((entry, precomputed))
    }

    /// Keeps `entry` for `key` for the route's TTL, here and in the second level.
    pub fn put(&self, key: Key, entry: Arc<Entry>) {
        self.put_for(key, entry, self.spec.ttl);
    }

    /// Keeps `entry` for `key` for `ttl`, here and in the second level.
    pub fn put_for(&self, key: Key, entry: Arc<Entry>, ttl: Duration) {
        self.put_kept(
            key,
            Kept {
                entry,
                ttl,
                precomputed: false,
            },
        );
    }

    /// Keeps `entry`, computed ahead of the requests that will ask for it (by a batch or
    /// a Kafka source), for `key` for `ttl`, here and in the second level; its hits are
    /// counted apart.
    pub fn precompute(&self, key: Key, entry: Arc<Entry>, ttl: Duration) {
        ::metrics::counter!(metrics::CACHE_PRECOMPUTED, "route" => self.route.clone()).increment(1);
        self.put_kept(
            key,
            Kept {
                entry,
                ttl,
                precomputed: true,
            },
        );
    }

    fn put_kept(&self, key: Key, kept: Kept) {
        if let Some(second) = &self.second {
            second.put(&self.route, &key, (&kept.entry, kept.precomputed), kept.ttl);
        }
        self.keep(key, kept);
    }

    /// Keeps `kept` for `key` in this gateway's memory.
    fn keep(&self, key: Key, kept: Kept) {
        let (count, bytes) = gauges(&self.route);
        count.increment(1.0);
        bytes.increment(f64::from(kept.entry.weight()));
        self.entries.insert(key, kept);
    }

    /// Counts a lookup that ended in `result` (`hit`, `miss`, `bypass`, `coalesced`).
    pub fn counted(&self, result: &'static str) {
        ::metrics::counter!(metrics::CACHE_LOOKUPS, "route" => self.route.clone(), "result" => result).increment(1);
    }

    /// Counts `n` micro-batch rows that ended in `result` (`hit`, `deduped`, `sent`).
    pub fn rows(&self, result: &'static str, n: u64) {
        if n > 0 {
            ::metrics::counter!(metrics::CACHE_ROWS, "route" => self.route.clone(), "result" => result).increment(n);
        }
    }

    /// Joins the call in flight for `key`, or leads a new one (always when the route
    /// does not coalesce).
    pub fn join(self: &Arc<Self>, key: Key) -> Joined {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if self.spec.coalesce {
            if let Some(flight) = flights.get(&key) {
                return Joined::Follow(Follower(flight.clone()));
            }
        }
        let (send, receive) = watch::channel(Landed::Flying);
        if self.spec.coalesce {
            flights.insert(key, receive);
        }
        Joined::Lead(Flight {
            store: self.clone(),
            key,
            send: Some(send),
        })
    }
}

/// `route`'s entries and bytes gauges: raised as an entry is kept, lowered as the store
/// tells of its removal (so a kept entry counts at once, and never twice).
fn gauges(route: &str) -> (::metrics::Gauge, ::metrics::Gauge) {
    (
        ::metrics::gauge!(metrics::CACHE_ENTRIES, "route" => route.to_owned()),
        ::metrics::gauge!(metrics::CACHE_BYTES, "route" => route.to_owned()),
    )
}

/// A backend call whose answer the requests that join it share. Dropped unfinished (its
/// caller went away), its followers ask for themselves.
#[derive(Debug)]
pub struct Flight {
    store: Arc<RouteCache>,
    key: Key,
    send: Option<watch::Sender<Landed>>,
}

impl Flight {
    /// Ends the flight with `entry` (kept, and given to every follower) or with nothing.
    pub fn land(self, entry: Option<Arc<Entry>>) {
        if let Some(entry) = &entry {
            self.store.put(self.key, entry.clone());
        }
        self.share(entry);
    }

    /// Ends the flight with `entry`, already kept (or nothing), given to every follower.
    pub fn share(mut self, entry: Option<Arc<Entry>>) {
        self.leave();
        if let Some(send) = self.send.take() {
            send.send_replace(entry.map_or(Landed::Nothing, Landed::Answer));
        }
    }

    fn leave(&self) {
        let mut flights = self.store.flights.lock().unwrap_or_else(|e| e.into_inner());
        flights.remove(&self.key);
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        if self.send.is_some() {
            self.leave();
        }
    }
}

/// A request waiting for a call in flight.
#[derive(Debug)]
pub struct Follower(watch::Receiver<Landed>);

impl Follower {
    /// The flight's answer, once it lands; `None` when it brings nothing to share or its
    /// leader went away (the follower then asks for itself).
    pub async fn answer(mut self) -> Option<Arc<Entry>> {
        let landed = self.0.wait_for(|l| !matches!(l, Landed::Flying)).await.ok()?;
        match &*landed {
            Landed::Answer(entry) => Some(entry.clone()),
            _ => None,
        }
    }
}
