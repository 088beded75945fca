//! `GET` and `DELETE /v1/jobs/{id}`: an offline job's status, and once it is done the
//! exact answer the backend gave; cancelling one.
//!
//! Beside the HTTP door, which routes `/v1/jobs/` here. While a job waits or runs the
//! answer is `202 Accepted` with its status as JSON and `Retry-After`; once it succeeded
//! or the backend refused it, the backend's own status, framing headers and body, with
//! `x-tiergate-job-id` and `x-tiergate-job-status`; a job that failed without an answer
//! is a 502 with its last error; a cancelled or expired one is `410 Gone`. Another
//! tenant's job is answered as if it did not exist (404).

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode};
use serde_json::json;

use crate::error::{Error, Kind};
use crate::headers;
use crate::queue::{Job, JobStore, Queue, State};
use crate::tenant::Tenant;
use crate::tiers::offline::store_error;

/// Answers `tenant`'s `method` on `/v1/jobs/{id}`.
pub async fn answer(store: &Queue, method: &Method, id: &str, tenant: &Tenant) -> Result<Response<Bytes>, Error> {
    let missing = || {
        Error::new(
            Kind::NotFound,
            format!("no job {id} (unknown, or deleted after its retention)"),
        )
    };
    let job = store.get(id).await.map_err(store_error)?;
    let job = job
        .filter(|job| job.request.tenant == tenant.as_str())
        .ok_or_else(missing)?;
    match *method {
        Method::GET => Ok(render(&job)),
        Method::DELETE => {
            let state = store.cancel(id).await.map_err(store_error)?.ok_or_else(missing)?;
            let status = match state {
                State::Cancelled => StatusCode::OK,
                _ => StatusCode::CONFLICT,
            };
            let body = json!({"id": id, "object": "job", "status": state.as_str()});
            Ok(json_response(status, &body, id, state))
        }
        _ => Err(Error::new(
            Kind::MethodNotAllowed,
            format!("{method} is not allowed on /v1/jobs/{id}; use GET or DELETE"),
        )),
    }
}

fn render(job: &Job) -> Response<Bytes> {
    match (job.state, &job.answer) {
        (State::Succeeded | State::Failed, Some(answer)) => {
            let mut reply = Response::new(answer.body.clone());
            *reply.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            for (k, v) in &answer.headers {
                if let (Ok(k), Ok(v)) = (http::HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                    reply.headers_mut().insert(k, v);
                }
            }
            tag(&mut reply, &job.id, job.state);
            reply
        }
        (State::Failed, None) => {
            let error = job.error.as_deref().unwrap_or("unknown error");
            let message = format!("job {} failed: {error}", job.id);
            let body =
                json!({"error": {"message": message, "type": "server_error", "param": null, "code": "job_failed"}});
            json_response(StatusCode::BAD_GATEWAY, &body, &job.id, job.state)
        }
        (State::Cancelled | State::Expired, _) => {
            let message = format!("job {} was {}; it has no result", job.id, job.state.as_str());
            let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": "job_gone"}});
            json_response(StatusCode::GONE, &body, &job.id, job.state)
        }
        (State::Queued | State::Running | State::Succeeded, _) => {
            let body = json!({
                "id": job.id,
                "object": "job",
                "status": job.state.as_str(),
                "attempts": job.attempts,
                "created_at": job.created_at / 1000,
                "expires_at": job.request.expires_at / 1000,
                "last_error": job.error,
            });
            let mut reply = json_response(StatusCode::ACCEPTED, &body, &job.id, job.state);
            reply
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(1));
            reply
        }
    }
}

fn json_response(status: StatusCode, body: &serde_json::Value, id: &str, state: State) -> Response<Bytes> {
    let mut reply = Response::new(Bytes::from(body.to_string()));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    tag(&mut reply, id, state);
    reply
}

fn tag(reply: &mut Response<Bytes>, id: &str, state: State) {
    let headers = reply.headers_mut();
    if let Ok(id) = HeaderValue::from_str(id) {
        headers.insert(headers::JOB_ID, id);
    }
    headers.insert(headers::JOB_STATUS, HeaderValue::from_static(state.as_str()));
}
