//! The HTTP door's LLM paths: OpenAI's (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/responses`, `/v1/embeddings`), routed by the body's `model` as LiteLLM and Envoy
//! AI Gateway route them, and `/v1/models`, answered from the routes; Triton's
//! generate extension (`/v2/models/M/generate` and `generate_stream`) on the route of
//! its model.
//!
//! A call's body is read first (within the gateway's body budget), for its `model`, and
//! whether it streams: several routes may share a path, each listing the models it
//! serves (a route listing none has the path to itself). An unknown model gets 404
//! `model_not_found`, in OpenAI's error shape. A streamed chat or completions call that
//! did not ask for its usage is sent asking for it (`stream_options.include_usage`), so
//! its tokens are counted exactly, and the relay takes that chunk out again: the caller
//! sees what it asked for. On a route with `[tokens]`, the call is held to its ceilings
//! and limits first ([`super::tokens`]). The call then takes the door's common path on
//! its route.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use super::body::{Answered, RequestBody};
use super::errors::{failure_as, Shape};
use super::pipeline::dispatch::Dispatch;
use crate::backend::stream::Wanted;
use crate::config::Limits;
use crate::error::{Error, Kind};
use crate::llm::openai::{self, Ask};
use crate::policy::Route;

/// What the LLM paths ask of the HTTP door (which implements it).
pub(super) trait JsonDoor: Sync {
    /// What it dispatches to.
    fn dispatch(&self) -> &Dispatch;
    /// Its limits.
    fn limits(&self) -> &Limits;
    /// A body read within `max` bytes and the door's time limits.
    fn read_body<B: RequestBody>(
        &self,
        body: B,
        max: usize,
    ) -> impl std::future::Future<Output = Result<Bytes, Error>> + Send;
    /// A JSON call served on `route` through the door's common path.
    fn serve_json<B: RequestBody>(
        &self,
        route: std::sync::Arc<Route>,
        req: Request<B>,
    ) -> impl std::future::Future<Output = Response<Answered>> + Send;
}

/// Serves a POST to OpenAI's `path` (one of [`openai::PATHS`]).
pub(super) async fn serve<B: RequestBody>(door: &impl JsonDoor, req: Request<B>) -> Response<Answered> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let read = async {
        // The body is read before the route is known: held in the gateway's budget
        // meanwhile, then let go (the route's admission holds it again).
        let mut ticket = door.dispatch().admission().admit_any()?;
        let declared = body.size_hint().exact().unwrap_or(0) as usize;
        ticket.hold(declared.min(door.limits().max_body_bytes))?;
        let read = door.read_body(body, door.limits().max_body_bytes).await?;
        super::encoding::decode(&mut parts.headers, read, door.limits().max_body_bytes)
    };
    let body = match read.await {
        Ok(body) => body,
        Err(e) => return failure_as(&e, Shape::Openai),
    };
    let ask = match Ask::of(&body) {
        Ok(ask) => ask,
        Err(why) => return failure_as(&Error::new(Kind::BadRequest, why), Shape::Openai),
    };
    let Some(model) = ask.model.as_deref() else {
        let e = Error::new(Kind::BadRequest, "you must provide a model parameter");
        return failure_as(&e, Shape::Openai);
    };
    let Some(route) = door.dispatch().policy().route_for_openai(&path, model).cloned() else {
        return model_not_found(model);
    };
    match ask.service_tier.as_deref().map(crate::decision::ServiceTier::parse) {
        Some(Err(why)) => return failure_as(&Error::new(Kind::BadRequest, why), Shape::Openai),
        Some(Ok(Some(hint))) => {
            parts.extensions.insert(hint);
        }
        Some(Ok(None)) | None => {}
    }
    let mut body = body;
    let mut headroom = None;
    if let Some(rules) = route.tokens.clone() {
        let tenant = route
            .tenant(&crate::tenant::Tenant::of_parts(&parts.extensions), &parts.headers)
            .to_owned();
        let offline = crate::headers::prefers_async(&parts.headers);
        let ledger = door.dispatch().usage();
        match super::tokens::hold(ledger, (&route, &rules), (&path, &tenant, offline), body).await {
            Ok(held) => {
                body = held.body;
                if let Some(reservation) = held.reservation {
                    parts.extensions.insert(reservation);
                }
                headroom = Some(held.headroom);
            }
            Err(refused) => return refused,
        }
    }
    if route.backend_priority {
        let band = band(&route, &parts);
        body = openai::with_priority(&body, band.vllm()).unwrap_or(body);
    }
    if ask.stream {
        let asks_usage = matches!(path.as_str(), "/v1/chat/completions" | "/v1/completions");
        let strip_usage = asks_usage && !ask.include_usage;
        if strip_usage {
            body = openai::asking_usage(&body).unwrap_or(body);
        }
        parts.extensions.insert(Wanted { strip_usage });
    }
    let request = Request::from_parts(parts, Full::new(body));
    let mut response = door.serve_json(route, request).await;
    if let Some(headroom) = headroom {
        super::tokens::headers_of(response.headers_mut(), &headroom);
    }
    response
}

