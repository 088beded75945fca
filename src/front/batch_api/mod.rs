//! The Batch API, shaped like OpenAI's so its SDKs and tools work unchanged:
//! `POST /v1/files` (multipart JSONL upload, `purpose=batch`), `GET /v1/files` (the
//! caller's, by `purpose`, paginated), `GET /v1/files/{id}` and `/content`,
//! `DELETE /v1/files/{id}`; `POST /v1/batches`, `GET /v1/batches` (paginated), `GET /v1/batches/{id}`,
//! `POST /v1/batches/{id}/cancel`.
//!
//! Beside the HTTP door, which routes these paths here. Each input line is
//! `{custom_id, method, url, body}` where `url` is the batch's `endpoint`, a route
//! tiergate serves with its offline tier on (a KServe v2 infer path or a JSON route),
//! as OpenAI requires every line's url to be the batch's. A batch is validated whole
//! when it is created: a bad line (not JSON, unknown url, duplicate `custom_id`, ...) is
//! reported with its line number in the batch's `errors`, and the batch is `failed`
//! with no job run; otherwise the batch and all its jobs are stored in one commit and
//! run by the offline workers. Output and error files are written when the last job ends.
//!
//! A batch created with `"shadow": true` (an extension: `extra_body` in OpenAI's SDKs)
//! is also scored line by line by its route's shadow candidate; when it ends, its
//! `shadow` field names a comparison file (one line per input line) and holds a summary.
//! One created with `"precompute": {"ttl": "24h"}` (or `true`: the route's TTL) writes
//! every answer into its route's cache for that long, so the same questions asked later
//! are answered from it (see `crate::cache`).

pub mod lines;
pub mod object;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::body::Answered;
use super::pipeline::admission::Ticket;
use crate::config;
use crate::error::{Error, Kind};
use crate::policy::Store;
use crate::queue::batches::NewBatch;
use crate::queue::{self, JobStore, Queue};
use crate::tenant::Tenant;
use crate::tiers::offline::{idempotency_key, reused, store_error};
use lines::{lines, Within};

/// How much of a file's content is read from the store at a time.
const CONTENT_CHUNK: u64 = 256 << 10;

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
    /// Largest request body a door accepts: each input line's body is held to it too.
    pub max_body_bytes: usize,
}

/// One request to the Batch API, its body aside.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its path (under `/v1/files` or `/v1/batches`).
    pub path: &'a str,
    /// Its query string.
    pub query: Option<&'a str>,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// Whose request it is: a tenant sees and changes only its own files and batches
    /// (another's are answered 404, as if they did not exist).
    pub tenant: &'a Tenant,
}

impl OfflineApi {
    /// Answers `asked` with `body`, holding in `ticket` (the door's global budget) what
    /// it reads into memory on the way (a batch's input file).
    pub async fn answer(
        &self,
        asked: Asked<'_>,
        body: Bytes,
        ticket: &mut Ticket,
    ) -> Result<Response<Answered>, Error> {
        if let (&Method::GET, Some(id)) = (asked.method, content_of(asked.path)) {
            return self.content(id, asked.tenant.as_str()).await;
        }
        self.answer_whole(asked, body, ticket)
            .await
            .map(|r| r.map(Answered::from))
    }

