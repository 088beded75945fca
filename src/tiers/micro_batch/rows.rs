//! Rows on a route with its cache on (`[routes.NAME.cache] rows`, the default): before a
//! KServe v2 batch goes out, each caller's rows are looked up in the route's cache one
//! by one and the rows identical across the batch's callers are kept once, so the
//! backend call carries only unique rows the cache does not hold. Each caller's answer
//! is then put together from kept and fresh rows, in its own order, and the fresh rows
//! are kept (a row's key is the key of a one-row request asking it, so a one-row caller
//! at the front finds a row a batch kept, and the other way round).
//!
//! Rows are independent in a micro-batch (that is what lets callers share a batch), so
//! a row's answer does not depend on the rows beside it; a route whose model breaks that
//! must not batch, and must not cache either.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;

use super::Rows;
use crate::cache::{entry, Entry, Key, RouteCache, Scope};
use crate::error::{Error, Kind};
use crate::headers;
use crate::protocol::grpc::bridge;
use crate::protocol::{self, batch, rows, InferRequest, InferResponse};
use crate::tiers::batcher::Batch;
use crate::tiers::Reply;

/// How a caller's rows meet its route's cache.
#[derive(Debug)]
pub(super) struct Rowed {
    /// The route's store.
    pub store: Arc<RouteCache>,
    /// The caller's scope (route, backends, tenant, path), which keys each row.
    pub scope: Scope,
    /// The caller asked for a fresh answer (`no-cache`): its rows are not looked up,
    /// only kept.
    pub fresh: bool,
}

/// Where one row's answer comes from.
#[derive(Debug)]
enum Source {
    /// The cache.
    Kept(Arc<Entry>),
    /// The backend: the row at this index of the call.
    Sent(usize),
}

/// Where a sent row's answer is kept: its key and its route's store (none for a caller
/// whose cache is off).
type Keep = Option<(Key, Arc<RouteCache>)>;

/// A batch's rows, looked up and deduped.
#[derive(Debug)]
pub(super) struct Plan {
    /// Per caller, where each of its rows comes from.
    callers: Vec<Vec<Source>>,
    /// The rows to send, in order, each with the key and store to keep its answer in.
    sent: Vec<(InferRequest, Keep)>,
    /// Per caller with its cache on: its store, and its rows hit, deduped and sent.
    counts: Vec<(Arc<RouteCache>, [u64; 3])>,
}

impl Plan {
    /// The plan for `callers`; `None` when none of them has its route's cache on, and
    /// the index of a caller whose tensors do not match their shapes (refused alone).
    pub fn of<R>(callers: &Batch<super::Part, R>) -> Option<Result<Plan, (usize, Error)>> {
        if callers.iter().all(|c| c.payload.cache.is_none()) {
            return None;
        }
        let mut plan = Plan {
            callers: Vec::with_capacity(callers.len()),
            sent: Vec::new(),
            counts: Vec::new(),
        };
        let mut seen: HashMap<Key, usize> = HashMap::new();
        for (i, caller) in callers.iter().enumerate() {
            let Rows::Kserve(req) = &caller.payload.rows else {
                let e = Error::new(Kind::Unavailable, "internal error: a JSON request in a KServe v2 batch");
                return Some(Err((i, e)));
            };
            let rows = match rows::cut(req) {
                Ok(rows) => rows,
                Err(e) => return Some(Err((i, Error::new(Kind::BadRequest, e.to_string())))),
            };
            let mut sources = Vec::with_capacity(rows.len());
            let (mut hit, mut deduped, mut sent) = (0, 0, 0);
            for row in rows {
                let Some(rowed) = &caller.payload.cache else {
                    plan.sent.push((row, None));
                    sources.push(Source::Sent(plan.sent.len() - 1));
                    continue;
                };
                let key = rowed.scope.kserve(&row);
                let kept = (!rowed.fresh).then(|| rowed.store.get(&key)).flatten();
                if let Some(kept) = kept.filter(|e| e.kserve().is_some()) {
                    hit += 1;
                    sources.push(Source::Kept(kept));
                } else if let Some(&j) = seen.get(&key) {
                    deduped += 1;
                    sources.push(Source::Sent(j));
                } else {
                    sent += 1;
                    seen.insert(key, plan.sent.len());
                    sources.push(Source::Sent(plan.sent.len()));
                    plan.sent.push((row, Some((key, rowed.store.clone()))));
                }
            }
            if let Some(rowed) = &caller.payload.cache {
                plan.counts.push((rowed.store.clone(), [hit, deduped, sent]));
            }
            plan.callers.push(sources);
        }
        Some(Ok(plan))
    }

