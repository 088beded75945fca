//! The Batch API on the Kafka queue: files and batches on the state topic, read from
//! the view.

use bytes::Bytes;
use serde_json::Value;

use super::produce::Out;
use super::records::{self, FileChunk, JobMeta, Record};
use super::{keyed_id, KafkaQueue};
use crate::queue::batches::{BatchRow, FileInfo, NewBatch};
use crate::queue::{idempotency_scope, State, StoreError, Submitted};

impl KafkaQueue {
    /// Stores `tenant`'s uploaded file: its chunks on one partition of the state topic,
    /// in order.
    pub async fn add_file(
        &self,
        tenant: &str,
        purpose: String,
        filename: String,
        content: Bytes,
    ) -> Result<FileInfo, StoreError> {
        let id = crate::queue::new_id("file");
        let now = crate::queue::now_ms();
        let partition = (rand::random::<u32>() % self.inner.state_partitions.max(1) as u32) as i32;
        let chunks: Vec<Bytes> = match content.is_empty() {
            true => vec![Bytes::new()],
            false => (0..content.len())
                .step_by(records::FILE_CHUNK)
                .map(|at| content.slice(at..(at + records::FILE_CHUNK).min(content.len())))
                .collect(),
        };
        let outs = chunks
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                let chunk = FileChunk {
                    id: id.clone(),
                    purpose: purpose.clone(),
                    filename: filename.clone(),
                    bytes: content.len() as u64,
                    created_at: now,
                    chunk: u32::try_from(i).unwrap_or(u32::MAX),
                    tenant: tenant.to_owned(),
                };
                let mut out = Out::state(&Record::File(chunk), &format!("{id}#{i}"), value);
                out.partition = Some(partition);
                out
            })
            .collect();
        self.write(outs).await?;
        Ok(FileInfo {
            id,
            purpose,
            filename,
            bytes: content.len() as u64,
            created_at: now,
        })
    }

    /// A file's description, when it is `tenant`'s.
    pub async fn file(&self, id: &str, tenant: &str) -> Result<Option<FileInfo>, StoreError> {
        self.fresh(|| self.inner.view.store.file(id, tenant)).await
    }

    /// A file's content, when it is `tenant`'s.
    pub async fn content(&self, id: &str, tenant: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.fresh(|| self.inner.view.store.content(id, tenant)).await
    }

    /// `len` bytes of a file's content from `offset`, when it is `tenant`'s and that long.
    pub async fn content_range(
        &self,
        id: &str,
        tenant: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.fresh(|| self.inner.view.store.content_range(id, tenant, offset, len))
            .await
    }

    /// Deletes `tenant`'s file `id`: a deletion under each of its chunks' keys (on every
    /// state partition), so every replica's view drops it and compaction drops its
    /// content; whether there was one.
    pub async fn delete_file(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        let Some(file) = self.file(id, tenant).await? else {
            return Ok(false);
        };
        let chunks = usize::try_from(file.bytes)
            .unwrap_or(usize::MAX)
            .div_ceil(records::FILE_CHUNK)
            .max(1);
        let deleted = Record::FileDeleted(records::FileDeleted {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
        });
        // A file's chunks went to one partition, not recorded: the deletion goes to each.
        let partitions = self.inner.state_partitions.max(1);
        let outs = (0..partitions)
            .flat_map(|partition| (0..chunks).map(move |i| (partition, i)))
            .map(|(partition, i)| {
                let mut out = Out::state(&deleted, &format!("{id}#{i}"), Bytes::new());
                out.partition = Some(partition);
                out
            })
            .collect();
        self.write(outs).await?;
        self.inner.view.catch_up().await?;
        Ok(true)
    }

    /// Creates a batch: its row on the state topic, and each of its jobs like a submission.
    pub async fn create_batch(&self, batch: NewBatch) -> Result<Submitted, StoreError> {
        let id = match &batch.idempotency_key {
            Some(key) => keyed_id("batch", idempotency_scope(key)),
            None => crate::queue::new_id("batch"),
        };
        if let Some(key) = &batch.idempotency_key {
            if self.batch(&id, &batch.tenant).await?.is_some() {
                let stored = self
                    .inner
                    .view
                    .batch_row(id.clone())
                    .await?
                    .and_then(|r| r.idempotency_key);
                return Ok(Submitted::earlier(id, stored.as_deref(), key));
            }
        }
        self.check_room(batch.jobs.len())?;
        let now = crate::queue::now_ms();
        let row = BatchRow::new(id.clone(), &batch, now);
        let mut outs = vec![Out::state(&Record::Batch(row), &id, Bytes::new())];
        if batch.errors.is_empty() {
            for (custom_id, line, job) in batch.jobs {
                let job_id = crate::queue::new_id("job");
                let meta = JobMeta::new(job_id.clone(), &job, now, Some((id.clone(), custom_id, line)));
                outs.push(Out::state(
                    &Record::Job(self.state(meta.clone(), State::Queued, 0)),
                    &job_id,
                    Bytes::new(),
                ));
                outs.push(Out::job(&meta, job.body));
            }
        }
        self.write(outs).await?;
        Ok(Submitted::new(id))
    }

    /// The batch object, when it is `tenant`'s.
    pub async fn batch(&self, id: &str, tenant: &str) -> Result<Option<Value>, StoreError> {
        self.fresh(|| self.inner.view.store.batch(id, tenant)).await
    }

    /// Starts cancelling `tenant`'s batch `id`: the batch marked cancelling, and each of
    /// its queued jobs cancelled, on the state topic.
    pub async fn cancel_batch(&self, id: &str, tenant: &str) -> Result<Option<Value>, StoreError> {
        let Some(batch) = self.batch(id, tenant).await? else {
            return Ok(None);
        };
        let open = batch
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| matches!(s, "validating" | "in_progress"));
        let Some(mut row) = self.inner.view.batch_row(id.to_owned()).await?.filter(|_| open) else {
            return Ok(Some(batch));
        };
        let now = crate::queue::now_ms();
        row.cancelling_at = Some(now);
        let mut outs = vec![Out::state(&Record::Batch(row), id, Bytes::new())];
        for (meta, attempts) in self.inner.view.queued_in_batch(id.to_owned()).await? {
            let key = meta.id.clone();
            let mut record = self.state(meta, State::Cancelled, attempts);
            record.finished_at = Some(now);
            outs.push(Out::state(&Record::Job(record), &key, Bytes::new()));
        }
        self.write(outs).await?;
        self.inner.view.store.batch(id, tenant).await
    }
}
