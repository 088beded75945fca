//! Kafka as a source and sink (the `kafka` feature): inference requests read from a
//! topic, served through a route's micro-batch tier, and answered to another topic
//! under the request's key.
//!
//! Beside the request path: a source is one more caller of the micro-batch tier, next
//! to the doors. [`check`] runs at start and refuses to start with a clear error when
//! the brokers cannot be reached, a topic is missing, or a source names a route
//! without a batch pool. [`source::run`] is the loop; its delivery is at least once
//! (offsets are committed only after the answers are acknowledged by the brokers), and
//! answers are keyed like the requests, so a replay overwrites rather than adds.

pub mod source;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;

use crate::config::{Kafka, KafkaSource};
use crate::policy::Policy;

/// How long start waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// A client configuration: the brokers, then `defaults`, then the operator's
/// `kafka.client` settings, which win.
pub fn client(settings: &Kafka, defaults: &[(&str, &str)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    for (key, value) in defaults {
        config.set(*key, *value);
    }
    for (key, value) in &settings.client {
        config.set(key, value);
    }
    config
}

/// The next message `consumer` reads, or `None` once `shutdown` comes. A read error
/// is logged (with `what` was being read) and the read tried again a second later.
pub async fn next(consumer: &StreamConsumer, what: &str, shutdown: &CancellationToken) -> Option<OwnedMessage> {
    loop {
        let read = tokio::select! {
            m = consumer.recv() => m,
            _ = shutdown.cancelled() => return None,
        };
        match read {
            Ok(m) => return Some(m.detach()),
            Err(e) => {
                tracing::warn!(error = %e, "kafka: cannot read {what}; trying again in a second");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => return None,
                }
            }
        }
    }
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
        if source.max_in_flight == 0 {
            return Err(format!(
                "kafka source {}: max_in_flight must be at least 1",
                source.input
            ));
        }
    }
    for source in &settings.sources {
        let what = format!("kafka source {}", source.input);
        partitions(settings, &[source.input.clone(), source.output.clone()], &what)?;
    }
    Ok(())
}

/// The partition count of each of `topics`, refusing (for `what`) when the brokers do
/// not answer within 5 s or a topic does not exist. Blocking.
pub fn partitions(settings: &Kafka, topics: &[String], what: &str) -> Result<Vec<i32>, String> {
    let consumer: BaseConsumer = client(settings, &[])
        .create()
        .map_err(|e| format!("kafka: cannot create a client for {}: {e}", settings.brokers))?;
    let metadata = consumer.fetch_metadata(None, METADATA_TIMEOUT).map_err(|e| {
        format!(
            "kafka: cannot reach the brokers at {} within {METADATA_TIMEOUT:?}: {e} (kafka.brokers)",
            settings.brokers
        )
    })?;
    topics
        .iter()
        .map(|topic| {
            metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                .map(|t| i32::try_from(t.partitions().len()).unwrap_or(i32::MAX))
                .ok_or_else(|| {
                    format!(
                        "{what}: topic {topic} does not exist on {} (create it before starting)",
                        settings.brokers
                    )
                })
        })
        .collect()
}
