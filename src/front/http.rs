//! The KServe v2 HTTP door, and JSON routes matched by path.
//!
//! First on the request path: it parses the path, bounds and reads the body, checks it
//! is a well-formed KServe v2 request (JSON or Triton's binary tensor extension),
//! reads the budget, asks the classifier, and hands the call to the tiers. Bodies pass
//! through byte for byte. Health and server metadata are answered here; model metadata
//! and readiness come from the route's backend, over control-plane pools that share
//! nothing with the tiers. Every inference answer carries `x-tiergate-tier` and
//! `x-tiergate-reason`; every error is `{"error": "..."}` with the status from
//! [`crate::error`].

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::batch_api::OfflineApi;
use super::body::BoxError;
use super::body::Stamp;
pub use super::body::{Answered, RequestBody};
pub use super::errors::{failure, failure_as, Shape};
use super::paths::{offline_path, target, Target, FILES, JOBS};
use crate::config::Limits;
use crate::decision::Door;
use crate::error::{Error, Kind};
use crate::headers::{self, Head};
use crate::metrics;
use crate::policy::Route;
use crate::protocol;
use crate::server::TooSlow;
use crate::tenant::Tenant;
use crate::timing::Line;
use crate::trace;
use tracing::Instrument;

use super::pipeline::dispatch::{unmatched_model, Dispatch, Served};

/// The HTTP door.
#[derive(Debug)]
pub struct HttpDoor {
    dispatch: Arc<Dispatch>,
    limits: Limits,
    offline: Option<OfflineApi>,
}

impl super::openai::JsonDoor for HttpDoor {
    fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// The limits the door enforces.
    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn read_body<B: RequestBody>(&self, body: B, max: usize) -> Result<Bytes, Error> {
        HttpDoor::read_body(self, body, max).await
    }

    async fn serve_json<B: RequestBody>(&self, route: Arc<Route>, req: Request<B>) -> Response<Answered> {
        HttpDoor::serve_json(self, route, req).await
    }
}

/// How a route's request body is checked before it is forwarded unchanged.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A KServe v2 infer request, JSON or binary extension.
    Kserve,
    /// Any JSON document (TF-Serving, OpenAI-style embeddings, ...).
    Json,
}

impl HttpDoor {
    /// What the door dispatches to (the routes' caches, for one).
    pub fn dispatch(&self) -> &Arc<Dispatch> {
        &self.dispatch
    }

    /// An HTTP door over `dispatch`, enforcing `limits`.
    pub fn new(dispatch: Arc<Dispatch>, limits: Limits) -> Self {
        HttpDoor {
            dispatch,
            limits,
            offline: None,
        }
    }

    /// The same door answering the offline tier's API: `/v1/jobs/{id}` and the Batch API.
    pub fn with_offline(mut self, api: OfflineApi) -> Self {
        self.offline = Some(api);
        self
    }

