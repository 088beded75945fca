//! Sending one batch: build the backend request from the callers' parts, call the batch
//! pool, and scatter the answer back. A batch the backend refuses as a bad request is
//! split in two and each half sent again, so one poison request fails alone and its
//! batch-mates still get answers; any other failure reaches every caller in the batch,
//! saying it was a batch. A streamed batch's answer is cut into one stream per caller,
//! and its slot held until the stream ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use tokio::time::Instant;

use super::rows::Plan;
use super::{combined, json, kserve, Form, Lane, Part, Rows};
use crate::backend::stream::Streamed;
use crate::decision::Tier;
use crate::error::{Error, Kind};
use crate::headers;
use crate::protocol;
use crate::protocol::Reply;
use crate::shadow::Primary;
use crate::tiers::batcher::{Batch, Entry, Flush};
use crate::timing::Spent;
use tracing::Instrument;

type Callers = Batch<Part, Reply>;

/// Sends a batch the batcher sealed for `flush`, answering every caller in it.
pub(super) async fn send(lane: Arc<Lane>, batch: Callers, flush: Flush) {
    let sent = Instant::now();
    let rows: u64 = batch.iter().map(|e| e.rows).sum();
    lane.metrics.flushed(flush, rows, lane.max_batch);
    for entry in batch.iter().filter(|e| !e.filler) {
        let waited = sent.saturating_duration_since(entry.queued_at);
        lane.metrics.queue_seconds[entry.priority.index()].record(waited.as_secs_f64());
    }
    run(&lane, batch, (sent, flush)).await;
}

/// A new batch id: `mb_` and 16 hex digits, random (unique enough to find one batch's
/// log line, answers and backend call among a day's).
fn batch_id() -> String {
    format!("mb_{:016x}", rand::random::<u64>())
}

