//! Kafka clients as every part of tiergate makes them (the offline queue, the Kafka
//! sources): the brokers and the operator's settings, reading with retries, and the
//! topics' metadata at start.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;

use crate::config::Kafka;

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