    /// Answers one request. Never fails: every problem becomes a response.
    ///
    /// Each path's work is boxed, so the future hyper keeps for every open connection
    /// (idle keep-alive ones too) stays small, and a request in flight holds only the
    /// state of the path it took.
    /// While the gateway drains, an HTTP/1.1 answer asks the client to close its
    /// connection, so its next request opens one to a replica that is not stopping.
    pub async fn answer<B: RequestBody>(self: Arc<Self>, mut req: Request<B>) -> Response<Answered> {
        let close = req.version() == http::Version::HTTP_11 && self.dispatch.draining();
        let mut response = match self.let_in(&mut req) {
            Ok(()) => self.route(req).await,
            Err(e) => {
                let mut refused = failure_as(&e, Shape::of(req.uri().path()));
                refused
                    .headers_mut()
                    .insert(trace::REQUEST_ID, trace::request_id(req.headers()));
                refused
            }
        };
        if close {
            response
                .headers_mut()
                .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        response
    }

    /// What every request passes before its path is looked at: a transfer coding the
    /// door can read, and (when the data plane authenticates) a known API key, whose
    /// [`Tenant`] the request then carries. The health checks need no key: probes and
    /// load balancers have none.
    fn let_in<B: RequestBody>(&self, req: &mut Request<B>) -> Result<(), Error> {
        // A body of known length (Content-Length, or none) has no transfer coding.
        if req.body().size_hint().exact().is_none() {
            if let Some(e) = unsupported_coding(req.headers()) {
                return Err(e);
            }
        }
        let callers = self.dispatch.callers();
        if !callers.required() || matches!(target(req.uri().path()), Target::Live | Target::Ready) {
            return Ok(());
        }
        let tenant = callers.authenticate(req.headers_mut())?;
        req.extensions_mut().insert(tenant);
        Ok(())
    }

    async fn route<B: RequestBody>(self: Arc<Self>, req: Request<B>) -> Response<Answered> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        // The infer paths answer with their request's ids (its trace's too); every
        // other answer carries the client's request id, or one made for it.
        match (target(&path), &method) {
            (Target::Model { name, rest: "/infer" }, &Method::POST) => {
                if let Some(route) = self.dispatch.policy().route_for_model(name).cloned() {
                    return Box::pin(self.serve(route, req, Body::Kserve)).await;
                }
            }
            (
                Target::Model {
                    name,
                    rest: rest @ ("/generate" | "/generate_stream"),
                },
                &Method::POST,
            ) => {
                if let Some(route) = self.dispatch.policy().route_for_model(name).cloned() {
                    return Box::pin(super::openai::generate(&*self, route, req, rest == "/generate_stream")).await;
                }
            }
            (Target::Other(p), &Method::POST) if crate::llm::openai::is_path(p) => {
                return Box::pin(super::openai::serve(&*self, req)).await;
            }
            (Target::Other(p), &Method::POST) if !(self.offline.is_some() && offline_path(p)) => {
                if let Some(route) = self.dispatch.policy().route_for_path(p).cloned() {
                    return Box::pin(super::openai::json_route(&*self, route, req)).await;
                }
            }
            (Target::Other("/v1/models"), _) => return super::openai::models(&*self, &method),
            _ => {}
        }
        let id = trace::request_id(req.headers());
        let mut response = Box::pin(self.other(req, &path, &method, &id)).await;
        if response.status().is_server_error() {
            let detail = match response.body() {
                Answered::Whole(Some(body), _) => String::from_utf8_lossy(body).into_owned(),
                _ => String::new(),
            };
            super::failures::log_answer(Door::Http, &path, response.status().as_u16(), &detail, &id);
        }
        response.headers_mut().insert(trace::REQUEST_ID, id);
        response
    }

    /// Every answer but an infer path's.
    async fn other<B: RequestBody>(
        self: Arc<Self>,
        req: Request<B>,
        path: &str,
        method: &Method,
        id: &HeaderValue,
    ) -> Response<Answered> {
        let shape = Shape::of(path);
        match (target(path), method) {
            (Target::Live, &Method::GET) => empty(StatusCode::OK),
            (Target::Ready, &Method::GET) => not_ready(&self.dispatch.not_ready()),
            (Target::Server, &Method::GET) => json(StatusCode::OK, server_metadata()),
            (Target::Model { name, rest: "/infer" }, &Method::POST) => failure(&unmatched_model("http", name)),
            (
                Target::Model {
                    rest: "/trace/setting", ..
                },
                _,
            ) => failure(&super::extensions::settings("trace settings")),
            (Target::Model { name, rest }, &Method::GET) if rest != "/infer" => {
                let (parts, _) = req.into_parts();
                match Box::pin(self.dispatch.control(name, Request::from_parts(parts, Bytes::new()))).await {
                    Ok(reply) if rest == "/stats" => scoped(reply.map(Answered::from)),
                    Ok(reply) => reply.map(Answered::from),
                    Err(e) => failure(&e),
                }
            }
            (Target::AllStats, &Method::GET) => Box::pin(self.all_stats(id)).await,
            (Target::SharedMemory { region, action }, _) => shared_memory(method, region, action),
            (Target::RepositoryIndex, &Method::POST) => match self.read_body(req.into_body(), REPOSITORY_BODY).await {
                Ok(body) => repository_index(&self.dispatch, &body),
                Err(e) => failure(&e),
            },
            (Target::ModelControl { name, action }, &Method::POST) if matches!(action, "load" | "unload") => {
                failure(&super::extensions::model_control(action, name))
            }
            (Target::Settings { what }, &Method::GET | &Method::POST) => failure(&super::extensions::settings(what)),
            (Target::Other(p), _) if self.offline.is_some() && offline_path(p) => Box::pin(self.offline(req)).await,
            (
                Target::Live
                | Target::Ready
                | Target::Server
                | Target::AllStats
                | Target::RepositoryIndex
                | Target::Settings { .. },
                _,
            )
            | (Target::Model { .. }, _) => failure_as(
                &Error::new(Kind::MethodNotAllowed, format!("{method} is not allowed on {path}")),
                shape,
            ),
            (Target::ModelControl { .. } | Target::Other(_), _) => not_found(method, path, shape),
        }
    }