/// One backend call for `callers`, split and re-sent on a refusal (boxed: it recurses).
fn run<'a>(
    lane: &'a Lane,
    mut callers: Callers,
    (sent, flush): (Instant, Flush),
) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        callers.retain(|e| !e.reply.is_closed());
        let (request, plan) = loop {
            if callers.is_empty() {
                return;
            }
            match prepare(lane, &callers) {
                Ok(prepared) => break prepared,
                // One caller's tensors do not match their shapes: refuse it alone.
                Err((Some(index), e)) if index < callers.len() => {
                    let _ = callers.remove(index).reply.send(Err(e));
                }
                Err((_, e)) => return fail(callers, &e),
            }
        };
        if let Some(plan) = &plan {
            plan.count();
        }
        let rows: Vec<u64> = callers.iter().map(|e| e.rows).collect();
        let Some(mut request) = request else {
            // The cache held every row: no backend call.
            charge(
                lane,
                &callers,
                (plan.as_ref(), lane.shares.one()),
                (Duration::ZERO, 0),
                false,
            );
            let replies = plan.as_ref().map(|p| p.answers(lane.form, None, &callers));
            return scattered(callers, replies, (0, None), (sent, Duration::ZERO));
        };
        let total = plan.as_ref().map_or(rows.iter().sum(), |p| p.sent() as u64);
        let deadline = callers.iter().map(|e| e.deadline).max().unwrap_or(sent);
        let id = batch_id();
        if let Ok(value) = HeaderValue::from_str(&id) {
            request.headers_mut().insert(headers::BATCH_ID, value);
        }
        let span = batch_span(&callers, total, &mut request);
        // A share of batches go to the route's shadow candidate too, as the same batch
        // (never a stream: the candidate is scored on whole answers).
        let streaming = crate::backend::stream::wanted(&request);
        let mirror = lane
            .shadow
            .as_ref()
            .filter(|_| !streaming)
            .and_then(|shadow| Some((shadow, shadow.wants_batch(&lane.route)?)))
            .map(|(shadow, spec)| (shadow, spec, crate::backend::copy(&request)));
        let learned = lane.cost.predict(total);
        let bytes: u64 = callers.iter().map(|e| e.bytes).sum();
        let one = lane.shares.one();
        let call = lane.shares.begin(lane.pool.healthy());
        let called = lane.pool.forward(request, deadline).instrument(span).await;
        let answered = matches!(&called, Ok(reply) if reply.status().is_success());
        let (took, share) = call.end(lane.pool.healthy(), answered.then_some(total));
        // A stream handed up at its head: its time says nothing of the batch's cost.
        let streamed = matches!(&called, Ok(reply) if reply.extensions().get::<Streamed>().is_some());
        if !streamed {
            lane.went(&called, learned, took);
        }
        charge(lane, &callers, (plan.as_ref(), one), (share, total), answered);
        tracing::info!(
            target: "tiergate::lineage",
            batch = %id,
            route = %lane.route,
            path = %lane.path,
            rows = total,
            callers = callers.len(),
            flush = flush.as_str(),
            learned_ms = learned.map(|t| t.as_secs_f64() * 1e3),
            took_ms = took.as_secs_f64() * 1e3,
            status = called.as_ref().map_or(0, |r| r.status().as_u16()),
            "batch"
        );
        if let (Some((shadow, spec, copy)), Ok(primary)) = (mirror, &called) {
            let primary = Primary {
                answer: primary,
                took,
                pool: &lane.pool_spec,
            };
            shadow.mirror(&lane.route, spec, Tier::MicroBatch, copy, primary);
        }
        match called {
            Ok(mut reply) if streamed => {
                let split = json_parts(&callers).map(|parts| {
                    let deadlines: Vec<Instant> = callers.iter().map(|e| e.deadline).collect();
                    json::stream::split(&mut reply, &parts, &deadlines, lane.pool.max_response_bytes())
                });
                let Ok(Some((replies, pump))) = split else {
                    return fail(callers, &mixed());
                };
                let replies = replies.into_iter().map(Ok).collect();
                scattered(callers, Some(Ok(replies)), (total, Some(&id)), (sent, took));
                // The batch's slot is held until its stream ends.
                pump.await;
            }
            Ok(reply) if reply.status().is_success() => {
                lane.cost.observe(total, took);
                lane.metrics.learned(&lane.cost);
                let replies = match &plan {
                    Some(plan) => plan.answers(lane.form, Some(&reply), &callers),
                    None => scatter(lane, &reply, &callers, &rows),
                };
                scattered(callers, Some(replies), (total, Some(&id)), (sent, took));
            }
            Ok(reply) if input_failed(&reply) && callers.len() > 1 => {
                if reply.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    // Too large together: batches stay under half of it from now on.
                    let now = lane.max_bytes.refused(bytes);
                    tracing::info!(route = %lane.route, bytes, "a batch was refused as too large: batches now carry at most {now} bytes");
                }
                lane.metrics.isolations.increment(1);
                let second = callers.split_off(callers.len() / 2);
                run(lane, callers, (sent, flush)).await;
                run(lane, second, (sent, flush)).await;
            }
            Ok(reply) if callers.len() == 1 => {
                for caller in callers {
                    answer(caller, reply.clone(), (total, Some(&id)), (sent, took));
                }
            }
            Ok(reply) => {
                let shared = batch_failure(&reply, callers.len(), total);
                for caller in callers {
                    answer(caller, shared.clone(), (total, Some(&id)), (sent, took));
                }
            }
            Err(e) => {
                let e = Error::new(
                    e.kind,
                    format!("{} (batch {id}: {} requests, {total} rows)", e.message, callers.len()),
                );
                fail(callers, &e);
            }
        }
    })
}

impl Lane {
    /// Moves the pool's progressive batch size by how a batch went: halved after a
    /// failure (an error, a 5xx, a timeout) or a batch that took more than three times
    /// its learned cost and 10 ms more; grown after one that went well; left alone after a
    /// refusal or a failure the pool found to be the input's (not the pool's fault).
    fn went(&self, called: &Result<Reply, Error>, learned: Option<Duration>, took: Duration) {
        let ok = match called {
            Ok(reply) if input_failed(reply) => return,
            Ok(reply) if reply.status().is_success() => {
                learned.is_none_or(|t| took <= t.saturating_mul(3) + Duration::from_millis(10))
            }
            Ok(_) | Err(_) => false,
        };
        let before = self.limit.now(self.max_batch);
        let now = match ok {
            true => self.limit.grow(self.max_batch),
            false => self.limit.shrink(self.max_batch),
        };
        if now != before {
            self.metrics.limit.set(now as f64);
            if !ok {
                tracing::info!(route = %self.route, rows = now, "a batch went wrong: batches now carry at most {now} rows");
            }
        }
    }
}

