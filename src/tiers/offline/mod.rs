//! The offline tier: bulk work nobody waits for, accepted durably at once and run later.
//!
//! After the classifier; beside the other tiers. A request classified offline (budget
//! from `offline_from`, or `Prefer: respond-async`) becomes a job in the durable queue
//! ([`crate::queue`]) and is answered `202 Accepted` with `Location: /v1/jobs/{id}` only
//! once the job is on disk. An `Idempotency-Key` header returns the job an earlier
//! submission made. The [`worker`] drains jobs through the micro-batch tier's batching,
//! only as far as each batch pool has spare capacity. gRPC has no asynchronous answer,
//! so a gRPC call classified offline is refused with a message saying what to do instead.

pub mod worker;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::json;
use tokio::sync::Notify;

use super::Call;
use crate::config;
use crate::decision::Door;
use crate::error::{Error, Kind};
use crate::headers;
use crate::protocol;
use crate::protocol::Reply;
use crate::queue::{self, JobStore, NewJob, Queue, StoreError};
use crate::tenant::Tenant;

/// Headers kept with a job: what frames its body. Credentials are never stored.
const KEPT_HEADERS: [http::HeaderName; 2] = [http::header::CONTENT_TYPE, protocol::HEADER_LEN];

/// The offline tier service.
#[derive(Debug, Clone)]
pub struct Offline {
    store: Queue,
    settings: config::Offline,
    wake: Arc<Notify>,
}

impl Offline {
    /// An offline tier over `store`; `wake` is notified whenever a job is accepted.
    pub fn new(store: Queue, settings: config::Offline, wake: Arc<Notify>) -> Self {
        Offline { store, settings, wake }
    }
}

impl Offline {
    /// Accepts `call` as a job: 202 with its `Location` once it is durable (a full store
    /// refuses with 507).
    pub async fn serve(&self, call: Call) -> Result<Reply, Error> {
        let started = std::time::Instant::now();
        let headers = call.request.headers();
        if call.door != Door::Http {
            return Err(Error::new(
                Kind::Unsupported,
                format!(
                    "route {}: this call is classified to the offline tier, which answers later and so only over HTTP \
                     (Prefer: respond-async, or the Batch API); over gRPC send a deadline below {} ms",
                    call.route.name,
                    call.route.budgets.offline_from.as_millis()
                ),
            ));
        }
        let path = call
            .request
            .uri()
            .path_and_query()
            .map_or_else(|| call.request.uri().path().to_owned(), |p| p.as_str().to_owned());
        let tenant = Tenant::of(&call.request);
        let request: [&[u8]; 3] = [
            call.request.method().as_str().as_bytes(),
            path.as_bytes(),
            call.request.body(),
        ];
        let idempotency_key = idempotency_key(headers, tenant.as_str(), call.request.uri().path(), &request)?;
        let kept = KEPT_HEADERS
            .iter()
            .filter_map(|k| {
                headers
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| (k.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let job = NewJob {
            route: call.route.name.clone(),
            method: call.request.method().as_str().to_owned(),
            path,
            headers: kept,
            body: call.request.body().clone(),
            expires_at: queue::after(self.settings.completion_window),
            idempotency_key,
            tenant: tenant.as_str().to_owned(),
            shadow: false,
        };
        let submitted = self.store.submit(vec![job]).await.map_err(store_error)?;
        let Some(submitted) = submitted.into_iter().next() else {
            return Err(Error::new(Kind::Unavailable, "the offline store accepted nothing"));
        };
        reused(&submitted)?;
        self.wake.notify_one();
        let status = match submitted.existing {
            false => "queued",
            true => self
                .store
                .get(&submitted.id)
                .await
                .map_err(store_error)?
                .map_or("queued", |j| j.state.as_str()),
        };
        let body = json!({
            "id": submitted.id,
            "object": "job",
            "status": status,
            "existing": submitted.existing,
            "url": format!("/v1/jobs/{}", submitted.id),
        });
        let mut reply = Response::new(Bytes::from(body.to_string()));
        *reply.status_mut() = StatusCode::ACCEPTED;
        let h = reply.headers_mut();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Ok(location) = HeaderValue::from_str(&format!("/v1/jobs/{}", submitted.id)) {
            h.insert(http::header::LOCATION, location);
        }
        // Server-Timing's `queue`: the job's durable write (no backend has seen it yet).
        let took = started.elapsed();
        crate::timing::set(reply.extensions_mut(), &[(crate::timing::Spent::Queue, took)]);
        Ok(reply)
    }
}

/// The client's `Idempotency-Key` in `headers` as stored: scoped to `tenant` and
/// `endpoint`, bound to a fingerprint of `request` (see [`queue::idempotency_key`]);
/// 400 when it is not visible ASCII or longer than 255 characters.
pub fn idempotency_key(
    headers: &HeaderMap,
    tenant: &str,
    endpoint: &str,
    request: &[&[u8]],
) -> Result<Option<String>, Error> {
    let Some(value) = headers.get(headers::IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| (1..=255).contains(&k.len()))
        .ok_or_else(|| {
            Error::new(
                Kind::BadRequest,
                format!("{} must be 1 to 255 visible ASCII characters", headers::IDEMPOTENCY_KEY),
            )
        })?;
    Ok(Some(queue::idempotency_key(tenant, endpoint, key, request)))
}

/// 422 when `submitted` is an earlier submission with the same key but another request.
pub fn reused(submitted: &queue::Submitted) -> Result<(), Error> {
    if submitted.existing && !submitted.same_request {
        return Err(Error::new(
            Kind::KeyReused,
            format!(
                "this {} was already used for a different request ({}); send a new key for a new request",
                headers::IDEMPOTENCY_KEY,
                submitted.id
            ),
        ));
    }
    Ok(())
}

/// The door's error for a store failure.
pub fn store_error(e: StoreError) -> Error {
    match e {
        StoreError::Full(_) => Error::new(Kind::StoreFull, e.to_string()).knob("offline.max_queued_jobs"),
        StoreError::Io(_) | StoreError::Closed => Error::new(Kind::Unavailable, e.to_string()),
    }
}
