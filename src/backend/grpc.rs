//! Calls to backends that speak KServe v2 over gRPC (`grpc://` endpoints).
//!
//! The tiers hand every pool the KServe v2 HTTP form of a request. For a gRPC endpoint
//! this module converts it exactly (`protocol::grpc`), calls the backend with the time
//! left in the budget as its gRPC deadline, and converts the answer back to the HTTP
//! form the client's door expects: outputs in binary or JSON as the request asked.
//! Model config and statistics pass through as protobuf bytes when the caller accepts
//! them (the gRPC door does), and are converted to Triton's JSON for the HTTP door.

use std::time::Duration;

use bytes::Bytes;
use http::{request::Parts, Method, Response, StatusCode};
use prost::Message;
use serde_json::Value;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::endpoint::Failure;
use super::tls::Trust;
use crate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::protocol::grpc::{bridge, config, pb, request_to_grpc, response_from_grpc};
use crate::protocol::{self, InferRequest, Tensor};

/// A gRPC client for one endpoint.
pub(super) type Client = GrpcInferenceServiceClient<Channel>;

/// A lazily connected client for `authority`, over TLS verified against `trust` when
/// given (`grpcs://`), reading answers up to `max_response_bytes`.
pub(super) fn client(
    authority: &http::uri::Authority,
    trust: Option<&Trust>,
    connect_timeout: Duration,
    max_response_bytes: usize,
) -> Client {
    let scheme = if trust.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{authority}"))
        .expect("an authority from a validated policy makes a valid URI")
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    if let Some(trust) = trust {
        endpoint = endpoint
            .tls_config(trust.grpc(authority))
            .expect("a validated policy's TLS endpoints have valid server names");
    }
    GrpcInferenceServiceClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(max_response_bytes)
        .max_encoding_message_size(usize::MAX)
}

/// Serves one HTTP-form request on a gRPC backend, passing the time left until
/// `deadline` as the call's gRPC deadline.
pub(super) async fn call(
    mut client: Client,
    parts: &Parts,
    body: Bytes,
    deadline: Instant,
) -> Result<Response<Bytes>, Failure> {
    let budget = deadline.saturating_duration_since(Instant::now());
    let Some((model, version, rest)) = model_path(parts.uri.path()) else {
        return Ok(answer(
            StatusCode::NOT_FOUND,
            "gRPC backends serve /v2/models/... paths only",
        ));
    };
    let wants_protobuf = parts
        .headers
        .get(http::header::ACCEPT)
        .is_some_and(|v| v == bridge::PROTOBUF);
    let version = version.unwrap_or_default().to_owned();
    let result = match (&parts.method, rest) {
        (&Method::POST, "/infer") => return infer(client, parts, &body, model, &version, deadline).await,
        (&Method::POST, protocol::INFER_STREAM) => {
            return decoupled(client, parts, &body, (model, &version), deadline).await
        }
        (&Method::GET, "") => client
            .model_metadata(with_deadline(
                pb::ModelMetadataRequest {
                    name: model.into(),
                    version,
                },
                budget,
            ))
            .await
            .map(|r| json(bridge::metadata_to_json(&r.into_inner()))),
        (&Method::GET, "/ready") => client
            .model_ready(with_deadline(
                pb::ModelReadyRequest {
                    name: model.into(),
                    version,
                },
                budget,
            ))
            .await
            .map(|r| match r.into_inner().ready {
                true => answer(StatusCode::OK, ""),
                false => answer(StatusCode::SERVICE_UNAVAILABLE, "the model is not ready"),
            }),
        (&Method::GET, "/config") => client
            .model_config(with_deadline(
                pb::ModelConfigRequest {
                    name: model.into(),
                    version,
                },
                budget,
            ))
            .await
            .map(|r| match wants_protobuf {
                true => protobuf(r.into_inner().config),
                false => converted(config::config_to_json(&r.into_inner().config)),
            }),
        (&Method::GET, "/stats") => client
            .model_statistics(with_deadline(
                pb::ModelStatisticsRequest {
                    name: model.into(),
                    version,
                },
                budget,
            ))
            .await
            .map(|r| match wants_protobuf {
                true => protobuf(Bytes::from(r.into_inner().encode_to_vec())),
                false => converted(config::statistics_to_json(&r.into_inner().model_stats)),
            }),
        _ => return Ok(answer(StatusCode::NOT_FOUND, "no such model endpoint")),
    };
    result.or_else(|status| backend_status(status, deadline))
}

