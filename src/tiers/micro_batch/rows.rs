//! Rows on a route with its cache on (`[routes.NAME.cache] rows`, the default): before a
//! batch goes out, each caller's rows are looked up in the route's cache one by one and
//! the rows identical across the batch's callers are kept once, so the backend call
//! carries only unique rows the cache does not hold. Each caller's answer is then put
//! together from kept and fresh rows, in its own order, and the fresh rows are kept. A
//! row's key is the key of a one-row request asking it (a KServe v2 request with that
//! row of every input; a JSON body with that one row), so a one-row caller at the front
//! finds a row a batch kept, and the other way round.
//!
//! Rows are independent in a micro-batch (that is what lets callers share a batch), so
//! a row's answer does not depend on the rows beside it; a route whose model breaks that
//! must not batch, and must not cache either.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::{Map, Value};

use super::combined::Asked;
use super::{json, kserve, Form, Rows};
use crate::cache::{entry, Entry, Key, RouteCache, Scope};
use crate::error::{Error, Kind};
use crate::headers;
use crate::protocol::Reply;
use crate::protocol::{rows, InferRequest, InferResponse};
use crate::tiers::batcher::Batch;

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

/// One row, as a one-row request of its lane's form.
#[derive(Debug)]
enum Row {
    Kserve(InferRequest),
    Json(json::Part),
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

/// A sent row: itself, where its answer is kept, and, for a combined model's member,
/// which member's view of the answer is its own.
type Sent = (Row, Keep, Option<Arc<Asked>>);

/// A sent row's answer, or why it has none (a combined model's answer without one of
/// the member's outputs).
type Fresh = Result<Arc<Entry>, Error>;

/// A batch's rows, looked up and deduped.
#[derive(Debug)]
pub(super) struct Plan {
    /// Per caller, where each of its rows comes from.
    callers: Vec<Vec<Source>>,
    /// The rows to send, in order, each with the key and store to keep its answer in.
    sent: Vec<Sent>,
    /// Per caller with its cache on: its store, and its rows hit, deduped and sent.
    counts: Vec<(Arc<RouteCache>, [u64; 3])>,
    /// Per caller: its rows kept (not precomputed), precomputed, deduped and sent.
    pub per_caller: Vec<[u64; 4]>,
}

/// A caller's rows as one-row requests, each with its key in `scope`.
fn cut(part: &super::Part, scope: Option<&Scope>) -> Result<Vec<(Row, Option<Key>)>, Error> {
    match &part.rows {
        Rows::Kserve(req) => {
            let rows = rows::cut(req).map_err(|e| Error::new(Kind::BadRequest, e.to_string()))?;
            Ok(rows
                .into_iter()
                .map(|row| {
                    let key = scope.map(|s| s.kserve(&row));
                    (Row::Kserve(row), key)
                })
                .collect())
        }
        Rows::Json(part) => Ok((0..part.rows())
            .filter_map(|i| part.row(i))
            .map(|row| {
                let key = scope.map(|s| s.json(&json::body(&[&row])));
                (Row::Json(row), key)
            })
            .collect()),
    }
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
            per_caller: Vec::with_capacity(callers.len()),
        };
        let mut seen: HashMap<Key, usize> = HashMap::new();
        for (i, caller) in callers.iter().enumerate() {
            let rowed = caller.payload.cache.as_deref();
            let rows = match cut(&caller.payload, rowed.map(|r| &r.scope)) {
                Ok(rows) => rows,
                Err(e) => return Some(Err((i, e))),
            };
            let mut sources = Vec::with_capacity(rows.len());
            let (mut hit, mut deduped, mut sent, mut precomputed) = (0, 0, 0, 0);
            for (row, key) in rows {
                let asked = caller.payload.asked.clone();
                let (Some(rowed), Some(key)) = (rowed, key) else {
                    sources.push(Source::Sent(plan.sent.len()));
                    plan.sent.push((row, None, asked));
                    continue;
                };
                let kept = (!rowed.fresh).then(|| rowed.store.get(&key)).flatten();
                if let Some((kept, was_precomputed)) = kept.filter(|(e, _)| answers(e, &row)) {
                    hit += 1;
                    precomputed += u64::from(was_precomputed);
                    sources.push(Source::Kept(kept));
                } else if let Some(&j) = seen.get(&key) {
                    deduped += 1;
                    sources.push(Source::Sent(j));
                } else {
                    sent += 1;
                    seen.insert(key, plan.sent.len());
                    sources.push(Source::Sent(plan.sent.len()));
                    plan.sent.push((row, Some((key, rowed.store.clone())), asked));
                }
            }
            if let Some(rowed) = rowed {
                plan.counts.push((rowed.store.clone(), [hit, deduped, sent]));
            }
            let unkeyed = sources.len() as u64 - hit - deduped - sent;
            plan.per_caller
                .push([hit - precomputed, precomputed, deduped, sent + unkeyed]);
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

    /// Whether there is nothing to send (the cache holds every row).
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// How many rows are sent.
    pub fn sent(&self) -> usize {
        self.sent.len()
    }

    /// The KServe v2 rows to send, in order.
    pub fn kserve_rows(&self) -> Vec<&InferRequest> {
        let rows = self.sent.iter().filter_map(|(row, ..)| match row {
            Row::Kserve(req) => Some(req),
            Row::Json(_) => None,
        });
        rows.collect()
    }

    /// The JSON rows to send, in order.
    pub fn json_rows(&self) -> Vec<&json::Part> {
        let rows = self.sent.iter().filter_map(|(row, ..)| match row {
            Row::Json(part) => Some(part),
            Row::Kserve(_) => None,
        });
        rows.collect()
    }

    /// Each caller's answer from the backend's `reply` to the rows sent (none when
    /// nothing was sent) and the kept rows; the fresh rows are kept, unless the backend
    /// said `no-store`. An error for all when the reply cannot be cut into its rows; for
    /// one caller when its rows cannot be joined.
    pub fn answers<R>(
        &self,
        form: Form,
        reply: Option<&Reply>,
        callers: &Batch<super::Part, R>,
    ) -> Result<Vec<Result<Reply, Error>>, Error> {
        let fresh = match reply {
            Some(reply) => self.fresh(form, reply)?,
            None => Vec::new(),
        };
        Ok(callers
            .iter()
            .zip(&self.callers)
            .map(|(caller, sources)| {
                let mut reply = match (form, &caller.payload.rows) {
                    (Form::Kserve, Rows::Kserve(req)) => {
                        kserve_answer((req, caller.payload.asked.as_deref()), sources, &fresh)?
                    }
                    (Form::Json(adapter), Rows::Json(_)) => json_answer(adapter, sources, &fresh)?,
                    _ => return Err(Error::new(Kind::Unavailable, "internal error: a batch mixed its forms")),
                };
                let kept = sources.iter().filter(|s| matches!(s, Source::Kept(_))).count();
                reply
                    .headers_mut()
                    .insert(headers::CACHED_ROWS, HeaderValue::from(kept));
                Ok(reply)
            })
            .collect())
    }

    /// The backend's answer cut into one answer per sent row (a combined model's
    /// member's row: the member's view of it), each kept under its key.
    fn fresh(&self, form: Form, reply: &Reply) -> Result<Vec<Fresh>, Error> {
        let rows: Vec<Result<Entry, Error>> = match form {
            Form::Kserve => {
                let ones = vec![1; self.sent.len()];
                kserve::split(reply, &ones)?
                    .into_iter()
                    .zip(&self.sent)
                    .map(|(mut row, (_, _, asked))| {
                        row.id = None;
                        match asked {
                            Some(asked) => asked.view(row).map(Entry::Kserve),
                            None => Ok(Entry::Kserve(row)),
                        }
                    })
                    .collect()
            }
            Form::Json(adapter) => json::scatter(adapter, reply, &self.json_rows())?
                .into_iter()
                .map(|row| {
                    Ok(Entry::Raw {
                        status: StatusCode::OK,
                        content_type: row.headers().get(http::header::CONTENT_TYPE).cloned(),
                        body: row.into_body(),
                    })
                })
                .collect(),
        };
        let keep = !entry::forbids_storing(reply.headers());
        Ok(rows
            .into_iter()
            .zip(&self.sent)
            .map(|(row, (_, key, _))| {
                let row = Arc::new(row?);
                if let (true, Some((key, store))) = (keep, key) {
                    store.put(*key, row.clone());
                }
                Ok(row)
            })
            .collect())
    }
}

/// Whether a kept entry can answer `row` (a KServe v2 answer for a KServe v2 row, a raw
/// answer for a JSON one).
fn answers(entry: &Entry, row: &Row) -> bool {
    matches!(
        (entry, row),
        (Entry::Kserve(_), Row::Kserve(_)) | (Entry::Raw { .. }, Row::Json(_))
    )
}

/// A KServe v2 caller's answer joined from its rows, with its own id (one that sent
/// none gets the backend's batch id) and its own choice of JSON or binary outputs (a
/// combined model's member's caller: the outputs it named, in its order).
fn kserve_answer(
    (req, asked): (&InferRequest, Option<&Asked>),
    sources: &[Source],
    fresh: &[Fresh],
) -> Result<Reply, Error> {
    let broke = |why: String| Error::new(Kind::Backend, format!("the batch's rows do not join: {why}"));
    let mut parts: Vec<&InferResponse> = Vec::with_capacity(sources.len());
    for source in sources {
        let part = match source {
            Source::Kept(kept) => kept.kserve(),
            Source::Sent(j) => match fresh.get(*j) {
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(e)) => e.kserve(),
                None => None,
            },
        };
        parts.push(part.ok_or_else(|| broke("a row is missing".into()))?);
    }
    let mut answer = rows::join(&parts).map_err(|e| broke(e.to_string()))?;
    answer.id = req.id.clone().or_else(|| parts.first().and_then(|f| f.id.clone()));
    Ok(kserve::respond(answer, req, asked))
}

/// A JSON caller's answer joined from its rows' one-row answers.
fn json_answer(adapter: crate::policy::JsonAdapter, sources: &[Source], fresh: &[Fresh]) -> Result<Reply, Error> {
    let broke = |why: String| Error::new(Kind::Backend, format!("the batch's rows do not join: {why}"));
    let body = |entry: &Entry| match entry {
        Entry::Raw { body, .. } => serde_json::from_slice::<Map<String, Value>>(body).ok(),
        Entry::Kserve(_) => None,
    };
    let rows: Option<Vec<Map<String, Value>>> = sources
        .iter()
        .map(|s| match s {
            Source::Kept(kept) => body(kept),
            Source::Sent(j) => fresh.get(*j).and_then(|e| e.as_ref().ok()).and_then(|e| body(e)),
        })
        .collect();
    let rows = rows.ok_or_else(|| broke("a row's answer is missing or not a JSON object".into()))?;
    let joined = json::join(adapter, rows).map_err(broke)?;
    let mut reply = Reply::new(Bytes::from(Value::Object(joined).to_string()));
    reply
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(reply)
}