    /// `GET /v2/models/stats`: every model's statistics, from the route serving each, as
    /// one `model_stats` list. A model its backend does not know is left out, as Triton
    /// lists only the models it has; so is one whose backend fails (logged, with `id`):
    /// the others are still answered.
    async fn all_stats(&self, id: &HeaderValue) -> Response<Answered> {
        let mut all = Vec::new();
        for model in self.dispatch.models() {
            let mut request = Request::new(Bytes::new());
            *request.uri_mut() = match format!("/v2/models/{model}/stats").parse() {
                Ok(uri) => uri,
                Err(_) => continue, // a name no path can carry has no statistics either
            };
            let why = match self.dispatch.control(&model, request).await {
                Ok(reply) if reply.status() == StatusCode::OK => {
                    let stats: serde_json::Value = serde_json::from_slice(reply.body()).unwrap_or_default();
                    match stats.get("model_stats").and_then(serde_json::Value::as_array) {
                        Some(models) => {
                            all.extend(models.iter().cloned());
                            continue;
                        }
                        None => "its statistics are not KServe v2 statistics".to_owned(),
                    }
                }
                Ok(reply) if reply.status() == StatusCode::NOT_FOUND => continue,
                Ok(reply) => format!("it answered {}", reply.status()),
                Err(e) => e.message,
            };
            super::failures::skipped_statistics(&model, "http", &why, id);
        }
        let body = serde_json::json!({ "model_stats": all });
        scoped(json(StatusCode::OK, Bytes::from(body.to_string())))
    }

    /// Answers the offline tier's API (`/v1/jobs/`, `/v1/files`, `/v1/batches`).
    async fn offline<B: RequestBody>(&self, req: Request<B>) -> Response<Answered> {
        let Some(api) = self.offline.as_ref() else {
            return failure(&Error::new(Kind::NotFound, "the offline tier is not running"));
        };
        let tenant = Tenant::of(&req);
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        let answered = async {
            if let Some(id) = path.strip_prefix(JOBS) {
                return super::job_status::answer(&api.store, &parts.method, id, &tenant)
                    .await
                    .map(|r| r.map(Answered::from));
            }
            let max = match path.starts_with(FILES) {
                true => api.settings.max_file_bytes,
                false => self.limits.max_body_bytes,
            };
            // Within the same budget as every door's bodies: an upload is held twice
            // (the body read, and the file taken out of its form) until it is stored.
            let mut ticket = self.dispatch.admission().admit_any()?;
            let declared = declared_length(&body).min(max);
            ticket.hold(declared.saturating_mul(2))?;
            let body = self.read_body(body, max).await?;
            ticket.hold(body.len().saturating_sub(declared).saturating_mul(2))?;
            let asked = super::batch_api::Asked {
                method: &parts.method,
                path,
                query: parts.uri.query(),
                headers: &parts.headers,
                tenant: &tenant,
            };
            api.answer(asked, body, &mut ticket).await
        };
        match answered.await {
            Ok(reply) => reply,
            Err(e) => failure_as(&e, Shape::Openai),
        }
    }

