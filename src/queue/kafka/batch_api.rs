//! The Batch API on the Kafka queue: files and batches written to the state topic (the
//! queue's [`JobStore`] reads them back from the view).

use bytes::Bytes;

use super::produce::Out;
use super::records::{self, FileChunk, JobMeta, Record};
use super::{keyed_id, KafkaQueue};
use crate::queue::batches::{Batch, BatchRow, FileInfo, NewBatch};
use crate::queue::{idempotency_scope, JobStore, State, StoreError, Submitted};

/// Stores `tenant`'s uploaded file: its chunks on one partition of the state topic, in
/// order.
pub(super) async fn add_file(
    queue: &KafkaQueue,
    tenant: &str,
    purpose: String,
    filename: String,
    content: Bytes,
) -> Result<FileInfo, StoreError> {
    let id = crate::queue::new_id("file");
    let now = crate::queue::now_ms();
    let partition = (rand::random::<u32>() % queue.inner.state_partitions.max(1) as u32) as i32;
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
    queue.write(outs).await?;
    Ok(FileInfo {
        id,
        purpose,
        filename,
        bytes: content.len() as u64,
        created_at: now,
    })
}

/// Deletes `tenant`'s file `id`: a deletion under each of its chunks' keys (on every
/// state partition), so every replica's view drops it and compaction drops its content;
/// whether there was one.
pub(super) async fn delete_file(queue: &KafkaQueue, id: &str, tenant: &str) -> Result<bool, StoreError> {
    let Some(file) = queue.file(id, tenant).await? else {
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
    let partitions = queue.inner.state_partitions.max(1);
    let outs = (0..partitions)
        .flat_map(|partition| (0..chunks).map(move |i| (partition, i)))
        .map(|(partition, i)| {
            let mut out = Out::state(&deleted, &format!("{id}#{i}"), Bytes::new());
            out.partition = Some(partition);
            out
        })
        .collect();
    queue.write(outs).await?;
    queue.inner.view.catch_up().await?;
    Ok(true)
}

/// Creates a batch: its row on the state topic, and each of its jobs like a submission.
pub(super) async fn create_batch(queue: &KafkaQueue, batch: NewBatch) -> Result<Submitted, StoreError> {
    let id = match &batch.idempotency_key {
        Some(key) => keyed_id("batch", idempotency_scope(key)),
        None => crate::queue::new_id("batch"),
    };
    if let Some(key) = &batch.idempotency_key {
        if queue.batch(&id, &batch.tenant).await?.is_some() {
            let stored = queue
                .inner
                .view
                .batch_row(id.clone())
                .await?
                .and_then(|r| r.idempotency_key);
            return Ok(Submitted::earlier(id, stored.as_deref(), key));
        }
    }
    queue.check_room(batch.jobs.len())?;
    let now = crate::queue::now_ms();
    let row = BatchRow::new(id.clone(), &batch, now);
    let mut outs = vec![Out::state(&Record::Batch(row), &id, Bytes::new())];
    if batch.errors.is_empty() {
        for (custom_id, line, job) in batch.jobs {
            let job_id = crate::queue::new_id("job");
            let meta = JobMeta::new(job_id.clone(), &job, now, Some((id.clone(), custom_id, line)));
            outs.push(Out::state(
                &Record::Job(queue.state(meta.clone(), State::Queued, 0)),
                &job_id,
                Bytes::new(),
            ));
            outs.push(Out::job(&meta, job.body));
        }
    }
    queue.write(outs).await?;
    Ok(Submitted::new(id))
}

/// Starts cancelling `tenant`'s batch `id`: the batch marked cancelling, and each of its
/// queued jobs cancelled, on the state topic.
pub(super) async fn cancel_batch(queue: &KafkaQueue, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
    let Some(batch) = queue.batch(id, tenant).await? else {
        return Ok(None);
    };
    let open = matches!(batch.status.as_str(), "validating" | "in_progress");
    let Some(mut row) = queue.inner.view.batch_row(id.to_owned()).await?.filter(|_| open) else {
        return Ok(Some(batch));
    };
    let now = crate::queue::now_ms();
    row.cancelling_at = Some(now);
    let mut outs = vec![Out::state(&Record::Batch(row), id, Bytes::new())];
    for (meta, attempts) in queue.inner.view.queued_in_batch(id.to_owned()).await? {
        let key = meta.id.clone();
        let mut record = queue.state(meta, State::Cancelled, attempts);
        record.finished_at = Some(now);
        outs.push(Out::state(&Record::Job(record), &key, Bytes::new()));
    }
    queue.write(outs).await?;
    queue.inner.view.store.batch(id, tenant).await
}