async fn infer(
    mut client: Client,
    parts: &Parts,
    body: &Bytes,
    model: &str,
    version: &str,
    deadline: Instant,
) -> Result<Response<Bytes>, Failure> {
    let budget = deadline.saturating_duration_since(Instant::now());
    let request = match decoded(parts, body) {
        Ok(request) => request,
        Err(why) => return Ok(answer(StatusCode::BAD_REQUEST, &why)),
    };
    let mut msg = with_deadline(request_to_grpc(model, Some(version), &request), budget);
    traced(&mut msg, parts);
    match client.model_infer(msg).await {
        Ok(reply) => match response_from_grpc(reply.into_inner()) {
            Ok(decoded) => Ok(bridge::infer_response_to_http(&decoded, &|t: &Tensor| {
                wants_binary(&request, t)
            })),
            Err(e) => Err(Failure::Other(format!(
                "the answer is not a valid ModelInferResponse: {e}"
            ))),
        },
        Err(status) => backend_status(status, deadline),
    }
}

/// One request to a decoupled model (0..N responses, `ModelStreamInfer`): the
/// request sent alone on a stream of its own, half-closed, and the responses handed up
/// as they come as a `text/event-stream` answer ([`super::stream::Raw`]), one event a
/// response in KServe v2's JSON (its `triton_final_response` parameter kept), a
/// response's error as Triton's error event. The stream's budget is its first
/// response: no gRPC deadline, the relay holds it to its first token and its idle and
/// duration limits. Dropping the body resets the backend's stream: Triton cancels the
/// request.
async fn decoupled(
    mut client: Client,
    parts: &Parts,
    body: &Bytes,
    (model, version): (&str, &str),
    deadline: Instant,
) -> Result<Response<Bytes>, Failure> {
    use http_body_util::BodyExt as _;
    use tokio_stream::StreamExt as _;
    let request = match decoded(parts, body) {
        Ok(request) => request,
        Err(why) => return Ok(answer(StatusCode::BAD_REQUEST, &why)),
    };
    let msg = request_to_grpc(model, Some(version), &request);
    let mut call = tonic::Request::new(tokio_stream::once(msg));
    traced(&mut call, parts);
    let responses = match client.model_stream_infer(call).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return backend_status(status, deadline),
    };
    let events = responses.map(
        |item| -> Result<hyper::body::Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
            let item = item.map_err(|status| format!("the backend's stream failed: {}", status.message()))?;
            if !item.error_message.is_empty() {
                return Ok(hyper::body::Frame::data(crate::llm::openai::triton_error_event(
                    &item.error_message,
                )));
            }
            let response = item.infer_response.unwrap_or_default();
            let decoded = response_from_grpc(response)
                .map_err(|e| format!("a response is not a valid ModelInferResponse: {e}"))?;
            let json = bridge::infer_response_to_http(&decoded, &|_: &Tensor| false).into_body();
            Ok(hyper::body::Frame::data(crate::llm::sse::data_event(&json)))
        },
    );
    let mut answer = Response::new(Bytes::new());
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    let body = http_body_util::StreamBody::new(events).boxed_unsync();
    answer.extensions_mut().insert(super::stream::Raw::new(body));
    Ok(answer)
}