    /// [`HttpDoor::serve`] of a JSON route's request.
    async fn serve_json<B: RequestBody>(&self, route: Arc<Route>, req: Request<B>) -> Response<Answered> {
        self.serve(route, req, Body::Json).await
    }

    /// Reads and checks the body as `kind`, reads the metadata, classifies and serves.
    async fn serve<B: RequestBody>(&self, route: Arc<Route>, req: Request<B>, kind: Body) -> Response<Answered> {
        let head = Head::scan(req.headers(), (&route.rollout_key_header, &route.tenant_header));
        let mut ids = trace::Ids::of(head.traceparent.as_ref(), head.request_id.as_ref());
        let span = ids.span(Door::Http);
        let mut response = self
            .serve_traced(route, req, kind, (&ids, &head))
            .instrument(span)
            .await;
        ids.to_client(response.headers_mut());
        response
    }

    /// [`HttpDoor::serve`] inside the request's span: the door pipeline
    /// ([`super::pipeline`]), its own step reading and checking the body.
    async fn serve_traced<B: RequestBody>(
        &self,
        route: Arc<Route>,
        req: Request<B>,
        kind: Body,
        (ids, head): (&trace::Ids, &Head),
    ) -> Response<Answered> {
        let received = Instant::now();
        let tenant = Tenant::of(&req);
        let (mut parts, body) = req.into_parts();
        let shape = match kind {
            Body::Kserve => Shape::Kserve,
            Body::Json => Shape::of(parts.uri.path()),
        };
        let check = route.body_check;
        let coded = head.coded;
        let answer_coding = coded
            .then(|| super::encoding::take_accepted(&mut parts.headers))
            .flatten();
        let mut admitted = match self
            .dispatch
            .admit(Door::Http, route, (&parts.headers, &tenant), ids, received)
        {
            Ok(admitted) => admitted,
            Err(refused) => return render(*refused, shape, received),
        };
        let prepared = async {
            // Hold the declared length before reading, so a flood of large bodies is
            // shed before it is in memory; a body without one is held once read.
            let declared = declared_length(&body).min(self.limits.max_body_bytes);
            admitted.hold(declared)?;
            let body = self.read_body(body, self.limits.max_body_bytes).await?;
            admitted.hold(body.len().saturating_sub(declared))?;
            let body = match coded {
                true => {
                    let read = body.len().max(declared);
                    let decoded = super::encoding::decode(&mut parts.headers, body, self.limits.max_body_bytes)?;
                    admitted.hold(decoded.len().saturating_sub(read))?;
                    decoded
                }
                false => body,
            };
            let (timeout_us, id, sequence) = match kind {
                Body::Kserve => {
                    let header_len = protocol::header_len_of(head.header_len.as_ref()).map_err(bad_request)?;
                    let info = protocol::inspect_request(&body, header_len, check).map_err(bad_request)?;
                    (info.timeout_us, info.id, info.sequence)
                }
                Body::Json => {
                    serde_json::from_slice::<serde::de::IgnoredAny>(&body)
                        .map_err(|e| Error::new(Kind::BadRequest, format!("request body is not JSON: {e}")))?;
                    // serde_json ignores a value without its recursion limit.
                    let depth = protocol::scan::scan(&body).depth;
                    if depth > protocol::scan::MAX_DEPTH {
                        return Err(Error::new(
                            Kind::BadRequest,
                            format!(
                                "request body nests {depth} arrays and objects deep; at most {} are accepted",
                                protocol::scan::MAX_DEPTH
                            ),
                        ));
                    }
                    (None, None, None)
                }
            };
            let meta = admitted.meta_of(head, timeout_us, id.as_deref())?;
            Ok::<_, Error>((body, meta, sequence))
        };
        let mut served = match prepared.await {
            Ok((body, meta, sequence)) => {
                if let Some(sequence) = sequence {
                    parts.extensions.insert(sequence);
                }
                let served = admitted.serve(Request::from_parts(parts, body), meta).await;
                admitted.log_failure(&served);
                served
            }
            Err(e) => admitted.failed(e),
        };
        if let (Some(coding), Ok(reply)) = (answer_coding, served.result.as_mut()) {
            super::encoding::encode(reply, coding);
        }
        let response = render(served, shape, received);
        drop(admitted);
        response
    }

