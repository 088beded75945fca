//! The cache's shared second level: a Redis that the gateway's replicas share, behind
//! each one's own memory. An entry one replica keeps is written there too (with what is
//! left of its TTL), so another replica asking the same question finds it; what a
//! replica finds there it keeps in its memory for the rest of the entry's TTL.
//!
//! Redis is a help, never a dependency: a lookup or a write waits at most
//! `cache.redis_timeout`, and a Redis that failed (down, slow, refusing) is left alone
//! for `cache.redis_retry`, while the gateway answers from its own memory; then one
//! request at a time tries it again. Callers never see its errors. Each change between
//! in use and not is one log line, and `tiergate_cache_redis_up` shows which.
//!
//! Keys are `PREFIX:ROUTE:HEX` (the route in the key lets an invalidation find a
//! route's entries); values are one byte (1: precomputed, by a batch or a Kafka source;
//! else 0) and then [`Entry::to_bytes`]. Redis must be as private as the
//! gateway's memory: whoever can write to it can answer for the model.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{Entry, Key};
use crate::config::CacheConfig;
use crate::metrics;

/// A Redis shared by the gateway's replicas.
#[derive(Clone)]
pub struct SecondLevel(Arc<Inner>);

struct Inner {
    conn: ConnectionManager,
    /// `host:port`, for log lines (the URL may hold a password).
    addr: String,
    prefix: String,
    timeout: Duration,
    retry: Duration,
    writes: Arc<Semaphore>,
    /// Redis is in use.
    up: AtomicBool,
    /// While not in use: until when (milliseconds since `started`) it is left alone.
    down_until: AtomicU64,
    /// One request at a time tries a Redis that failed.
    probing: AtomicBool,
    started: Instant,
}

impl std::fmt::Debug for SecondLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecondLevel").field("addr", &self.0.addr).finish()
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Found {
    /// An entry, how long it has left, and whether it was precomputed.
    Entry(Entry, Duration, bool),
    /// Nothing under the key.
    Nothing,
    /// Redis was not asked (left alone after a failure) or did not answer in time.
    Unavailable,
}

