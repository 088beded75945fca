//! Several replicas' ledgers as one: with the offline queue on Kafka, each replica
//! publishes the periods it wrote (each minute's and hour's rows as its store has them,
//! replacing what it published for that period before, and the periods it rolled up or
//! let go) to the queue's state topic, and every replica reads all of them back; a
//! usage table read from any replica is the fleet's, and a replica started again reads
//! its own share back with the rest.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::store::{Changed, Row};
use super::Ledger;

/// A future a [`Fleet`] answers with.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// Where replicas share their ledgers.
pub trait Fleet: Send + Sync + std::fmt::Debug {
    /// Publishes this replica's `rows` (every row of each of their periods: what it
    /// published for those periods before is replaced) and the periods (span, start)
    /// it no longer keeps (`gone`); resolves once every replica can read them.
    fn publish(&self, rows: Vec<Row>, gone: Vec<(i64, i64)>) -> Answer<'_, ()>;

    /// Every replica's rows whose period ends after `since` (unix seconds), summed
    /// over the replicas.
    fn rows(&self, since: i64) -> Answer<'_, Vec<Row>>;

    /// The other replicas' use of each tenant on each route since the start of the
    /// month, and of it since the start of the day (`periods`: day, month; unix
    /// seconds): (tenant, route, use).
    fn others(&self, periods: (i64, i64)) -> Answer<'_, Vec<(String, String, super::quota::Use)>>;
}

/// The periods this replica wrote and has not published yet.
#[derive(Debug, Default)]
pub struct Unpublished {
    written: BTreeSet<(i64, i64)>,
    gone: BTreeSet<(i64, i64)>,
}

impl Unpublished {
    /// Adds what a write `changed`.
    pub(super) fn note(&mut self, changed: Changed) {
        for period in &changed.gone {
            self.written.remove(period);
        }
        self.written.extend(changed.written);
        self.gone.extend(changed.gone);
    }
}

/// Publishes what `ledger` wrote since it last did to its fleet, if it has one; kept
/// to try again with the next write when publishing fails (the store still has it).
pub(super) async fn share(ledger: &Arc<Ledger>) {
    let (Some(fleet), Some(_)) = (&ledger.fleet, &ledger.store) else {
        return;
    };
    let taken = std::mem::take(&mut *ledger.unpublished.lock().unwrap_or_else(|e| e.into_inner()));
    if taken.written.is_empty() && taken.gone.is_empty() {
        return;
    }
    let reading = ledger.clone();
    let periods = taken.written.clone();
    let rows = tokio::task::spawn_blocking(move || match &reading.store {
        Some(store) => store.periods(&periods),
        None => Ok(Vec::new()),
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|rows| rows);
    let published = match rows {
        Ok(rows) => fleet.publish(rows, taken.gone.iter().copied().collect()).await,
        Err(e) => Err(e),
    };
    if published.is_ok() {
        let now = super::unix(std::time::SystemTime::now());
        let periods = (super::quota::day_start(now), super::quota::month_start(now));
        match fleet.others(periods).await {
            Ok(others) => ledger.quotas.set_others(now, others),
            Err(e) => {
                tracing::debug!(error = %e, "the other replicas' use could not be read; read again with the next write")
            }
        }
    }
    if let Err(e) = published {
        tracing::warn!(error = %e, "the usage ledger could not be shared with the other replicas; tried again with the next write");
        let mut unpublished = ledger.unpublished.lock().unwrap_or_else(|e| e.into_inner());
        unpublished.note(Changed {
            written: taken.written,
            gone: taken.gone,
        });
    }
}