    /// Reads a body of at most `max` bytes. How long it may take, and how slowly it may
    /// come, is the listener's to enforce (`server::receive`): its [`TooSlow`] is a 408.
    pub(super) async fn read_body<B: RequestBody>(&self, body: B, max: usize) -> Result<Bytes, Error> {
        let declared = body.size_hint().exact();
        let too_large = || {
            Error::new(
                Kind::TooLarge,
                format!("request body is over the {max}-byte limit (limits.max_body_bytes, or offline.max_file_bytes for files)"),
            )
        };
        if declared.is_some_and(|n| n > max as u64) {
            return Err(too_large());
        }
        let room = declared.map_or(0, |n| n as usize);
        match gather(body, room, max).await {
            Ok(Some(body)) => Ok(body),
            Ok(None) => Err(too_large()),
            Err(e) => match e.downcast_ref::<TooSlow>() {
                Some(slow) => Err(Error::new(Kind::ClientTimeout, slow.to_string())),
                None => Err(Error::new(
                    Kind::BadRequest,
                    format!("could not read the request body: {e}"),
                )),
            },
        }
    }
}

/// `body` whole, or `None` past `max` bytes. A body that arrives in one piece is kept
/// as it came; one in several is gathered into one buffer of `room` bytes (its declared
/// length) reserved once, each piece dropped once copied: at most one copy of the body
/// is held, never the pieces and their concatenation together.
async fn gather<B: RequestBody>(body: B, room: usize, max: usize) -> Result<Option<Bytes>, BoxError> {
    let mut body = std::pin::pin!(body);
    let (mut first, mut rest) = (None::<Bytes>, bytes::BytesMut::new());
    while let Some(frame) = body.as_mut().frame().await {
        let Ok(data) = frame.map_err(Into::into)?.into_data() else {
            continue; // trailers: a model server has no use for them
        };
        let had = first.as_ref().map_or(rest.len(), Bytes::len);
        if had.saturating_add(data.len()) > max {
            return Ok(None);
        }
        if let Some(piece) = first.take() {
            rest.reserve(room.max(piece.len() + data.len()));
            rest.extend_from_slice(&piece);
        } else if rest.is_empty() {
            first = Some(data);
            continue;
        }
        rest.extend_from_slice(&data);
    }
    Ok(Some(first.unwrap_or_else(|| rest.freeze())))
}

