//! A Kafka source (the `kafka` feature): a door whose requests come from a topic and
//! whose answers go to another under each request's key.
//!
//! Each message goes through the door pipeline like any door's request (admission,
//! held bytes, counted decision, request and SLO metrics), but its tier is decided,
//! not classified: a topic is bulk work, so it is always the micro-batch tier, and
//! never takes real-time capacity (`x-tiergate-reason`-style reason `kafka_source`).
//! The loop reads a chunk of requests (up to `max_in_flight`), serves them all at once
//! (so they share batches), produces every answer, waits until the brokers have all of
//! them, then commits the chunk's offsets. A crash before the commit replays the chunk:
//! at least once, and keyed, so a consumer of the output keeps the last answer.
//!
//! Back-pressure: requests that are refused for now (queue full, a budget it cannot
//! meet, a pool at its limit, a rate limit, the micro_batch flag off) are retried with
//! exponential back-off while the source's partitions are paused, so nothing more is
//! read until the batch pool takes them. Nothing is buffered beyond the chunk. [`check`]
//! runs at start and refuses to start with a clear error when the brokers cannot be
//! reached, a topic is missing, or a source names a route without a batch pool.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::pipeline::dispatch::Dispatch;
use crate::config::{Kafka, KafkaSource};
use crate::decision::{BudgetSource, Decision, Door, Reason, Tier};
use crate::error::{Error, Kind};
use crate::headers;
use crate::metrics;
use crate::policy::Policy;
use crate::tenant::Tenant;
use crate::trace;

/// Attempts per request before its answer is the last error (about 35 s of back-off).
const MAX_ATTEMPTS: u32 = 20;
/// How long to wait for more messages once a chunk has begun.
const GATHER: Duration = Duration::from_millis(5);
/// Longest back-off between attempts while the tier sheds.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Header on every answer: the HTTP status the request was answered with.
pub const STATUS_HEADER: &str = "tiergate-status";
/// Header on every answer: where the request was read (`topic/partition/offset`).
pub const SOURCE_HEADER: &str = "tiergate-source";
/// Header on an answer a micro-batch produced: that batch's id (`x-tiergate-batch-id`).
pub const BATCH_HEADER: &str = "tiergate-batch-id";

/// One answer, ready to produce.
struct Answer {
    status: u16,
    content_type: Option<HeaderValue>,
    /// The micro-batch that produced it (none for a refusal or a cached answer).
    batch_id: Option<String>,
    body: Bytes,
}

/// Runs `source` until `closing` (the chunk in hand is still answered and committed)
/// or `shutdown` (it is dropped uncommitted, to be read again); a failure to create its
/// clients is logged and ends it.
pub async fn run(
    settings: Kafka,
    source: KafkaSource,
    dispatch: Arc<Dispatch>,
    closing: CancellationToken,
    shutdown: CancellationToken,
) {
    let group = group(&source);
    let consumer: Result<StreamConsumer, _> = crate::queue::kafka::client::client(
        &settings,
        &[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "earliest"),
            ("max.poll.interval.ms", "600000"),
        ],
    )
    .create();
    let producer: Result<FutureProducer, _> =
        crate::queue::kafka::client::client(&settings, &[("enable.idempotence", "true"), ("acks", "all")]).create();
    let (consumer, producer) = match (consumer, producer) {
        (Ok(c), Ok(p)) => (Arc::new(c), p),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(source = %source.input, error = %e, "kafka source cannot start");
            return;
        }
    };
    if let Err(e) = consumer.subscribe(&[&source.input]) {
        tracing::error!(source = %source.input, error = %e, "kafka source cannot subscribe");
        return;
    }
    tokio::spawn(report_lag(consumer.clone(), source.input.clone(), shutdown.clone()));
    tracing::info!(source = %source.input, output = %source.output, route = %source.route, %group, "kafka source running");
    let paused = ::metrics::gauge!(metrics::KAFKA_PAUSED, "source" => source.input.clone());
    loop {
        let what = format!("kafka source {}", source.input);
        let Some(first) = crate::queue::kafka::client::next(&consumer, &what, &closing).await else {
            return;
        };
        let mut chunk = vec![first];
        while chunk.len() < source.max_in_flight {
            match tokio::time::timeout(GATHER, consumer.recv()).await {
                Ok(Ok(m)) => chunk.push(m.detach()),
                _ => break,
            }
        }
        let Some(answers) = serve_chunk(&source, &chunk, &dispatch, &consumer, &paused, &shutdown).await else {
            return; // shutting down: the chunk is not committed and will be read again
        };
        if !produce(&producer, &source, &chunk, answers, &shutdown).await {
            return;
        }
        if let Err(e) = consumer.commit(&offsets(&chunk), CommitMode::Async) {
            // The chunk will be read again after a restart or rebalance: at least once.
            tracing::warn!(source = %source.input, error = %e, "kafka source: offsets not committed");
        }
    }
}

