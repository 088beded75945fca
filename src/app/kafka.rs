//! Kafka at start: the sources (checked, then started on the batch threads) and the
//! offline queue on Kafka; without the `kafka` feature, a clear refusal of either.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::threads::BatchThreads;
use super::StartError;
use crate::config::Config;
use crate::front::pipeline::dispatch::Dispatch;
use crate::policy::Policy;
use crate::queue::Queue;

/// Why sources are refused in a build without the `kafka` feature.
#[cfg(not(feature = "kafka"))]
const NO_KAFKA: &str = "kafka.sources are set, but this build has no Kafka support (build with --features kafka)";

/// Checks the Kafka sources (brokers reachable, topics there, routes with a batch
/// pool) before anything is bound; refuses sources in a build without Kafka support.
pub(super) async fn check_sources(config: &Config, policy: Policy) -> Result<Policy, StartError> {
    if config.kafka.sources.is_empty() {
        return Ok(policy);
    }
    #[cfg(feature = "kafka")]
    {
        let settings = config.kafka.clone();
        tokio::task::spawn_blocking(move || crate::front::kafka_source::check(&settings, &policy).map(|()| policy))
            .await
            .map_err(|e| StartError::Settings(e.to_string()))?
            .map_err(StartError::Settings)
    }
    #[cfg(not(feature = "kafka"))]
    {
        let _ = policy;
        Err(StartError::Settings(NO_KAFKA.into()))
    }
}

/// Starts the Kafka sources on the batch threads: they stop reading when `closing`
/// fires and drop what they hold unanswered (uncommitted, so it is read again) when
/// `shutdown` does.
#[cfg(feature = "kafka")]
pub(super) fn start_sources(
    config: &Config,
    dispatch: &Arc<Dispatch>,
    threads: &BatchThreads,
    closing: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), StartError> {
    for source in &config.kafka.sources {
        threads.handle().spawn(crate::front::kafka_source::run(
            config.kafka.clone(),
            source.clone(),
            dispatch.clone(),
            closing.clone(),
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// Without the `kafka` feature there are no sources to start.
#[cfg(not(feature = "kafka"))]
pub(super) fn start_sources(
    config: &Config,
    _: &Arc<Dispatch>,
    _: &BatchThreads,
    _: &CancellationToken,
    _: &CancellationToken,
) -> Result<(), StartError> {
    match config.kafka.sources.is_empty() {
        true => Ok(()),
        false => Err(StartError::Settings(NO_KAFKA.into())),
    }
}

/// Starts the Kafka queue (`offline.queue = "kafka"`): brokers and topics checked, the
/// state topic read, the consumer group joined.
#[cfg(feature = "kafka")]
pub(super) async fn open_kafka(
    config: &Config,
    wake: &Arc<Notify>,
    shutdown: &CancellationToken,
) -> Result<Queue, StartError> {
    let max_message = config.limits.max_body_bytes.max(config.limits.max_response_bytes);
    crate::queue::kafka::KafkaQueue::start(
        &config.kafka,
        &config.data_dir,
        super::store_limits(config),
        max_message,
        wake.clone(),
        shutdown.clone(),
    )
    .await
    .map(Queue::Kafka)
    .map_err(StartError::Settings)
}

/// Without the `kafka` feature there is no Kafka queue.
#[cfg(not(feature = "kafka"))]
pub(super) async fn open_kafka(_: &Config, _: &Arc<Notify>, _: &CancellationToken) -> Result<Queue, StartError> {
    Err(StartError::Settings(
        "offline.queue = \"kafka\", but this build has no Kafka support (build with --features kafka)".into(),
    ))
}