/// A body's declared length (its `content-length`, as the server read it), 0 when
/// none is declared.
fn declared_length<B: RequestBody>(body: &B) -> usize {
    body.size_hint()
        .exact()
        .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn bad_request(e: protocol::Error) -> Error {
    Error::new(Kind::BadRequest, e.to_string())
}

/// Renders a served request: the backend's answer or the error, stamped (see
/// [`super::body::Stamp`]) with the decision's `x-tiergate-tier` and `x-tiergate-reason`
/// (a refusal carries its reason only; an answer the cache gave keeps the `cache`
/// reason it has), the policy version, and where the time since `received` went.
fn render(served: Served, shape: Shape, received: Instant) -> Response<Answered> {
    let (response, timing) = match served.result {
        Ok(mut reply) => {
            let parts = reply.extensions_mut().remove::<crate::timing::Noted>();
            let elapsed = served.elapsed.unwrap_or_else(|| received.elapsed());
            let tokens = reply.extensions_mut().remove::<crate::timing::Tokens>();
            let timing = Line::answer(parts, elapsed, served.tier_took).with_tokens(tokens);
            (Answered::of(reply), timing)
        }
        Err(e) => (failure_as(&e, shape), Line::error(received.elapsed())),
    };
    let (tier, reason) = match (served.decision, served.refusal) {
        (Some(d), _) => (Some(d.tier.as_str()), Some(d.reason.as_str())),
        (None, Some(refusal)) => (None, Some(refusal.as_str())),
        // An answer the cache gave says so (it had no decision).
        (None, None) => match response.headers().contains_key(headers::REASON) {
            true => (None, Some(crate::decision::CACHE_REASON)),
            false => (None, None),
        },
    };
    let stamp = Stamp {
        tier,
        reason,
        policy_version: served.policy_version,
        timing,
    };
    response.map(|body| body.stamped(stamp))
}

fn not_found(method: &Method, path: &str, shape: Shape) -> Response<Answered> {
    ::metrics::counter!(metrics::UNMATCHED, "door" => "http").increment(1);
    failure_as(
        &Error::new(Kind::NotFound, format!("no route serves {method} {path}")),
        shape,
    )
}

/// The largest `/v2/repository/index` body read (it says at most `{"ready": true}`).
const REPOSITORY_BODY: usize = 4096;

/// A transfer coding other than `chunked` (the only one the door decodes): refused
/// with 501, as RFC 9112 (6.1) asks, rather than read as if it were not there.
fn unsupported_coding(headers: &http::HeaderMap) -> Option<Error> {
    let codings = headers.get_all(http::header::TRANSFER_ENCODING);
    let other = codings
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|c| c.trim_ascii())
        .find(|c| !c.eq_ignore_ascii_case(b"chunked"))?;
    Some(Error::new(
        Kind::Unsupported,
        format!(
            "Transfer-Encoding {:?} is not supported: only chunked is; send the body without it (for a compressed \
             body, use Content-Encoding)",
            String::from_utf8_lossy(other)
        ),
    ))
}

/// Triton's shared-memory extension, which the gateway cannot offer: the client's
/// regions are on its own host, and the model servers are on others. Nothing is ever
/// registered: the status lists none, unregistering succeeds, registering is refused
/// saying why (as Triton refuses a region it cannot use).
fn shared_memory(method: &Method, region: Option<&str>, action: &str) -> Response<Answered> {
    use super::extensions::{shared_memory_register, shared_memory_status, shared_memory_unknown};
    let answered = match (method, action) {
        (&Method::GET, "status") => {
            shared_memory_status(region).map(|()| json(StatusCode::OK, Bytes::from_static(b"[]")))
        }
        (&Method::POST, "unregister") => Ok(empty(StatusCode::OK)),
        (&Method::POST, "register") => Err(shared_memory_register()),
        _ => Err(shared_memory_unknown(method.as_str(), action)),
    };
    answered.unwrap_or_else(|e| failure(&e))
}

/// `POST /v2/repository/index`: the models the policy routes, as Triton lists its
/// repository (`{"ready": true}` for the ready ones only).
fn repository_index(dispatch: &Dispatch, body: &[u8]) -> Response<Answered> {
    let ready = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("ready")?.as_bool())
        .unwrap_or(false);
    let models: Vec<serde_json::Value> = super::extensions::repository(dispatch, ready)
        .into_iter()
        .map(|m| {
            let mut entry = serde_json::json!({"name": m.name, "state": m.state()});
            if let Some(why) = m.not_ready {
                entry["reason"] = why.into();
            }
            entry
        })
        .collect();
    json(StatusCode::OK, Bytes::from(serde_json::Value::from(models).to_string()))
}

fn server_metadata() -> Bytes {
    let body = serde_json::json!({
        "name": "tiergate",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
    });
    Bytes::from(body.to_string())
}

