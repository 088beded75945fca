//! The offline queue the gateway was started with: the embedded store, or (with the
//! `kafka` feature) the Kafka queue. One type for the offline tier, its workers, the
//! jobs endpoint and the Batch API; each call goes to the backend in use.

use bytes::Bytes;
use serde_json::Value;

use super::batches::{FileInfo, FileQuery, NewBatch};
use super::{Embedded, Finish, Job, JobId, JobStore, NewJob, State, StoreError, Submitted};

/// The offline queue; cheap to clone.
#[derive(Debug, Clone)]
pub enum Queue {
    /// One SQLite file: one gateway.
    Embedded(Embedded),
    /// Kafka topics shared by several replicas.
    #[cfg(feature = "kafka")]
    Kafka(super::kafka::KafkaQueue),
}

impl Queue {
    /// The store that answers reads: the embedded store, or the Kafka queue's local view.
    fn local(&self) -> &Embedded {
        match self {
            Queue::Embedded(store) => store,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.view(),
        }
    }

    /// Why the queue cannot commit, while its last commit failed (the Kafka queue: its
    /// local view of the state topic).
    pub fn failing(&self) -> Option<String> {
        self.local().failing()
    }

    /// Jobs by state (for metrics). With Kafka, every replica counts every job.
    pub async fn counts(&self) -> Result<Vec<(State, u64)>, StoreError> {
        self.local().counts().await
    }

    /// When the oldest queued job was submitted, if any is queued.
    pub async fn oldest_queued(&self) -> Result<Option<i64>, StoreError> {
        self.local().oldest_queued().await
    }

    /// Deletes finished jobs past `retention_ms` and finalizes finished batches; the
    /// embedded store also expires queued jobs whose window passed (the Kafka queue
    /// records expiry on its state topic when a job's turn comes).
    pub async fn sweep(&self, retention_ms: i64) -> Result<(u64, u64), StoreError> {
        let expire = matches!(self, Queue::Embedded(_));
        self.local().sweep(retention_ms, expire).await
    }

    /// Finalizes the batches whose jobs are all done.
    pub async fn finalize(&self) -> Result<usize, StoreError> {
        self.local().finalize().await
    }

    /// Stores `tenant`'s uploaded file.
    pub async fn add_file(
        &self,
        tenant: &str,
        purpose: String,
        filename: String,
        content: Bytes,
    ) -> Result<FileInfo, StoreError> {
        match self {
            Queue::Embedded(store) => store.add_file(tenant, purpose, filename, content).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.add_file(tenant, purpose, filename, content).await,
        }
    }

    /// A file's description, when it is `tenant`'s.
    pub async fn file(&self, id: &str, tenant: &str) -> Result<Option<FileInfo>, StoreError> {
        match self {
            Queue::Embedded(store) => store.file(id, tenant).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.file(id, tenant).await,
        }
    }

    /// A file's content, when it is `tenant`'s.
    pub async fn content(&self, id: &str, tenant: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Queue::Embedded(store) => store.content(id, tenant).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.content(id, tenant).await,
        }
    }

    /// `len` bytes of a file's content from `offset`, when it is `tenant`'s and that long.
    pub async fn content_range(
        &self,
        id: &str,
        tenant: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Queue::Embedded(store) => store.content_range(id, tenant, offset, len).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.content_range(id, tenant, offset, len).await,
        }
    }

    /// `tenant`'s files as `query` asks, and whether more follow.
    pub async fn files(&self, tenant: &str, query: FileQuery) -> Result<(Vec<FileInfo>, bool), StoreError> {
        self.local().files(tenant, query).await
    }

    /// Deletes `tenant`'s file `id`; whether there was one.
    pub async fn delete_file(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        match self {
            Queue::Embedded(store) => store.delete_file(id, tenant).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.delete_file(id, tenant).await,
        }
    }

    /// Creates a batch and its jobs.
    pub async fn create_batch(&self, batch: NewBatch) -> Result<Submitted, StoreError> {
        match self {
            Queue::Embedded(store) => store.create_batch(batch).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.create_batch(batch).await,
        }
    }

    /// The batch object, when it is `tenant`'s.
    pub async fn batch(&self, id: &str, tenant: &str) -> Result<Option<Value>, StoreError> {
        match self {
            Queue::Embedded(store) => store.batch(id, tenant).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.batch(id, tenant).await,
        }
    }

    /// `tenant`'s batches, newest first.
    pub async fn batches(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<Value>, bool), StoreError> {
        self.local().batches(tenant, after, limit).await
    }

    /// Starts cancelling `tenant`'s batch.
    pub async fn cancel_batch(&self, id: &str, tenant: &str) -> Result<Option<Value>, StoreError> {
        match self {
            Queue::Embedded(store) => store.cancel_batch(id, tenant).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.cancel_batch(id, tenant).await,
        }
    }
}

impl JobStore for Queue {
    async fn submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>, StoreError> {
        match self {
            Queue::Embedded(store) => store.submit(jobs).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.submit(jobs).await,
        }
    }

    async fn lease(&self, max: usize) -> Result<Vec<Job>, StoreError> {
        match self {
            Queue::Embedded(store) => store.lease(max).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => {
                let mut jobs = Vec::new();
                for route in queue.runnable_routes() {
                    if jobs.len() >= max {
                        break;
                    }
                    jobs.extend(queue.lease_route(&route, max - jobs.len()).await?);
                }
                Ok(jobs)
            }
        }
    }

    async fn lease_route(&self, route: &str, max: usize) -> Result<Vec<Job>, StoreError> {
        match self {
            Queue::Embedded(store) => store.lease_route(route, max).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.lease_route(route, max).await,
        }
    }

    async fn runnable_routes(&self) -> Result<Vec<String>, StoreError> {
        match self {
            Queue::Embedded(store) => store.runnable_routes().await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => Ok(queue.runnable_routes()),
        }
    }

    async fn finish(&self, id: &str, attempt: u32, finish: Finish) -> Result<bool, StoreError> {
        let flags = self.finish_all(vec![(id.to_owned(), attempt, finish)]).await?;
        Ok(flags.first().copied().unwrap_or(false))
    }

    async fn finish_all(&self, ends: Vec<(JobId, u32, Finish)>) -> Result<Vec<bool>, StoreError> {
        match self {
            Queue::Embedded(store) => store.finish_all(ends).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.finish_all(ends).await,
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Job>, StoreError> {
        match self {
            Queue::Embedded(store) => store.get(id).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.get(id).await,
        }
    }

    async fn cancel(&self, id: &str) -> Result<Option<State>, StoreError> {
        match self {
            Queue::Embedded(store) => store.cancel(id).await,
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.cancel(id).await,
        }
    }
}