/// Charges each caller of a batch its share of `used`, the pool's time the call for
/// `sent` rows was given (see [`crate::usage::Shares`]), by its rows sent of them (none
/// when the cache held every row): its rows when `answered`, what its rows sent would
/// have cost alone (`one`, `t(1)` each as learned before this batch; unpriced until the
/// pool's service times tell it), and what its rows the cache held or a
/// batch-mate's row answered would have cost. A caller of offline work is charged as
/// the offline tier's.
fn charge(
    lane: &Lane,
    callers: &Callers,
    (plan, one): (Option<&Plan>, Option<Duration>),
    (used, sent): (Duration, u64),
    answered: bool,
) {
    use crate::usage::{ns, Field, Saved, Source};
    let took = ns(used);
    for (i, caller) in callers.iter().enumerate() {
        let [kept, precomputed, deduped, own] =
            plan.and_then(|p| p.per_caller.get(i).copied())
                .unwrap_or([0, 0, 0, caller.rows]);
        let share = |whole: u64| match sent {
            0 => 0,
            // In u128: a minute in nanoseconds times 16k rows is past u64.
            n => u64::try_from(u128::from(whole) * u128::from(own) / u128::from(n)).unwrap_or(u64::MAX),
        };
        let used = share(took);
        let mut figures = Saved::Cache.figures(kept, one);
        figures.add(&Saved::Precomputed.figures(precomputed, one));
        figures.add(&Saved::Dedupe.figures(deduped, one));
        figures = figures
            .with(Field::CallsMicro, share(1_000_000))
            .with(Field::UsedNs, used);
        figures = match one {
            Some(one) => figures.with(Field::AloneNs, ns(one).saturating_mul(own)),
            None => figures
                .with(Field::AloneNs, used)
                .with(Field::UnpricedRows, own)
                .with(Field::UnpricedNs, used),
        };
        if answered || sent == 0 {
            figures = figures.with(Field::Rows, caller.rows);
        }
        let source = if caller.filler {
            Source::Offline
        } else {
            Source::MicroBatch
        };
        lane.usage.add(source, &caller.payload.tenant, &figures);
    }
}

/// Statuses that mean "this input is wrong": the batch is split to find whose.
fn refused(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 413 | 422)
}

/// Whether an answer says its input is wrong: a refusal, or a server error the batch
/// met alike on two endpoints (the pool's [`crate::backend::InputFailed`]).
fn input_failed(reply: &Reply) -> bool {
    refused(reply.status()) || reply.extensions().get::<crate::backend::InputFailed>().is_some()
}

/// The backend request for `callers` (none when the cache holds every row) and, on a
/// route with its cache on, the plan of which rows it carries.
type Prepared = (Option<http::Request<Bytes>>, Option<Plan>);

fn prepare(lane: &Lane, callers: &Callers) -> Result<Prepared, (Option<usize>, Error)> {
    // The time the batch is still useful for: until its last caller's deadline.
    let left = callers
        .iter()
        .map(|e| e.deadline)
        .max()
        .map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
    match &lane.form {
        Form::Kserve => {
            // A combined model's batch asks for every output of the members in it.
            let outputs = combined::outputs(callers.iter().filter_map(|c| c.payload.asked.as_deref()));
            let Some(plan) = Plan::of(callers) else {
                let reqs = kserve_parts(callers).map_err(|e| (None, e))?;
                return Ok((
                    Some(kserve::build(&lane.path, &reqs, (lane.binary, left), outputs)?),
                    None,
                ));
            };
            let plan = plan.map_err(|(index, e)| (Some(index), e))?;
            if plan.is_empty() {
                return Ok((None, Some(plan)));
            }
            // The rows were checked against their shapes when the plan cut them.
            let rows = plan.kserve_rows();
            let request = kserve::build(&lane.path, &rows, (lane.binary, left), outputs).map_err(|(_, e)| (None, e))?;
            Ok((Some(request), Some(plan)))
        }
        Form::Json(_) => {
            let Some(plan) = Plan::of(callers) else {
                let parts = json_parts(callers).map_err(|e| (None, e))?;
                return Ok((Some(json::build(&lane.path, &parts).map_err(|e| (None, e))?), None));
            };
            let plan = plan.map_err(|(index, e)| (Some(index), e))?;
            if plan.is_empty() {
                return Ok((None, Some(plan)));
            }
            let request = json::build(&lane.path, &plan.json_rows()).map_err(|e| (None, e))?;
            Ok((Some(request), Some(plan)))
        }
    }
}

/// Answers every caller with its share of a batch's answer, or all with one error;
/// the batch went at `sent` and its backend call took `took` (zero: none was made).
fn scattered(
    callers: Callers,
    replies: Option<Result<Vec<Result<Reply, Error>>, Error>>,
    batch: (u64, Option<&str>),
    sent: (Instant, Duration),
) {
    match replies {
        Some(Ok(replies)) => {
            for (caller, reply) in callers.into_iter().zip(replies) {
                match reply {
                    Ok(reply) => answer(caller, reply, batch, sent),
                    Err(e) => {
                        let _ = caller.reply.send(Err(e));
                    }
                }
            }
        }
        Some(Err(e)) => fail(callers, &e),
        None => fail(
            callers,
            &Error::new(Kind::Unavailable, "internal error: a batch with nothing to send"),
        ),
    }
}

