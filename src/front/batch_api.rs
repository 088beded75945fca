//! The Batch API, shaped like OpenAI's so its SDKs and tools work unchanged:
//! `POST /v1/files` (multipart JSONL upload, `purpose=batch`), `GET /v1/files/{id}` and
//! `/content`; `POST /v1/batches`, `GET /v1/batches` (paginated), `GET /v1/batches/{id}`,
//! `POST /v1/batches/{id}/cancel`.
//!
//! Beside the HTTP door, which routes these paths here. Each input line is
//! `{custom_id, method, url, body}` where `url` is any route tiergate serves with its
//! offline tier on (a KServe v2 infer path or a JSON route). A batch is validated whole
//! when it is created: a bad line (not JSON, unknown url, duplicate `custom_id`, ...) is
//! reported with its line number in the batch's `errors`, and the batch is `failed`
//! with no job run; otherwise the batch and all its jobs are stored in one commit and
//! run by the offline workers. Output and error files are written when the last job ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use crate::config;
use crate::error::{Error, Kind};
use crate::headers;
use crate::policy::Store;
use crate::queue::batches::NewBatch;
use crate::queue::{self, NewJob, Queue};
use crate::tiers::offline::store_error;

/// The offline tier's HTTP API: jobs and the Batch API.
#[derive(Debug, Clone)]
pub struct OfflineApi {
    /// The durable store.
    pub store: Queue,
    /// The running policy (to check each line's url).
    pub policy: Arc<Store>,
    /// Offline settings (windows, limits).
    pub settings: config::Offline,
    /// Wakes the offline workers when work arrives.
    pub wake: Arc<Notify>,
}

