//! OpenAI's file and batch objects, written from the queue's rows: what `/v1/files` and
//! `/v1/batches` answer. Times are whole seconds since the Unix epoch, as OpenAI's.

use serde_json::{json, Value};

use crate::queue::{Batch, FileInfo};

/// OpenAI's file object (without its content).
pub fn file(info: &FileInfo) -> Value {
    json!({
        "id": info.id,
        "object": "file",
        "bytes": info.bytes,
        "created_at": info.created_at / 1000,
        "filename": info.filename,
        "purpose": info.purpose,
        "status": "processed",
    })
}

/// OpenAI's batch object, with its `request_counts`; a precomputing batch says for how
/// long its answers are kept, and a shadow batch where its comparison is.
pub fn batch(b: &Batch) -> Value {
    let secs = |ms: Option<i64>| ms.map_or(Value::Null, |ms| Value::from(ms / 1000));
    let mut object = json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": b.errors,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": b.created_at / 1000,
        "in_progress_at": secs(b.in_progress_at),
        "expires_at": b.expires_at / 1000,
        "finalizing_at": secs(b.finalizing_at),
        "completed_at": secs(b.completed_at),
        "failed_at": secs(b.failed_at),
        "expired_at": secs(b.expired_at),
        "cancelling_at": secs(b.cancelling_at),
        "cancelled_at": secs(b.cancelled_at),
        "request_counts": {"total": b.counts.total, "completed": b.counts.completed, "failed": b.counts.failed},
        "metadata": b.metadata,
    });
    if b.counts.tokens != [0, 0] {
        let [input, output] = b.counts.tokens;
        object["usage"] = json!({
            "input_tokens": input,
            "output_tokens": output,
            "total_tokens": input + output,
        });
    }
    if let Some(ttl) = b.precompute {
        object["precompute"] = json!({"ttl": humantime::format_duration(ttl).to_string()});
    }
    if let Some((comparison_file_id, summary)) = &b.shadow {
        object["shadow"] = json!({"comparison_file_id": comparison_file_id, "summary": summary});
    }
    if b.counts.waiting > 0 {
        // Not OpenAI's field: a client that does not know it sees an in-progress batch.
        let reason = b.waiting.as_deref().unwrap_or_default().trim_start_matches("waiting: ");
        object["quota_wait"] = json!({"requests": b.counts.waiting, "reason": reason});
    }
    object
}

/// Whether `b` can still be cancelled (OpenAI's `validating` and `in_progress`).
pub fn cancellable(b: &Batch) -> bool {
    matches!(b.status.as_str(), "validating" | "in_progress")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::batches::Counts;

    fn stored() -> Batch {
        Batch {
            id: "batch_1".into(),
            tenant: "team-a".into(),
            endpoint: "/v2/models/m/infer".into(),
            errors: None,
            input_file_id: "file_1".into(),
            completion_window: "24h".into(),
            status: "in_progress".into(),
            output_file_id: None,
            error_file_id: None,
            created_at: 1_700_000_000_999,
            in_progress_at: Some(1_700_000_000_999),
            expires_at: 1_700_086_400_000,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            metadata: Some(json!({"k": "v"})),
            precompute: Some(Duration::from_secs(3600)),
            shadow: None,
            counts: Counts {
                total: 3,
                completed: 1,
                failed: 1,
                waiting: 0,
                tokens: [0, 0],
            },
            waiting: None,
        }
    }

    #[test]
    fn a_batch_object_has_openai_s_fields_in_seconds() {
        let object = batch(&stored());
        assert_eq!(object["object"], "batch");
        assert_eq!(object["created_at"], 1_700_000_000);
        assert_eq!(object["in_progress_at"], 1_700_000_000);
        assert_eq!(object["completed_at"], Value::Null);
        assert_eq!(
            object["request_counts"],
            json!({"total": 3, "completed": 1, "failed": 1})
        );
        assert_eq!(object["metadata"], json!({"k": "v"}));
        assert_eq!(object["precompute"], json!({"ttl": "1h"}));
        assert!(object.get("shadow").is_none(), "only a shadow batch says shadow");
        assert!(cancellable(&stored()));
    }
}