fn json(status: StatusCode, body: Bytes) -> Response<Answered> {
    let mut response = Response::new(Answered::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `/v2/health/ready`: 200 with no body when ready, else 503 with every reason.
fn not_ready(reasons: &[super::ready::NotReady]) -> Response<Answered> {
    if reasons.is_empty() {
        return empty(StatusCode::OK);
    }
    let messages: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    let body = serde_json::json!({
        "error": format!("not ready: {}", messages.join("; ")),
        "reasons": reasons.iter().map(|r| r.reason()).collect::<Vec<_>>(),
    });
    json(StatusCode::SERVICE_UNAVAILABLE, Bytes::from(body.to_string()))
}

fn empty(status: StatusCode) -> Response<Answered> {
    let mut response = Response::new(Answered::from(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// A statistics answer, saying what its figures count (`x-tiergate-statistics`).
fn scoped(mut response: Response<Answered>) -> Response<Answered> {
    let scope = HeaderValue::from_static(headers::STATISTICS_SCOPE);
    response.headers_mut().insert(headers::STATISTICS, scope);
    response
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::HeaderMap;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    use super::*;

    fn pieces(
        parts: &[&'static [u8]],
    ) -> StreamBody<impl tokio_stream::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
        let frames: Vec<_> = parts.iter().map(|p| Ok(Frame::data(Bytes::from_static(p)))).collect();
        StreamBody::new(tokio_stream::iter(frames))
    }

    #[test]
    fn one_scan_of_the_head_finds_what_each_lookup_would() {
        let mut map = HeaderMap::new();
        for (name, value) in [
            ("x-tiergate-budget-ms", "250"),
            ("x-tiergate-budget-ms", "999"),
            ("grpc-timeout", "1S"),
            ("x-tiergate-priority", "critical"),
            ("prefer", "wait=5"),
            ("prefer", "handling=lenient, respond-async"),
            ("traceparent", "00-0000000000000000000000000000000a-000000000000000b-01"),
            ("x-request-id", "r-1"),
            ("inference-header-content-length", "42"),
            ("accept-encoding", "gzip"),
            ("x-user", "u-7"),
        ] {
            map.append(http::HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        let head = Head::scan(
            &map,
            (&http::HeaderName::from_static("x-user"), &crate::headers::PRIORITY),
        );
        assert_eq!(
            head.budget.as_ref(),
            map.get(headers::BUDGET),
            "the first value, as get gives"
        );
        assert_eq!(head.grpc_timeout.as_ref(), map.get(super::super::meta::GRPC_TIMEOUT));
        assert_eq!(head.priority.as_ref(), map.get(headers::PRIORITY));
        assert_eq!(head.traceparent.as_ref(), map.get(trace::TRACEPARENT));
        assert_eq!(head.request_id.as_ref(), map.get(trace::REQUEST_ID));
        assert_eq!(head.header_len.as_ref(), map.get(protocol::HEADER_LEN));
        assert_eq!(head.rollout_key.as_ref(), map.get("x-user"));
        assert_eq!(head.prefer_async, headers::prefers_async(&map));
        assert!(head.prefer_async && head.coded);
        let bare = Head::scan(&HeaderMap::new(), (&trace::REQUEST_ID, &trace::REQUEST_ID));
        assert!(bare.budget.is_none() && bare.rollout_key.is_none() && !bare.prefer_async && !bare.coded);
        // The rollout key may be a header the path reads for itself too.
        let by_id = Head::scan(&map, (&trace::REQUEST_ID, &trace::REQUEST_ID));
        assert_eq!(
            (by_id.rollout_key.as_ref(), by_id.request_id.as_ref()),
            (map.get("x-request-id"), map.get("x-request-id"))
        );
    }

    #[tokio::test]
    async fn a_body_is_gathered_whole_from_its_pieces_within_its_limit() {
        let one = gather(pieces(&[b"whole"]), 5, 5).await.expect("read");
        assert_eq!(one.as_deref(), Some(&b"whole"[..]));
        let several = gather(pieces(&[b"ab", b"cd", b"e"]), 5, 5).await.expect("read");
        assert_eq!(several.as_deref(), Some(&b"abcde"[..]));
        let undeclared = gather(pieces(&[b"ab", b"cd", b"e"]), 0, 5).await.expect("read");
        assert_eq!(undeclared.as_deref(), Some(&b"abcde"[..]));
        assert_eq!(gather(pieces(&[b"abc", b"def"]), 0, 5).await.expect("read"), None);
        assert_eq!(gather(pieces(&[b"abcdef"]), 0, 5).await.expect("read"), None);
        assert_eq!(
            gather(pieces(&[]), 0, 5).await.expect("read").as_deref(),
            Some(&b""[..])
        );
    }
}
