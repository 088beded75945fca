//! One Kafka source: read a chunk of requests (up to `max_in_flight`), serve them all at
//! once through the route's micro-batch tier (so they share batches), produce every
//! answer to the output topic under its request's key, wait until the brokers have all
//! of them, then commit the chunk's offsets. A crash before the commit replays the
//! chunk: at least once, and keyed, so a consumer of the output keeps the last answer.
//!
//! Back-pressure: requests the tier sheds (queue full, budget it cannot meet, pool at
//! its limit) are retried with exponential back-off while the source's partitions are
//! paused, so nothing more is read until the batch pool takes them. Nothing is buffered
//! beyond the chunk.

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
use tower::ServiceExt;

use crate::config::{Kafka, KafkaSource};
use crate::decision::{BudgetSource, Decision, Reason, Tier};
use crate::error::{Error, Kind};
use crate::metrics;
use crate::policy::Store;
use crate::tiers::Call;
use crate::tiers::MicroBatch;

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

/// One answer, ready to produce.
struct Answer {
    status: u16,
    content_type: Option<HeaderValue>,
    body: Bytes,
}

/// Runs `source` until `closing` (the chunk in hand is still answered and committed)
/// or `shutdown` (it is dropped uncommitted, to be read again); a failure to create its
/// clients is logged and ends it.
pub async fn run(
    settings: Kafka,
    source: KafkaSource,
    policy: Arc<Store>,
    micro: MicroBatch,
    closing: CancellationToken,
    shutdown: CancellationToken,
) {
    let group = super::group(&source);
    let consumer: Result<StreamConsumer, _> = super::client(
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
        super::client(&settings, &[("enable.idempotence", "true"), ("acks", "all")]).create();
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
        let Some(first) = super::next(&consumer, &what, &closing).await else {
            return;
        };
        let mut chunk = vec![first];
        while chunk.len() < source.max_in_flight {
            match tokio::time::timeout(GATHER, consumer.recv()).await {
                Ok(Ok(m)) => chunk.push(m.detach()),
                _ => break,
            }
        }
        let Some(answers) = serve(&source, &chunk, &policy, &micro, &consumer, &paused, &shutdown).await else {
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

/// Serves every message of `chunk`, retrying what the tier sheds with the partitions
/// paused; `None` when shutdown comes first.
async fn serve(
    source: &KafkaSource,
    chunk: &[OwnedMessage],
    policy: &Arc<Store>,
    micro: &MicroBatch,
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
            let call = call(source, &chunk[i], policy);
            let micro = micro.clone();
            calls.spawn(async move { (i, served(call, micro).await) });
        }
        let mut again = Vec::new();
        let mut counted = false;
        while let Some(joined) = calls.join_next().await {
            let Ok((i, result)) = joined else { continue };
            match result {
                // The tier switched off by its flag: wait, for as long as it takes.
                Err(e) if e.kind == Kind::TierUnavailable => again.push(i),
                Err(e) if sheds(e.kind) && attempt + 1 < MAX_ATTEMPTS => {
                    counted = true;
                    again.push(i);
                }
                Ok(answer) => answers[i] = Some(answer),
                Err(e) => answers[i] = Some(failure(&e)),
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

fn lost() -> Error {
    Error::new(Kind::Unavailable, "the request was lost inside the gateway")
}

/// Whether an error means "not now" (the tier sheds or the backend is away): retried.
fn sheds(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Shed
            | Kind::QueueFull
            | Kind::DeadlineUnmeetable
            | Kind::Overloaded
            | Kind::Unavailable
            | Kind::Deadline
            | Kind::Backend
    )
}

/// The micro-batch call for one message: POST `source.path` with the payload.
fn call(source: &KafkaSource, message: &OwnedMessage, policy: &Arc<Store>) -> Result<Call, Error> {
    let route = policy.load().route(&source.route).cloned().ok_or_else(|| {
        Error::new(
            Kind::Unavailable,
            format!("route {} is not in the running policy", source.route),
        )
    })?;
    if !route.flags.micro_batch {
        // Switching the flag off pauses the source (its requests wait, nothing is lost).
        return Err(Error::new(
            Kind::TierUnavailable,
            format!("route {}: the micro_batch flag is off", route.name),
        ));
    }
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
    let ids = crate::trace::Ids::read(request.headers());
    request.extensions_mut().insert(ids);
    Ok(Call {
        route,
        decision: Decision {
            tier: Tier::MicroBatch,
            reason: Reason::BudgetMicroBatch,
            budget: source.budget,
            source: BudgetSource::RouteDefault,
        },
        deadline: Instant::now() + source.budget,
        request,
    })
}

async fn served(call: Result<Call, Error>, micro: MicroBatch) -> Result<Answer, Error> {
    let reply = micro.oneshot(call?).await?;
    if reply.status().is_server_error() {
        return Err(Error::new(
            Kind::Backend,
            format!("the backend answered {}", reply.status()),
        ));
    }
    let content_type = reply.headers().get(http::header::CONTENT_TYPE).cloned();
    Ok(Answer {
        status: reply.status().as_u16(),
        content_type,
        body: reply.into_body(),
    })
}

fn failure(e: &Error) -> Answer {
    Answer {
        status: e.kind.status().as_u16(),
        content_type: Some(HeaderValue::from_static("application/json")),
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