/// The priority band of a call with `parts` on `route`: as its batch pool's scheduling
/// says (what it asked for in `x-tiergate-priority`, at most its tenant's ceiling),
/// else at most the standard band.
fn band(route: &Route, parts: &http::request::Parts) -> crate::policy::model::Priority {
    use crate::policy::model::Priority;
    let asked = parts
        .headers
        .get(crate::headers::PRIORITY)
        .and_then(|v| v.to_str().ok());
    match &route.micro_batch {
        Some(spec) => spec
            .scheduling
            .band(asked, &crate::tenant::Tenant::of_parts(&parts.extensions)),
        None => asked
            .and_then(Priority::parse)
            .map_or(Priority::Standard, |p| p.min(Priority::Standard)),
    }
}

/// Triton's generate extension for `route`'s model (`stream`: `generate_stream`): a
/// JSON body passed on as it is, its answer whole or its events relayed.
pub(super) async fn generate<B: RequestBody>(
    door: &impl JsonDoor,
    route: std::sync::Arc<Route>,
    mut req: Request<B>,
    stream: bool,
) -> Response<Answered> {
    if stream {
        req.extensions_mut().insert(Wanted { strip_usage: false });
    }
    door.serve_json(route, req).await
}

/// A JSON route's call: a stream when its caller accepts one (`accept:
/// text/event-stream`), relayed as it comes; else answered whole.
pub(super) async fn json_route<B: RequestBody>(
    door: &impl JsonDoor,
    route: std::sync::Arc<Route>,
    mut req: Request<B>,
) -> Response<Answered> {
    let accepts = req.headers().get_all(http::header::ACCEPT).iter().any(|v| {
        v.as_bytes()
            .windows(17)
            .any(|w| w.eq_ignore_ascii_case(b"text/event-stream"))
    });
    if accepts {
        req.extensions_mut().insert(Wanted { strip_usage: false });
    }
    door.serve_json(route, req).await
}

/// `GET /v1/models`: the models routes serve on OpenAI's paths.
pub(super) fn models(door: &impl JsonDoor, method: &Method) -> Response<Answered> {
    if method != Method::GET {
        let e = Error::new(Kind::MethodNotAllowed, "/v1/models takes GET");
        return failure_as(&e, Shape::Openai);
    }
    let policy = door.dispatch().policy();
    let data: Vec<serde_json::Value> = policy
        .openai_models()
        .into_iter()
        .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "tiergate"}))
        .collect();
    let body = serde_json::json!({"object": "list", "data": data});
    answer(StatusCode::OK, Bytes::from(body.to_string()))
}

/// OpenAI's 404 for a model no route serves.
fn model_not_found(model: &str) -> Response<Answered> {
    let body = serde_json::json!({"error": {
        "message": format!("The model `{model}` does not exist or no route serves it on this path"),
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }});
    ::metrics::counter!(crate::metrics::UNMATCHED, "door" => "http").increment(1);
    answer(StatusCode::NOT_FOUND, Bytes::from(body.to_string()))
}

fn answer(status: StatusCode, body: Bytes) -> Response<Answered> {
    let mut response = Response::new(Answered::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
