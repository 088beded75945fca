//! `GET /admin/offline`: the offline queue across tenants (jobs by state, the oldest
//! queued job's age, every tenant's batches with their progress), and
//! `POST /admin/batches/{id}/cancel`: cancel any tenant's batch as its owner would.
//!
//! Callers see only their own batches through the Batch API; the admin token sees all,
//! each with its tenant, and nothing of a batch's content.

use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::front::batch_api::object;
use crate::queue::{now_ms, JobStore, Queue, StoreError};

/// Batches listed when the query does not say.
const DEFAULT_LIMIT: usize = 50;
/// Most batches listed at once.
const MAX_LIMIT: usize = 500;

/// What a bad query gets: its status, code and message.
type Refusal = (StatusCode, &'static str, String);

/// Which batches a query asks for: older than `after`, at most `limit`.
#[derive(Debug, PartialEq, Eq)]
struct Page {
    after: Option<String>,
    limit: usize,
}

fn page(query: Option<&str>) -> Result<Page, Refusal> {
    let bad = |code, message: String| (StatusCode::BAD_REQUEST, code, message);
    let mut page = Page {
        after: None,
        limit: DEFAULT_LIMIT,
    };
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "after" if is_id(value) => page.after = Some(value.to_owned()),
            "after" => return Err(bad("bad_after", format!("after={value:?}: a batch id (batch_...)"))),
            "limit" => {
                page.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(
                            "bad_limit",
                            format!("limit={value:?}: a whole number from 1 to {MAX_LIMIT}"),
                        )
                    })?
            }
            other => {
                return Err(bad(
                    "bad_parameter",
                    format!("unknown parameter {other:?}: after and limit are understood"),
                ))
            }
        }
    }
    Ok(page)
}

/// Whether `text` can be a batch id (letters, digits, `_` and `-`, not too long).
fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The offline queue now: jobs by state, the oldest queued job, and a page of every
/// tenant's batches (newest first) with their tenant and whether they can be cancelled.
pub(super) async fn overview(queue: &Queue, query: Option<&str>) -> Result<Value, Refusal> {
    let page = page(query)?;
    let counts = queue.counts().await.map_err(unreadable)?;
    let oldest = queue.oldest_queued().await.map_err(unreadable)?;
    let (batches, has_more) = queue.all_batches(page.after, page.limit).await.map_err(unreadable)?;
    let jobs: Map<String, Value> = counts
        .into_iter()
        .map(|(state, n)| (state.as_str().to_owned(), Value::from(n)))
        .collect();
    let now = now_ms();
    let data: Vec<Value> = batches.iter().map(described).collect();
    Ok(json!({
        "jobs": jobs,
        "oldest_queued_at": oldest.map(|ms| ms / 1000),
        "oldest_queued_age_s": oldest.map(|ms| (now - ms).max(0) as f64 / 1000.0),
        "batches": data,
        "has_more": has_more,
        "last_id": batches.last().map(|b| b.id.clone()),
    }))
}

/// Cancels batch `id` whoever's it is, as its owner's `POST /v1/batches/{id}/cancel`
/// would: queued jobs are cancelled now, running ones finish. The batch afterwards.
pub(super) async fn cancel(queue: &Queue, id: &str, who: &str) -> Result<Value, Refusal> {
    let missing = || (StatusCode::NOT_FOUND, "no_such_batch", format!("no batch {id:?}"));
    let tenant = match is_id(id) {
        true => queue.batch_owner(id).await.map_err(unreadable)?.ok_or_else(missing)?,
        false => return Err(missing()),
    };
    let before = queue
        .batch(id, &tenant)
        .await
        .map_err(unreadable)?
        .ok_or_else(missing)?;
    if !object::cancellable(&before) {
        let message = format!(
            "batch {id} is {}: only a validating or in-progress batch can be cancelled",
            before.status
        );
        return Err((StatusCode::CONFLICT, "not_cancellable", message));
    }
    let after = queue
        .cancel_batch(id, &tenant)
        .await
        .map_err(unreadable)?
        .ok_or_else(missing)?;
    tracing::info!(batch = id, tenant, who, "batch cancelled through the admin API");
    Ok(described(&after))
}

/// What a caller gets when the queue cannot be read.
fn unreadable(e: StoreError) -> Refusal {
    (StatusCode::SERVICE_UNAVAILABLE, "queue_unreadable", e.to_string())
}

/// A batch as the Batch API writes it, with its tenant and whether it can be cancelled.
fn described(b: &crate::queue::Batch) -> Value {
    let mut v = object::batch(b);
    v["tenant"] = Value::from(b.tenant.as_str());
    v["cancellable"] = Value::from(object::cancellable(b));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_read_from_the_query_and_bad_parameters_say_what_to_fix() {
        assert_eq!(
            page(None).expect("read"),
            Page {
                after: None,
                limit: DEFAULT_LIMIT
            }
        );
        assert_eq!(
            page(Some("after=batch_0a&limit=3")).expect("read"),
            Page {
                after: Some("batch_0a".into()),
                limit: 3
            }
        );
        assert_eq!(page(Some("limit=0")).expect_err("refused").1, "bad_limit");
        assert_eq!(page(Some("limit=501")).expect_err("refused").1, "bad_limit");
        assert_eq!(page(Some("after=x%27--")).expect_err("refused").1, "bad_after");
        assert_eq!(page(Some("tenant=a")).expect_err("refused").1, "bad_parameter");
    }
}