    /// Counts the rows in the route's metrics.
    pub fn count(&self) {
        for (store, [hit, deduped, sent]) in &self.counts {
            store.rows("hit", *hit);
            store.rows("deduped", *deduped);
            store.rows("sent", *sent);
        }
    }

    /// The rows to send, in order (none when the cache holds every row).
    pub fn sent(&self) -> Vec<&InferRequest> {
        self.sent.iter().map(|(row, _)| row).collect()
    }

    /// Each caller's answer from the backend's `reply` to [`Plan::sent`] (none when
    /// nothing was sent) and the kept rows; the fresh rows are kept, unless the backend
    /// said `no-store`. An error for all when the reply cannot be cut into its rows; for
    /// one caller when its rows cannot be joined.
    pub fn answers<R>(
        &self,
        reply: Option<&Reply>,
        callers: &Batch<super::Part, R>,
    ) -> Result<Vec<Result<Reply, Error>>, Error> {
        let fresh = match reply {
            Some(reply) => self.fresh(reply)?,
            None => Vec::new(),
        };
        Ok(callers
            .iter()
            .zip(&self.callers)
            .map(|(caller, sources)| {
                let Rows::Kserve(req) = &caller.payload.rows else {
                    return Err(Error::new(
                        Kind::Unavailable,
                        "internal error: a JSON request in a KServe v2 batch",
                    ));
                };
                let parts: Option<Vec<&InferResponse>> = sources
                    .iter()
                    .map(|s| match s {
                        Source::Kept(kept) => kept.kserve(),
                        Source::Sent(j) => fresh.get(*j),
                    })
                    .collect();
                let broke = |why: String| Error::new(Kind::Backend, format!("the batch's rows do not join: {why}"));
                let parts = parts.ok_or_else(|| broke("a row is missing".into()))?;
                let mut answer = rows::join(&parts).map_err(|e| broke(e.to_string()))?;
                // The caller's own id; one that sent none gets the backend's batch id.
                answer.id = req.id.clone().or_else(|| fresh.first().and_then(|f| f.id.clone()));
                let mut reply = bridge::infer_response_to_http(&answer, &|t| req.wants_binary(&t.name));
                let kept = sources.iter().filter(|s| matches!(s, Source::Kept(_))).count();
                reply
                    .headers_mut()
                    .insert(headers::CACHED_ROWS, HeaderValue::from(kept));
                Ok(reply)
            })
            .collect())
    }

    /// The backend's answer cut into one answer per sent row, each kept under its key.
    fn fresh(&self, reply: &Reply) -> Result<Vec<InferResponse>, Error> {
        let broke = |why: String| Error::new(Kind::Backend, format!("the batch's backend broke the protocol: {why}"));
        let header_len = protocol::header_len(reply.headers()).map_err(|e| broke(e.to_string()))?;
        let decoded = protocol::decode_response(reply.body(), header_len).map_err(|e| broke(e.to_string()))?;
        let ones = vec![1; self.sent.len()];
        let rows = batch::split(&decoded, &ones).map_err(|e| Error::new(Kind::Backend, e.to_string()))?;
        if !entry::forbids_storing(reply.headers()) {
            for (row, (_, keep)) in rows.iter().zip(&self.sent) {
                if let Some((key, store)) = keep {
                    let mut kept = row.clone();
                    kept.id = None;
                    store.put(*key, Arc::new(Entry::Kserve(kept)));
                }
            }
        }
        Ok(rows)
    }
}
