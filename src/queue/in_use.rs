//! The offline queue the gateway was started with: the embedded store, or (with the
//! `kafka` feature) the Kafka queue. One type for the offline tier, its workers, the
//! jobs endpoint and the Batch API; each call goes to the queue in use.

use bytes::Bytes;

use super::batches::{Batch, FileInfo, FileQuery, NewBatch};
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

/// Writes [`JobStore`]'s methods for [`Queue`], each once: the call goes to the queue in use.
macro_rules! to_the_queue_in_use {
    ($( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ok:ty; )*) => {$(
        async fn $name(&self $(, $arg: $ty)*) -> Result<$ok, StoreError> {
            match self {
                Queue::Embedded(store) => store.$name($($arg),*).await,
                #[cfg(feature = "kafka")]
                Queue::Kafka(queue) => queue.$name($($arg),*).await,
            }
        }
    )*};
}

impl JobStore for Queue {
    to_the_queue_in_use! {
        fn submit(&self, jobs: Vec<NewJob>) -> Vec<Submitted>;
        fn lease(&self, max: usize) -> Vec<Job>;
        fn lease_route(&self, route: &str, max: usize) -> Vec<Job>;
        fn runnable_routes(&self) -> Vec<String>;
        fn finish_all(&self, ends: Vec<(JobId, u32, Finish)>) -> Vec<bool>;
        fn get(&self, id: &str) -> Option<Job>;
        fn cancel(&self, id: &str) -> Option<State>;
        fn add_file(&self, tenant: &str, purpose: String, filename: String, content: Bytes) -> FileInfo;
        fn file(&self, id: &str, tenant: &str) -> Option<FileInfo>;
        fn content(&self, id: &str, tenant: &str) -> Option<Vec<u8>>;
        fn content_range(&self, id: &str, tenant: &str, offset: u64, len: u64) -> Option<Vec<u8>>;
        fn files(&self, tenant: &str, query: FileQuery) -> (Vec<FileInfo>, bool);
        fn delete_file(&self, id: &str, tenant: &str) -> bool;
        fn create_batch(&self, batch: NewBatch) -> Submitted;
        fn batch(&self, id: &str, tenant: &str) -> Option<Batch>;
        fn batches(&self, tenant: &str, after: Option<String>, limit: usize) -> (Vec<Batch>, bool);
        fn cancel_batch(&self, id: &str, tenant: &str) -> Option<Batch>;
        fn all_batches(&self, after: Option<String>, limit: usize) -> (Vec<Batch>, bool);
        fn batch_owner(&self, id: &str) -> Option<String>;
        fn counts(&self) -> Vec<(State, u64)>;
        fn oldest_queued(&self) -> Option<i64>;
        fn sweep(&self, retention_ms: i64) -> (u64, u64);
        fn finalize(&self) -> usize;
    }

    fn failing(&self) -> Option<String> {
        match self {
            Queue::Embedded(store) => store.failing(),
            #[cfg(feature = "kafka")]
            Queue::Kafka(queue) => queue.failing(),
        }
    }
}