    /// [`OfflineApi::answer`] for every answer but a file's content.
    async fn answer_whole(&self, asked: Asked<'_>, body: Bytes, ticket: &mut Ticket) -> Result<Response<Bytes>, Error> {
        let Asked {
            method,
            path,
            query,
            headers,
            tenant,
        } = asked;
        let tenant = tenant.as_str();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (&Method::POST, ["v1", "files"]) => self.upload(headers, body, tenant).await,
            (&Method::GET, ["v1", "files"]) => self.files(query, tenant).await,
            (&Method::DELETE, ["v1", "files", id]) => match self.store.delete_file(id, tenant).await {
                Ok(true) => Ok(json_response(
                    StatusCode::OK,
                    &json!({"id": id, "object": "file", "deleted": true}),
                )),
                Ok(false) => Err(not_found("file", id)),
                Err(e) => Err(store_error(e)),
            },
            (&Method::GET, ["v1", "files", id]) => {
                let file = self.store.file(id, tenant).await.map_err(store_error)?;
                let file = file.ok_or_else(|| not_found("file", id))?;
                Ok(json_response(StatusCode::OK, &object::file(&file)))
            }
            (&Method::POST, ["v1", "batches"]) => self.create(headers, &body, tenant, ticket).await,
            (&Method::GET, ["v1", "batches"]) => self.list(query, tenant).await,
            (&Method::GET, ["v1", "batches", id]) => {
                let batch = self.store.batch(id, tenant).await.map_err(store_error)?;
                let batch = batch.ok_or_else(|| not_found("batch", id))?;
                Ok(json_response(StatusCode::OK, &object::batch(&batch)))
            }
            (&Method::POST, ["v1", "batches", id, "cancel"]) => {
                let batch = self.store.cancel_batch(id, tenant).await.map_err(store_error)?;
                let batch = batch.ok_or_else(|| not_found("batch", id))?;
                self.wake.notify_one();
                Ok(json_response(StatusCode::OK, &object::batch(&batch)))
            }
            _ => Err(Error::new(
                Kind::NotFound,
                format!("no Batch API endpoint for {method} {path}"),
            )),
        }
    }

    /// `GET /v1/files/{id}/content`: the content, streamed from the store a chunk at a
    /// time, each read once the client has taken the one before, so a slow reader holds
    /// one chunk, never the file.
    async fn content(&self, id: &str, tenant: &str) -> Result<Response<Answered>, Error> {
        let file = self.store.file(id, tenant).await.map_err(store_error)?;
        let len = file.ok_or_else(|| not_found("file", id))?.bytes;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (store, id, tenant) = (self.store.clone(), id.to_owned(), tenant.to_owned());
        tokio::spawn(async move {
            let mut at = 0;
            while at < len {
                let want = CONTENT_CHUNK.min(len - at);
                let chunk = match store.content_range(&id, &tenant, at, want).await {
                    Ok(Some(chunk)) if chunk.len() as u64 == want => Ok(Bytes::from(chunk)),
                    Ok(_) => Err(std::io::Error::other(format!(
                        "file {id} was deleted while it was read"
                    ))),
                    Err(e) => Err(std::io::Error::other(e.to_string())),
                };
                let failed = chunk.is_err();
                if tx.send(chunk).await.is_err() || failed {
                    return;
                }
                at += want;
            }
        });
        let mut reply = Response::new(Answered::streamed(rx, len));
        reply.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/jsonl"),
        );
        Ok(reply)
    }

    /// `POST /v1/files`: a multipart form with `purpose` and `file`.
    async fn upload(&self, headers: &HeaderMap, body: Bytes, tenant: &str) -> Result<Response<Bytes>, Error> {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let (name, content) = read_upload(content_type, body).await?;
        let info = self
            .store
            .add_file(tenant, "batch".into(), name, content)
            .await
            .map_err(store_error)?;
        Ok(json_response(StatusCode::OK, &object::file(&info)))
    }

    /// `POST /v1/batches`.
    async fn create(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        tenant: &str,
        ticket: &mut Ticket,
    ) -> Result<Response<Bytes>, Error> {
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
        let shadow = match req.get("shadow") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("shadow must be true or false".into())),
        };
        let policy = self.policy.load();
        let route = super::paths::route_for(&policy, &endpoint).or_else(|| {
            crate::llm::openai::is_path(&endpoint)
                .then(|| policy.routes_on(&endpoint))
                .flatten()
        });
        let Some(route) = route else {
            return Err(bad(format!(
                "endpoint {endpoint:?}: no route serves it; use a path a route serves \
                 (such as \"/v1/embeddings\") or a model's \"/v2/models/NAME/infer\""
            )));
        };
        if shadow {
            shadow_ready(&route)?;
        }
        let precompute = precompute(req.get("precompute"), &route)?;
        let idempotency_key = idempotency_key(headers, tenant, "/v1/batches", &[body])?;
        // The file and the jobs made of its lines are in memory at once: held first.
        let file = self.store.file(&input_file_id, tenant).await.map_err(store_error)?;
        let file = file.ok_or_else(|| not_found("file", &input_file_id))?;
        ticket.hold(usize::try_from(file.bytes).unwrap_or(usize::MAX).saturating_mul(2))?;
        let content = self.store.content(&input_file_id, tenant).await.map_err(store_error)?;
        let content = content.ok_or_else(|| not_found("file", &input_file_id))?;
        let expires_at = queue::after(window);
        let within = Within {
            policy: &policy,
            endpoint: &endpoint,
            max_lines: self.settings.max_file_lines,
            max_body_bytes: self.max_body_bytes,
            expires_at,
            tenant,
            shadow,
            precompute,
        };
        let (jobs, errors) = lines(&content, &within);
        let batch = NewBatch {
            input_file_id,
            endpoint,
            completion_window,
            expires_at,
            metadata,
            idempotency_key,
            tenant: tenant.to_owned(),
            jobs,
            errors,
            shadow,
            precompute,
        };
        let submitted = self.store.create_batch(batch).await.map_err(store_error)?;
        reused(&submitted)?;
        self.wake.notify_one();
        let batch = self.store.batch(&submitted.id, tenant).await.map_err(store_error)?;
        Ok(json_response(
            StatusCode::OK,
            &batch.as_ref().map_or(Value::Null, object::batch),
        ))
    }

    /// `GET /v1/files?purpose=P&limit=N&order=asc|desc&after=ID`, as OpenAI's.
    async fn files(&self, query: Option<&str>, tenant: &str) -> Result<Response<Bytes>, Error> {
        let mut asked = queue::batches::FileQuery {
            limit: 10_000,
            ..Default::default()
        };
        for (k, v) in pairs(query) {
            match k {
                "purpose" => asked.purpose = Some(v.to_owned()),
                "after" => asked.after = Some(v.to_owned()),
                "limit" => asked.limit = limit(v, 10_000)?,
                "order" => {
                    asked.ascending = match v {
                        "asc" => true,
                        "desc" => false,
                        _ => return Err(Error::new(Kind::BadRequest, "order must be asc or desc")),
                    };
                }
                _ => {}
            }
        }
        let (files, has_more) = self.store.files(tenant, asked).await.map_err(store_error)?;
        Ok(page(files.iter().map(object::file).collect(), has_more))
    }

    /// `GET /v1/batches?limit=N&after=ID`.
    async fn list(&self, query: Option<&str>, tenant: &str) -> Result<Response<Bytes>, Error> {
        let (mut most, mut after) = (20usize, None);
        for (k, v) in pairs(query) {
            match k {
                "limit" => most = limit(v, 100)?,
                "after" => after = Some(v.to_owned()),
                _ => {}
            }
        }
        let (data, has_more) = self.store.batches(tenant, after, most).await.map_err(store_error)?;
        Ok(page(data.iter().map(object::batch).collect(), has_more))
    }
}