/// Serves every message of `chunk`, retrying what is refused for now with the
/// partitions paused; `None` when shutdown comes first.
async fn serve_chunk(
    source: &KafkaSource,
    chunk: &[OwnedMessage],
    dispatch: &Arc<Dispatch>,
    consumer: &StreamConsumer,
    paused: &::metrics::Gauge,
    shutdown: &CancellationToken,
) -> Option<Vec<Answer>> {
    let mut answers: Vec<Option<Answer>> = chunk.iter().map(|_| None).collect();
    let mut pending: Vec<usize> = (0..chunk.len()).collect();
    let mut attempt = 0;
    let mut backoff = Duration::from_millis(50);
    while !pending.is_empty() {
        let mut calls = tokio::task::JoinSet::new();
        for &i in &pending {
            let request = request(source, &chunk[i]);
            let (source, dispatch) = (source.clone(), dispatch.clone());
            calls.spawn(async move { (i, served(&source, &dispatch, request).await) });
        }
        let mut again = Vec::new();
        let mut counted = false;
        while let Some(joined) = calls.join_next().await {
            let Ok((i, result)) = joined else { continue };
            match result {
                // The tier switched off by its flag: wait, for as long as it takes.
                Err(Refused::FlagOff) => again.push(i),
                Err(Refused::Error(e)) if sheds(e.kind) && attempt + 1 < MAX_ATTEMPTS => {
                    counted = true;
                    again.push(i);
                }
                Ok(answer) => answers[i] = Some(answer),
                Err(Refused::Error(e)) => answers[i] = Some(failure(&e)),
            }
        }
        // A task that panicked leaves its slot empty: serve it again.
        let lost: Vec<usize> = pending
            .iter()
            .copied()
            .filter(|&i| answers[i].is_none() && !again.contains(&i))
            .collect();
        again.extend(lost);
        pending = again;
        if pending.is_empty() {
            break;
        }
        attempt += u32::from(counted);
        ::metrics::counter!(metrics::KAFKA_RETRIES, "source" => source.input.clone()).increment(pending.len() as u64);
        let assignment = consumer.assignment().unwrap_or_default();
        let _ = consumer.pause(&assignment);
        paused.set(1.0);
        let waited = tokio::select! {
            _ = tokio::time::sleep(backoff) => true,
            _ = shutdown.cancelled() => false,
        };
        let _ = consumer.resume(&assignment);
        paused.set(0.0);
        if !waited {
            return None;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    Some(
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| failure(&lost())))
            .collect(),
    )
}

/// Why a message was not answered this time.
enum Refused {
    /// The route's micro_batch flag is off: the source pauses (its requests wait,
    /// nothing is lost) until it is on again.
    FlagOff,
    /// The request failed; retried when [`sheds`] says the failure may pass.
    Error(Error),
}

fn lost() -> Error {
    Error::new(Kind::Unavailable, "the request was lost inside the gateway")
}

/// Whether an error means "not now" (the tier sheds, a limit is reached, the backend is
/// away): retried.
fn sheds(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Shed
            | Kind::QueueFull
            | Kind::DeadlineUnmeetable
            | Kind::Overloaded
            | Kind::RateLimited
            | Kind::Unavailable
            | Kind::Deadline
            | Kind::Backend
    )
}

/// The request for one message: POST `source.path` with the payload and its content type.
fn request(source: &KafkaSource, message: &OwnedMessage) -> Result<Request<Bytes>, Error> {
    let mut request = Request::new(Bytes::copy_from_slice(message.payload().unwrap_or_default()));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = source
        .path
        .parse()
        .map_err(|e| Error::new(Kind::BadRequest, format!("kafka source path {:?}: {e}", source.path)))?;
    let content_type = message
        .headers()
        .and_then(|h| h.iter().find(|h| h.key.eq_ignore_ascii_case("content-type")))
        .and_then(|h| h.value)
        .and_then(|v| HeaderValue::from_bytes(v).ok())
        .unwrap_or(HeaderValue::from_static("application/json"));
    request.headers_mut().insert(http::header::CONTENT_TYPE, content_type);
    Ok(request)
}

