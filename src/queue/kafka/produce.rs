//! Producing to the topics: records enqueued at once, then waited for in order; a
//! write also waits until this replica's view has applied its state records.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureRecord};

use super::records::{self, JobMeta, Record};
use super::KafkaQueue;
use crate::queue::StoreError;

/// Where an outgoing record goes.
pub(super) enum Topic {
    Jobs,
    States,
}

/// A record to produce.
pub(super) struct Out {
    pub(super) topic: Topic,
    pub(super) key: String,
    pub(super) partition: Option<i32>,
    pub(super) headers: OwnedHeaders,
    pub(super) value: Bytes,
}

impl Out {
    pub(super) fn state(record: &Record, key: &str, value: Bytes) -> Out {
        Out {
            topic: Topic::States,
            key: key.to_owned(),
            partition: None,
            headers: records::headers(record),
            value,
        }
    }

    pub(super) fn job(meta: &JobMeta, body: Bytes) -> Out {
        Out {
            topic: Topic::Jobs,
            key: meta.id.clone(),
            partition: None,
            headers: records::headers(meta),
            value: body,
        }
    }
}

impl KafkaQueue {
    /// Produces `outs` and waits until the brokers have all of them; their (partition,
    /// offset) in order.
    pub(super) async fn deliver(&self, outs: Vec<Out>) -> Result<Vec<(i32, i64)>, StoreError> {
        let mut flying: VecDeque<DeliveryFuture> = VecDeque::new();
        let mut done = Vec::with_capacity(outs.len());
        for out in &outs {
            loop {
                match self.send(out) {
                    Ok(future) => {
                        flying.push_back(future);
                        break;
                    }
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => match flying.pop_front() {
                        Some(oldest) => done.push(delivered(oldest.await)?),
                        // The producer's queue is full of other callers' records.
                        None => tokio::time::sleep(Duration::from_millis(5)).await,
                    },
                    Err(e) => return Err(refused(e)),
                }
            }
        }
        for future in flying {
            done.push(delivered(future.await)?);
        }
        Ok(done)
    }

    pub(super) fn send(&self, out: &Out) -> Result<DeliveryFuture, KafkaError> {
        let topic = match out.topic {
            Topic::Jobs => &self.inner.settings.jobs,
            Topic::States => &self.inner.settings.states,
        };
        let mut record = FutureRecord::to(topic)
            .key(&out.key)
            .payload(&out.value[..])
            .headers(out.headers.clone());
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        self.inner.producer.send_result(record).map_err(|(e, _)| e)
    }

    /// Produces `outs`, waits for the brokers, then for this replica's view to apply
    /// the state records among them (so this replica reads its own writes).
    pub(super) async fn write(&self, outs: Vec<Out>) -> Result<(), StoreError> {
        let states: Vec<bool> = outs.iter().map(|o| matches!(o.topic, Topic::States)).collect();
        let at = self.deliver(outs).await?;
        let mut last: HashMap<i32, i64> = HashMap::new();
        for ((partition, offset), state) in at.into_iter().zip(states) {
            if state {
                let o = last.entry(partition).or_insert(offset);
                *o = (*o).max(offset);
            }
        }
        for (partition, offset) in last {
            self.inner.view.reached(partition, offset).await?;
        }
        Ok(())
    }
}

/// The delivery of one record, or why the brokers did not take it.
fn delivered<E>(result: Result<OwnedDeliveryResult, E>) -> Result<(i32, i64), StoreError> {
    match result {
        Ok(Ok(d)) => Ok((d.partition, d.offset)),
        Ok(Err((e, _))) => Err(refused(e)),
        Err(_) => Err(StoreError::Closed),
    }
}

fn refused(e: KafkaError) -> StoreError {
    StoreError::Io(format!("the Kafka brokers did not take the record: {e}"))
}