impl OfflineApi {
    /// Answers `method` on `path` (under `/v1/files` or `/v1/batches`) with `body`.
    pub async fn answer(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Bytes>, Error> {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (&Method::POST, ["v1", "files"]) => self.upload(headers, body).await,
            (&Method::GET, ["v1", "files", id]) => {
                let file = self.store.file(id).await.map_err(store_error)?;
                let file = file.ok_or_else(|| not_found("file", id))?;
                Ok(json_response(StatusCode::OK, &file.to_json()))
            }
            (&Method::GET, ["v1", "files", id, "content"]) => {
                let content = self.store.content(id).await.map_err(store_error)?;
                let content = content.ok_or_else(|| not_found("file", id))?;
                let mut reply = Response::new(Bytes::from(content));
                reply.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/jsonl"),
                );
                Ok(reply)
            }
            (&Method::POST, ["v1", "batches"]) => self.create(headers, &body).await,
            (&Method::GET, ["v1", "batches"]) => self.list(query).await,
            (&Method::GET, ["v1", "batches", id]) => {
                let batch = self.store.batch(id).await.map_err(store_error)?;
                Ok(json_response(
                    StatusCode::OK,
                    &batch.ok_or_else(|| not_found("batch", id))?,
                ))
            }
            (&Method::POST, ["v1", "batches", id, "cancel"]) => {
                let batch = self.store.cancel_batch(id).await.map_err(store_error)?;
                let batch = batch.ok_or_else(|| not_found("batch", id))?;
                self.wake.notify_one();
                Ok(json_response(StatusCode::OK, &batch))
            }
            _ => Err(Error::new(
                Kind::NotFound,
                format!("no Batch API endpoint for {method} {path}"),
            )),
        }
    }

    /// `POST /v1/files`: a multipart form with `purpose` and `file`.
    async fn upload(&self, headers: &HeaderMap, body: Bytes) -> Result<Response<Bytes>, Error> {
        let bad = |why: String| Error::new(Kind::BadRequest, why);
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let boundary = multer::parse_boundary(content_type).map_err(|e| {
            bad(format!(
                "upload files as multipart/form-data with `purpose` and `file` fields: {e}"
            ))
        })?;
        let stream = tokio_stream::once(Ok::<Bytes, std::convert::Infallible>(body));
        let mut form = multer::Multipart::new(stream, boundary);
        let (mut purpose, mut file) = (None, None);
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| bad(format!("malformed multipart body: {e}")))?
        {
            match field.name() {
                Some("purpose") => purpose = Some(field.text().await.map_err(|e| bad(e.to_string()))?),
                Some("file") => {
                    let name = field.file_name().unwrap_or("input.jsonl").to_owned();
                    file = Some((name, field.bytes().await.map_err(|e| bad(e.to_string()))?));
                }
                _ => {}
            }
        }
        match purpose.as_deref() {
            Some("batch") => {}
            Some(other) => return Err(bad(format!("purpose must be \"batch\", got {other:?}"))),
            None => return Err(bad("the form has no `purpose` field (use purpose=batch)".into())),
        }
        let (name, content) = file.ok_or_else(|| bad("the form has no `file` field".into()))?;
        let info = self
            .store
            .add_file("batch".into(), name, content)
            .await
            .map_err(store_error)?;
        Ok(json_response(StatusCode::OK, &info.to_json()))
    }

    /// `POST /v1/batches`.
    async fn create(&self, headers: &HeaderMap, body: &Bytes) -> Result<Response<Bytes>, Error> {
        let bad = |why: String| Error::new(Kind::BadRequest, why);
        let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
            return Err(bad(
                "the body must be a JSON object with input_file_id, endpoint and completion_window".into(),
            ));
        };
        let text = |key: &str| -> Result<String, Error> {
            req.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("`{key}` is required (a string)")))
        };
        let input_file_id = text("input_file_id")?;
        let endpoint = text("endpoint")?;
        let completion_window = text("completion_window")?;
        let window = humantime::parse_duration(&completion_window)
            .ok()
            .filter(|w| *w >= Duration::from_secs(1) && *w <= Duration::from_secs(7 * 24 * 3600))
            .ok_or_else(|| {
                bad(format!(
                    "completion_window {completion_window:?} must be a duration from 1s to 7d, such as \"24h\""
                ))
            })?;
        let metadata = match req.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => Some(m.clone()),
            Some(_) => return Err(bad("metadata must be an object of at most 16 string values".into())),
        };
        let idempotency_key = headers
            .get(headers::IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content = self.store.content(&input_file_id).await.map_err(store_error)?;
        let content = content.ok_or_else(|| not_found("file", &input_file_id))?;
        let expires_at = queue::after(window);
        let (jobs, errors) = self.lines(&content, expires_at);
        let batch = NewBatch {
            input_file_id,
            endpoint,
            completion_window,
            expires_at,
            metadata,
            idempotency_key,
            jobs,
            errors,
        };
        let (id, _) = self.store.create_batch(batch).await.map_err(store_error)?;
        self.wake.notify_one();
        let batch = self.store.batch(&id).await.map_err(store_error)?;
        Ok(json_response(StatusCode::OK, &batch.unwrap_or(Value::Null)))
    }

    /// Every line as a job, or the problems with the lines (with their numbers).
    fn lines(&self, content: &[u8], expires_at: i64) -> (Vec<(String, u64, NewJob)>, Vec<Value>) {
        let policy = self.policy.load();
        let max = self.settings.max_file_lines;
        let (mut jobs, mut errors) = (Vec::new(), Vec::new());
        let mut seen = HashSet::new();
        for (i, raw) in content.split(|b| *b == b'\n').enumerate() {
            let line = i as u64 + 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if jobs.len() + errors.len() >= max {
                problem(
                    &mut errors,
                    line,
                    "too_many_lines",
                    format!("the file has more than {max} requests"),
                    None,
                );
                break;
            }
            let obj: Map<String, Value> = match serde_json::from_slice(raw) {
                Ok(Value::Object(obj)) => obj,
                Ok(_) => {
                    problem(
                        &mut errors,
                        line,
                        "invalid_json_line",
                        "the line is not a JSON object".into(),
                        None,
                    );
                    continue;
                }
                Err(e) => {
                    problem(
                        &mut errors,
                        line,
                        "invalid_json_line",
                        format!("the line is not valid JSON: {e}"),
                        None,
                    );
                    continue;
                }
            };
            let Some(custom_id) = obj.get("custom_id").and_then(Value::as_str).filter(|c| !c.is_empty()) else {
                problem(
                    &mut errors,
                    line,
                    "missing_required_parameter",
                    "custom_id is required (a string)".into(),
                    Some("custom_id"),
                );
                continue;
            };
            if !seen.insert(custom_id.to_owned()) {
                let message = format!("custom_id {custom_id:?} is used by an earlier line; each must be unique");
                problem(&mut errors, line, "duplicate_custom_id", message, Some("custom_id"));
                continue;
            }
            if obj.get("method").and_then(Value::as_str) != Some("POST") {
                problem(
                    &mut errors,
                    line,
                    "invalid_method",
                    "method must be \"POST\"".into(),
                    Some("method"),
                );
                continue;
            }
            let Some(url) = obj.get("url").and_then(Value::as_str) else {
                problem(
                    &mut errors,
                    line,
                    "missing_required_parameter",
                    "url is required (a string)".into(),
                    Some("url"),
                );
                continue;
            };
            let Some(route) = super::paths::route_for(&policy, url) else {
                problem(
                    &mut errors,
                    line,
                    "invalid_url",
                    format!("no route serves {url}"),
                    Some("url"),
                );
                continue;
            };
            if !route.flags.offline || route.micro_batch.is_none() {
                let message = format!("route {} (for {url}) has its offline tier switched off", route.name);
                problem(&mut errors, line, "invalid_url", message, Some("url"));
                continue;
            }
            let body = match obj.get("body") {
                Some(body @ Value::Object(_)) => Bytes::from(body.to_string()),
                _ => {
                    problem(
                        &mut errors,
                        line,
                        "invalid_body",
                        "body must be a JSON object".into(),
                        Some("body"),
                    );
                    continue;
                }
            };
            let job = NewJob {
                route: route.name.clone(),
                method: "POST".into(),
                path: url.to_owned(),
                headers: vec![("content-type".into(), "application/json".into())],
                body,
                expires_at,
                idempotency_key: None,
            };
            jobs.push((custom_id.to_owned(), line, job));
        }
        if jobs.is_empty() && errors.is_empty() {
            problem(
                &mut errors,
                0,
                "empty_file",
                "the input file has no requests".into(),
                None,
            );
        }
        (jobs, errors)
    }

    /// `GET /v1/batches?limit=N&after=ID`.
    async fn list(&self, query: Option<&str>) -> Result<Response<Bytes>, Error> {
        let (mut limit, mut after) = (20usize, None);
        for (k, v) in query.unwrap_or_default().split('&').filter_map(|kv| kv.split_once('=')) {
            match k {
                "limit" => {
                    limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| Error::new(Kind::BadRequest, "limit must be 1 to 100"))?;
                }
                "after" => after = Some(v.to_owned()),
                _ => {}
            }
        }
        let (data, has_more) = self.store.batches(after, limit).await.map_err(store_error)?;
        let id = |b: Option<&Value>| b.and_then(|b| b.get("id")).cloned().unwrap_or(Value::Null);
        let body = json!({
            "object": "list",
            "first_id": id(data.first()),
            "last_id": id(data.last()),
            "has_more": has_more,
            "data": data,
        });
        Ok(json_response(StatusCode::OK, &body))
    }
}

/// Records a line's problem (the first 1,000; the rest are counted by their absence).
fn problem(errors: &mut Vec<Value>, line: u64, code: &str, message: String, param: Option<&str>) {
    if errors.len() < 1000 {
        errors.push(json!({"code": code, "message": message, "param": param, "line": line}));
    }
}

fn not_found(what: &str, id: &str) -> Error {
    Error::new(Kind::NotFound, format!("no {what} {id}"))
}

fn json_response(status: StatusCode, body: &Value) -> Response<Bytes> {
    let mut reply = Response::new(Bytes::from(body.to_string()));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}