/// The KServe v2 request an HTTP-form request carries, or what is wrong with it.
fn decoded(parts: &Parts, body: &Bytes) -> Result<InferRequest, String> {
    let header_len = protocol::header_len(&parts.headers).map_err(|e| e.to_string())?;
    protocol::decode_request(body, header_len).map_err(|e| e.to_string())
}

/// `call` carrying the request's trace context and id as metadata.
fn traced<T>(call: &mut tonic::Request<T>, parts: &Parts) {
    for name in [crate::trace::TRACEPARENT, crate::trace::REQUEST_ID] {
        if let Some(value) = parts.headers.get(&name).and_then(|v| v.to_str().ok()) {
            if let Ok(value) = value.parse() {
                call.metadata_mut().insert(bridge::metadata_key(&name), value);
            }
        }
    }
}

/// A gRPC request whose deadline (`grpc-timeout`) is the time left in the budget.
fn with_deadline<T>(msg: T, budget: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(budget);
    req
}

/// Whether the client asked for output `t` in binary: per output, else for all.
fn wants_binary(request: &InferRequest, t: &Tensor) -> bool {
    let all = request
        .parameters
        .get("binary_data_output")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let one = request
        .outputs
        .iter()
        .find(|o| o.name == t.name)
        .and_then(|o| o.binary_data);
    one.unwrap_or(all)
}

/// A backend's gRPC error: its own answer (as HTTP), unless the call never reached it
/// or the deadline passed (tonic's own timeout may fire a moment before ours).
fn backend_status(status: tonic::Status, deadline: Instant) -> Result<Response<Bytes>, Failure> {
    if Instant::now() >= deadline {
        return Err(Failure::Deadline);
    }
    let transport = std::error::Error::source(&status).is_some_and(|s| s.is::<tonic::transport::Error>());
    if !transport {
        return Ok(bridge::status_to_http(&status));
    }
    let detail = super::endpoint::chain(&status);
    if status.message().contains("connect") {
        Err(Failure::Connect(detail))
    } else {
        Err(Failure::Other(detail))
    }
}

/// `/v2/models/{m}[/versions/{v}]{rest}` → (m, v, rest).
fn model_path(path: &str) -> Option<(&str, Option<&str>, &str)> {
    let tail = path.strip_prefix("/v2/models/")?;
    let (model, rest) = tail.split_at(tail.find('/').unwrap_or(tail.len()));
    match rest.strip_prefix("/versions/") {
        Some(after) => {
            let (version, rest) = after.split_at(after.find('/').unwrap_or(after.len()));
            Some((model, Some(version), rest))
        }
        None => Some((model, None, rest)),
    }
    .filter(|(m, _, _)| !m.is_empty())
}

fn answer(status: StatusCode, message: &str) -> Response<Bytes> {
    let mut reply = Response::new(if message.is_empty() {
        Bytes::new()
    } else {
        protocol::error_body(message)
    });
    *reply.status_mut() = status;
    reply
}

fn json(body: Bytes) -> Response<Bytes> {
    let mut reply = Response::new(body);
    reply.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    reply
}

/// A model config or statistics converted to JSON; 502 when the backend's does not decode.
fn converted(json_or_problem: Result<Bytes, String>) -> Response<Bytes> {
    match json_or_problem {
        Ok(body) => json(body),
        Err(problem) => answer(StatusCode::BAD_GATEWAY, &problem),
    }
}

fn protobuf(body: Bytes) -> Response<Bytes> {
    let mut reply = Response::new(body);
    reply.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(bridge::PROTOBUF),
    );
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_paths() {
        assert_eq!(model_path("/v2/models/m/infer"), Some(("m", None, "/infer")));
        assert_eq!(
            model_path("/v2/models/m/versions/2/ready"),
            Some(("m", Some("2"), "/ready"))
        );
        assert_eq!(model_path("/v2/models/m"), Some(("m", None, "")));
        assert_eq!(model_path("/v2/models/"), None);
        assert_eq!(model_path("/v2/health/live"), None);
    }
}