/// Refuses a shadow batch for `route` unless the route has a shadow candidate with its
/// `shadow` flag on (every line is scored by that candidate).
fn shadow_ready(route: &crate::policy::Route) -> Result<(), Error> {
    let why = match (&route.shadow, route.flags.shadow) {
        (Some(_), true) => return Ok(()),
        (None, _) => format!(
            "shadow: route {} has no shadow candidate to score the batch with; add [routes.{}.shadow] \
             with its candidate pool, or create the batch without shadow",
            route.name, route.name
        ),
        (Some(_), false) => format!(
            "shadow: route {}'s shadow flag is off; switch it on (tiergate flags set {} shadow on) \
             or create the batch without shadow",
            route.name, route.name
        ),
    };
    Err(Error::new(Kind::BadRequest, why))
}

/// How long a batch's answers are kept in its route's cache: `"precompute": true` (the
/// route's TTL) or `{"ttl": "24h"}` (1 s to 7 d); refused unless the route has a cache
/// with its flag on (the answers would never be read).
fn precompute(asked: Option<&Value>, route: &crate::policy::Route) -> Result<Option<Duration>, Error> {
    let bad = |why: String| Error::new(Kind::BadRequest, format!("precompute: {why}"));
    let ttl = match asked {
        None | Some(Value::Null | Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => None,
        Some(Value::Object(o)) if o.keys().all(|k| k == "ttl") => {
            let text = o.get("ttl").and_then(Value::as_str).unwrap_or_default();
            let ttl = humantime::parse_duration(text)
                .ok()
                .filter(|t| *t >= Duration::from_secs(1) && *t <= Duration::from_secs(7 * 24 * 3600))
                .ok_or_else(|| {
                    bad(format!(
                        "ttl {text:?} must be a duration from 1s to 7d, such as \"24h\""
                    ))
                })?;
            Some(ttl)
        }
        Some(_) => return Err(bad("must be true, false or {\"ttl\": \"24h\"}".into())),
    };
    let name = &route.name;
    match (&route.cache, route.flags.cache) {
        (Some(spec), true) => Ok(Some(ttl.unwrap_or(spec.ttl))),
        (None, _) => Err(bad(format!(
            "route {name} has no cache to keep the answers in; add [routes.{name}.cache], or create the batch \
             without precompute"
        ))),
        (Some(_), false) => Err(bad(format!(
            "route {name}'s cache flag is off, so its answers would never be read; switch it on (tiergate flags \
             set {name} cache on) or create the batch without precompute"
        ))),
    }
}

/// A query string's `key=value` pairs.
fn pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query.unwrap_or_default().split('&').filter_map(|kv| kv.split_once('='))
}

/// A page size from 1 to `max`.
fn limit(v: &str, max: usize) -> Result<usize, Error> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| Error::new(Kind::BadRequest, format!("limit must be 1 to {max}")))
}

/// One page of a list, as OpenAI's: its objects, the first and last ids, whether more follow.
fn page(data: Vec<Value>, has_more: bool) -> Response<Bytes> {
    let id = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned().unwrap_or(Value::Null);
    let body = json!({
        "object": "list",
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": has_more,
        "data": data,
    });
    json_response(StatusCode::OK, &body)
}

/// The file a `POST /v1/files` body (a multipart form of `content_type`) uploads: its
/// name and content, once the form says `purpose=batch`; 400 naming what is wrong.
pub async fn read_upload(content_type: &str, body: Bytes) -> Result<(String, Bytes), Error> {
    let bad = |why: String| Error::new(Kind::BadRequest, why);
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
    file.ok_or_else(|| bad("the form has no `file` field".into()))
}

/// The file whose content `path` asks for (`/v1/files/{id}/content`).
fn content_of(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/files/")?.strip_suffix("/content")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
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