impl SecondLevel {
    /// The second level `config` names, if it names one; connects on first use, on the
    /// current runtime. Errors when the URL does not parse (the settings check says so
    /// first).
    pub fn new(config: &CacheConfig) -> Result<Option<Self>, String> {
        let Some(url) = &config.redis else {
            return Ok(None);
        };
        let client = ::redis::Client::open(url.0.as_str()).map_err(|e| format!("cache.redis: {}", e.category()))?;
        let addr = client.get_connection_info().addr().to_string();
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.redis_timeout))
            .set_response_timeout(Some(config.redis_timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client, settings)
            .map_err(|e| format!("cache.redis ({addr}): {}", e.category()))?;
        ::metrics::gauge!(metrics::CACHE_REDIS_UP, "redis" => addr.clone()).set(1.0);
        for op in ["get", "set", "invalidate"] {
            ::metrics::counter!(metrics::CACHE_REDIS_ERRORS, "redis" => addr.clone(), "op" => op).absolute(0);
        }
        Ok(Some(SecondLevel(Arc::new(Inner {
            conn,
            addr,
            prefix: config.redis_prefix.clone(),
            timeout: config.redis_timeout,
            retry: config.redis_retry,
            writes: Arc::new(Semaphore::new(config.max_redis_writes)),
            up: AtomicBool::new(true),
            down_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            started: Instant::now(),
        }))))
    }

    /// The entry kept under `key` for `route`, at most `max_bytes` of it.
    pub async fn get(&self, route: &str, key: &Key, max_bytes: u64) -> Found {
        let Some(_probe) = self.0.may_ask() else {
            return Found::Unavailable;
        };
        let name = self.0.name(route, key);
        let mut conn = self.0.conn.clone();
        let mut pipe = ::redis::pipe();
        pipe.get(&name).pttl(&name);
        let asked = pipe.query_async::<(Option<Vec<u8>>, i64)>(&mut conn);
        match tokio::time::timeout(self.0.timeout, asked).await {
            Ok(Ok((Some(bytes), left))) if bytes.len() as u64 <= max_bytes && left > 0 => {
                self.0.answered();
                let bytes = Bytes::from(bytes);
                let precomputed = bytes.first() == Some(&1);
                match Entry::from_bytes(&bytes.slice(1.min(bytes.len())..)) {
                    Some(entry) => Found::Entry(entry, Duration::from_millis(left.unsigned_abs()), precomputed),
                    None => Found::Nothing, // another layout, or not ours: a miss
                }
            }
            Ok(Ok(_)) => {
                self.0.answered();
                Found::Nothing
            }
            Ok(Err(e)) => self.0.failed("get", &e.to_string()),
            Err(_) => self.0.failed("get", &format!("no answer within {:?}", self.0.timeout)),
        }
    }

    /// Writes `entry` under `key` for `route`, to expire in `ttl` (`precomputed` said
    /// with it); in the background, and not at all while Redis is left alone or too many
    /// writes are in flight.
    pub fn put(&self, route: &str, key: &Key, (entry, precomputed): (&Entry, bool), ttl: Duration) {
        if !self.0.in_use() {
            return;
        }
        let Ok(slot) = self.0.writes.clone().try_acquire_owned() else {
            self.0.errors("set");
            return;
        };
        let mut value = vec![u8::from(precomputed)];
        value.extend_from_slice(&entry.to_bytes());
        let (inner, name) = (self.0.clone(), self.0.name(route, key));
        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = inner.conn.clone();
            let mut set = ::redis::cmd("SET");
            set.arg(&name).arg(value).arg("PX").arg(ttl);
            let set = set.query_async::<()>(&mut conn);
            match tokio::time::timeout(inner.timeout, set).await {
                Ok(Ok(())) => inner.answered(),
                Ok(Err(e)) => drop(inner.failed("set", &e.to_string())),
                Err(_) => drop(inner.failed("set", &format!("no answer within {:?}", inner.timeout))),
            }
        });
    }

    /// Drops every entry of `route`; returns how many there were. Takes as long as the
    /// scan does (bounded by `within`), and says why when Redis could not be asked.
    pub async fn invalidate(&self, route: &str, within: Duration) -> Result<u64, String> {
        let pattern = format!("{}:{}:*", self.0.prefix, glob_escaped(route));
        let mut conn = self.0.conn.clone();
        let scan = async {
            let mut dropped = 0u64;
            let mut cursor = 0u64;
            loop {
                let (next, names): (u64, Vec<String>) = ::redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                if !names.is_empty() {
                    dropped += ::redis::cmd("UNLINK").arg(&names).query_async::<u64>(&mut conn).await?;
                }
                if next == 0 {
                    return Ok::<_, ::redis::RedisError>(dropped);
                }
                cursor = next;
            }
        };
        match tokio::time::timeout(within, scan).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => {
                self.0.errors("invalidate");
                Err(format!("Redis at {}: {e}", self.0.addr))
            }
            Err(_) => {
                self.0.errors("invalidate");
                Err(format!("Redis at {} did not finish within {within:?}", self.0.addr))
            }
        }
    }
}

/// A probe of a Redis that failed; let go when the probe ends.
struct Probe<'a>(Option<&'a AtomicBool>);

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(probing) = self.0 {
            probing.store(false, Ordering::Release);
        }
    }
}

impl Inner {
    fn name(&self, route: &str, key: &Key) -> String {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{route}:{hex}", self.prefix)
    }

    fn errors(&self, op: &'static str) {
        ::metrics::counter!(metrics::CACHE_REDIS_ERRORS, "redis" => self.addr.clone(), "op" => op).increment(1);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn in_use(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Whether a lookup may ask Redis now: always while it is in use; after a failure,
    /// once `retry` has passed, one request at a time.
    fn may_ask(&self) -> Option<Probe<'_>> {
        if self.in_use() {
            return Some(Probe(None));
        }
        if self.now_ms() < self.down_until.load(Ordering::Acquire) {
            return None;
        }
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Probe(Some(&self.probing)))
    }

    /// Redis answered: back in use if it was not.
    fn answered(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            ::metrics::gauge!(metrics::CACHE_REDIS_UP, "redis" => self.addr.clone()).set(1.0);
            tracing::info!(redis = %self.addr, "Redis answers again: the cache shares entries through it");
        }
    }

    /// Redis failed at `op`: left alone for `retry`, counted, and said once.
    fn failed(&self, op: &'static str, why: &str) -> Found {
        self.errors(op);
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(self.retry.as_millis()).unwrap_or(u64::MAX));
        self.down_until.store(until, Ordering::Release);
        if self.up.swap(false, Ordering::AcqRel) {
            ::metrics::gauge!(metrics::CACHE_REDIS_UP, "redis" => self.addr.clone()).set(0.0);
            tracing::warn!(
                redis = %self.addr, op, error = why,
                "Redis failed: the cache serves from this gateway's memory alone, and tries Redis again every {:?}",
                self.retry
            );
        }
        Found::Unavailable
    }
}

/// `text` with Redis glob characters escaped, to match itself only.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