/// One message through the door pipeline, decided micro-batch with the source's budget.
async fn served(
    source: &KafkaSource,
    dispatch: &Dispatch,
    request: Result<Request<Bytes>, Error>,
) -> Result<Answer, Refused> {
    let request = request.map_err(Refused::Error)?;
    let route = dispatch.policy().route(&source.route).cloned().ok_or_else(|| {
        Refused::Error(Error::new(
            Kind::Unavailable,
            format!("route {} is not in the running policy", source.route),
        ))
    })?;
    if !route.flags.micro_batch {
        return Err(Refused::FlagOff);
    }
    // A precomputing source keeps each answer in the route's cache (while it is on).
    let precompute = source.precompute.and_then(|ttl| {
        let spec = route.cache.as_ref().filter(|_| route.flags.cache)?;
        Some((crate::cache::asked(&route, spec, &request)?, ttl))
    });
    let kept_for = route.clone();
    let mut ids = trace::Ids::read(request.headers());
    let span = ids.span(Door::Kafka);
    let served = async {
        let received = Instant::now();
        let mut admitted = match dispatch.admit(
            Door::Kafka,
            route,
            (request.headers(), &Tenant::anonymous()),
            &ids,
            received,
        ) {
            Ok(admitted) => admitted,
            Err(refused) => return *refused,
        };
        if let Err(e) = admitted.hold(request.body().len()) {
            return admitted.failed(e);
        }
        let decision = Decision {
            tier: Tier::MicroBatch,
            reason: Reason::KafkaSource,
            budget: source.budget,
            source: BudgetSource::KafkaSource,
        };
        let served = admitted.serve_decided(decision, request).await;
        admitted.log_failure(&served);
        served
    }
    .instrument(span)
    .await;
    let reply = served.result.map_err(Refused::Error)?;
    if reply.status().is_server_error() {
        return Err(Refused::Error(Error::new(
            Kind::Backend,
            format!("the backend answered {}", reply.status()),
        )));
    }
    if let Some((asked, ttl)) = precompute {
        dispatch.cache().precompute(&kept_for, asked, &reply, ttl);
    }
    let content_type = reply.headers().get(http::header::CONTENT_TYPE).cloned();
    let batch_id = reply
        .headers()
        .get(headers::BATCH_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok(Answer {
        status: reply.status().as_u16(),
        content_type,
        batch_id,
        body: reply.into_body(),
    })
}

fn failure(e: &Error) -> Answer {
    Answer {
        status: e.kind.status().as_u16(),
        content_type: Some(HeaderValue::from_static("application/json")),
        batch_id: None,
        body: crate::protocol::error_body(&e.message),
    }
}

/// Produces every answer under its request's key and waits for the brokers to have
/// them all (retrying a failed delivery); false when shutdown comes first.
async fn produce(
    producer: &FutureProducer,
    source: &KafkaSource,
    chunk: &[OwnedMessage],
    answers: Vec<Answer>,
    shutdown: &CancellationToken,
) -> bool {
    for (message, answer) in chunk.iter().zip(answers) {
        let status = answer.status.to_string();
        let origin = format!("{}/{}/{}", message.topic(), message.partition(), message.offset());
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: STATUS_HEADER,
                value: Some(status.as_bytes()),
            })
            .insert(Header {
                key: SOURCE_HEADER,
                value: Some(origin.as_bytes()),
            });
        if let Some(content_type) = &answer.content_type {
            headers = headers.insert(Header {
                key: "content-type",
                value: Some(content_type.as_bytes()),
            });
        }
        if let Some(batch) = &answer.batch_id {
            headers = headers.insert(Header {
                key: BATCH_HEADER,
                value: Some(batch.as_bytes()),
            });
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut record = FutureRecord::to(&source.output)
                .payload(&answer.body[..])
                .headers(headers.clone());
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            let sent = tokio::select! {
                sent = producer.send(record, Duration::from_secs(30)) => sent,
                _ = shutdown.cancelled() => return false,
            };
            match sent {
                Ok(_) => {
                    let result = if answer.status < 400 { "answered" } else { "error" };
                    ::metrics::counter!(metrics::KAFKA_MESSAGES, "source" => source.input.clone(), "result" => result)
                        .increment(1);
                    break;
                }
                Err((e, _)) => {
                    tracing::warn!(output = %source.output, error = %e, "kafka source: an answer was not delivered; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => return false,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
    true
}

/// The offsets to commit after `chunk`: one past the last message per partition.
fn offsets(chunk: &[OwnedMessage]) -> TopicPartitionList {
    let mut next = std::collections::BTreeMap::new();
    for m in chunk {
        let at = next
            .entry((m.topic().to_owned(), m.partition()))
            .or_insert(m.offset() + 1);
        *at = (*at).max(m.offset() + 1);
    }
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        // Adding a partition to a fresh list cannot fail.
        let _ = list.add_partition_offset(&topic, partition, Offset::Offset(offset));
    }
    list
}

/// Exports the consumer lag per partition every 5 s: the high watermark minus the
/// group's committed offset.
async fn report_lag(consumer: Arc<StreamConsumer>, topic: String, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let c = consumer.clone();
        let t = topic.clone();
        let lags = tokio::task::spawn_blocking(move || lag(&c, &t))
            .await
            .unwrap_or_default();
        for (partition, lag) in lags {
            ::metrics::gauge!(metrics::KAFKA_LAG, "source" => topic.clone(), "partition" => partition.to_string())
                .set(lag as f64);
        }
    }
}

fn lag(consumer: &StreamConsumer, topic: &str) -> Vec<(i32, i64)> {
    let timeout = Duration::from_secs(2);
    let Ok(assigned) = consumer.assignment() else {
        return Vec::new();
    };
    let Ok(committed) = consumer.committed_offsets(assigned, timeout) else {
        return Vec::new();
    };
    committed
        .elements_for_topic(topic)
        .iter()
        .filter_map(|e| {
            let (low, high) = consumer.fetch_watermarks(topic, e.partition(), timeout).ok()?;
            let done = match e.offset() {
                Offset::Offset(n) => n,
                _ => low,
            };
            Some((e.partition(), (high - done).max(0)))
        })
        .collect()
}

/// The consumer group of `source`.
pub fn group(source: &KafkaSource) -> String {
    source
        .group
        .clone()
        .unwrap_or_else(|| format!("tiergate-{}", source.route))
}

/// Checks that every source can run: its route has a micro-batch pool, the brokers
/// answer, and its topics exist. Blocking (librdkafka's metadata call): run it off the
/// runtime's threads.
pub fn check(settings: &Kafka, policy: &Policy) -> Result<(), String> {
    if settings.sources.is_empty() {
        return Ok(());
    }
    for source in &settings.sources {
        let route = policy
            .route(&source.route)
            .ok_or_else(|| format!("kafka source {}: no route {} in the policy", source.input, source.route))?;
        if route.micro_batch.is_none() {
            return Err(format!(
                "kafka source {}: route {} has no micro_batch pool to serve it",
                source.input, source.route
            ));
        }
        let week = std::time::Duration::from_secs(7 * 24 * 3600);
        match source.precompute {
            Some(ttl) if ttl.is_zero() || ttl > week => {
                return Err(format!(
                    "kafka source {}: precompute must be more than 0s and at most 7d",
                    source.input
                ));
            }
            Some(_) if route.cache.is_none() => {
                return Err(format!(
                    "kafka source {}: precompute needs a cache on route {}: add [routes.{}.cache]",
                    source.input, source.route, source.route
                ));
            }
            _ => {}
        }
        if source.max_in_flight == 0 {
            return Err(format!(
                "kafka source {}: max_in_flight must be at least 1",
                source.input
            ));
        }
    }
    for source in &settings.sources {
        let what = format!("kafka source {}", source.input);
        crate::queue::kafka::client::partitions(settings, &[source.input.clone(), source.output.clone()], &what)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;

    fn message(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, partition, offset, None)
    }

    #[test]
    fn a_chunk_commits_one_past_its_last_message_per_partition() {
        let chunk = [
            message(0, 7),
            message(1, 3),
            message(0, 9),
            message(0, 8),
            message(1, 2),
        ];
        let list = offsets(&chunk);
        let committed: Vec<(i32, Offset)> = list
            .elements_for_topic("t")
            .iter()
            .map(|e| (e.partition(), e.offset()))
            .collect();
        assert_eq!(committed, [(0, Offset::Offset(10)), (1, Offset::Offset(4))]);
    }

    #[test]
    fn only_not_now_errors_are_retried() {
        assert!(sheds(Kind::QueueFull) && sheds(Kind::DeadlineUnmeetable) && sheds(Kind::Backend));
        assert!(!sheds(Kind::BadRequest) && !sheds(Kind::NotFound) && !sheds(Kind::TooLarge));
    }
}