fn scatter(lane: &Lane, reply: &Reply, callers: &Callers, rows: &[u64]) -> Result<Vec<Result<Reply, Error>>, Error> {
    match &lane.form {
        Form::Kserve => {
            let asked: Vec<_> = callers.iter().map(|c| c.payload.asked.as_deref()).collect();
            kserve::scatter(reply, &kserve_parts(callers)?, &asked, rows)
        }
        Form::Json(adapter) => Ok(json::scatter(*adapter, reply, &json_parts(callers)?)?
            .into_iter()
            .map(Ok)
            .collect()),
    }
}

/// The span of one batch's backend call: a child of its first caller's span, linking
/// the others' when spans are exported. The backend request carries the first
/// caller's trace.
fn batch_span(callers: &Callers, rows: u64, request: &mut http::Request<Bytes>) -> tracing::Span {
    // Offline filler carries no trace: the first caller that does leads the batch.
    let Some(first) = callers.iter().find(|c| c.payload.ids.is_some()).or(callers.first()) else {
        return tracing::Span::none();
    };
    let span = tracing::info_span!(parent: &first.payload.span, "batch", callers = callers.len(), rows);
    for other in callers.iter().filter(|c| !std::ptr::eq(*c, first)) {
        crate::telemetry::link(&span, &other.payload.span);
    }
    if let Some(ids) = &first.payload.ids {
        request.extensions_mut().insert(ids.clone());
    }
    span
}

fn kserve_parts(callers: &Callers) -> Result<Vec<&protocol::InferRequest>, Error> {
    callers
        .iter()
        .map(|e| match &e.payload.rows {
            Rows::Kserve(req) => Ok(&**req),
            Rows::Json(_) => Err(mixed()),
        })
        .collect()
}

fn json_parts(callers: &Callers) -> Result<Vec<&json::Part>, Error> {
    callers
        .iter()
        .map(|e| match &e.payload.rows {
            Rows::Json(part) => Ok(part),
            Rows::Kserve(_) => Err(mixed()),
        })
        .collect()
}

fn mixed() -> Error {
    Error::new(
        Kind::Unavailable,
        "internal error: a batch mixed KServe v2 and JSON requests",
    )
}

/// A non-refusal failure answer for everyone in a batch: the backend's status, and its
/// message saying it answered a batch.
fn batch_failure(reply: &Reply, requests: usize, rows: u64) -> Reply {
    let said = serde_json::from_slice::<serde_json::Value>(reply.body())
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(reply.body()).chars().take(512).collect());
    let message = format!(
        "the batch pool's backend answered {} to a batch of {requests} requests ({rows} rows): {said}",
        reply.status()
    );
    let mut failure = http::Response::new(protocol::error_body(&message));
    *failure.status_mut() = reply.status();
    failure
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    failure
}

/// Answers `caller` with `reply`, saying the batch's rows and id (none when the cache
/// held every row), how long the caller waited for the batch sent at `sent`, and how
/// long its backend call took (`Server-Timing`: `queue`, `backend`).
fn answer(
    caller: Entry<Part, Reply>,
    mut reply: Reply,
    (rows, id): (u64, Option<&str>),
    (sent, took): (Instant, Duration),
) {
    let waited = sent.saturating_duration_since(caller.queued_at);
    match took.is_zero() {
        true => crate::timing::set(reply.extensions_mut(), &[(Spent::Queue, waited)]),
        false => crate::timing::set(
            reply.extensions_mut(),
            &[(Spent::Queue, waited), (Spent::Backend, took)],
        ),
    }
    let headers = reply.headers_mut();
    headers.insert(headers::BATCH_SIZE, HeaderValue::from(rows));
    if let Some(id) = id.and_then(|id| HeaderValue::from_str(id).ok()) {
        headers.insert(headers::BATCH_ID, id);
    }
    if let Ok(ms) = HeaderValue::from_str(&format!("{:.3}", waited.as_secs_f64() * 1e3)) {
        headers.insert(headers::QUEUE_MS, ms);
    }
    let _ = caller.reply.send(Ok(reply));
}

fn fail(callers: Callers, e: &Error) {
    for caller in callers {
        let _ = caller.reply.send(Err(e.clone()));
    }
}
