//! The bridge between KServe v2 over HTTP and over gRPC: one call, one answer, one
//! error, converted exactly in either direction.
//!
//! Used wherever the two protocols meet: the gRPC door (gRPC client, HTTP form inside),
//! gRPC backends (HTTP form inside, gRPC backend) and the simulator's gRPC side.

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use serde_json::{json, Value};
use tonic::{Code, Status};

use super::pb::{self, model_metadata_response::TensorMetadata};
use super::response_to_grpc;
use crate::protocol::{self, InferRequest, InferResponse, Tensor};

/// Content type of a protobuf message carried over HTTP inside the gateway (model config
/// and statistics passed through from gRPC backends).
pub const PROTOBUF: &str = "application/x-protobuf";

/// The gRPC metadata key for one of the gateway's header names (lowercase ASCII, none
/// ending in `-bin`, so always a valid ASCII key).
pub fn metadata_key(name: &http::HeaderName) -> tonic::metadata::MetadataKey<tonic::metadata::Ascii> {
    tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes()).expect("a header name is a valid ASCII key")
}

/// The KServe v2 HTTP form of an infer request: binary tensors; with `binary_outputs`,
/// every output is asked back in binary too (exact, and what a gRPC caller needs).
pub fn http_infer_request(
    model: &str,
    version: Option<&str>,
    mut req: InferRequest,
    binary_outputs: bool,
) -> Request<Bytes> {
    if binary_outputs {
        ask_binary_outputs(&mut req);
    }
    let (body, header_len) = protocol::encode_request(&req, true);
    let mut request = Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = model_path(model, version, "/infer");
    protocol::set_framing(request.headers_mut(), header_len);
    request
}

/// Asks for every output in the binary section, leaving explicit per-output choices be.
pub fn ask_binary_outputs(req: &mut InferRequest) {
    if req.outputs.is_empty() {
        req.parameters.insert("binary_data_output".into(), Value::Bool(true));
    }
    for out in &mut req.outputs {
        out.binary_data.get_or_insert(true);
    }
}

/// The HTTP path of a model endpoint (`suffix`: "", "/ready", "/infer", "/config").
pub fn model_path(model: &str, version: Option<&str>, suffix: &str) -> http::Uri {
    let path = match version.filter(|v| !v.is_empty()) {
        Some(v) => format!("/v2/models/{model}/versions/{v}{suffix}"),
        None => format!("/v2/models/{model}{suffix}"),
    };
    path.parse()
        .unwrap_or_else(|_| http::Uri::from_static("/v2/models/invalid"))
}

/// A KServe v2 HTTP answer to an infer request as a gRPC answer.
pub fn infer_response_from_http(reply: Response<Bytes>) -> Result<pb::ModelInferResponse, Status> {
    let (head, body) = reply.into_parts();
    if !head.status.is_success() {
        return Err(status_from_http(head.status, &body));
    }
    let header_len = protocol::header_len(&head.headers).map_err(|e| not_kserve(&e))?;
    let decoded = protocol::decode_response(&body, header_len).map_err(|e| not_kserve(&e))?;
    Ok(response_to_grpc(&decoded))
}

/// A gRPC infer answer as the KServe v2 HTTP answer, each output in binary when
/// `binary(output)` says so.
pub fn infer_response_to_http(resp: &InferResponse, binary: &dyn Fn(&Tensor) -> bool) -> Response<Bytes> {
    let (body, header_len) = protocol::encode_response(resp, binary);
    let mut reply = Response::new(body);
    protocol::set_framing(reply.headers_mut(), header_len);
    reply
}

/// An HTTP error answer (`{"error": "..."}`) as the gRPC status a gRPC server would give.
pub fn status_from_http(code: StatusCode, body: &[u8]) -> Status {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let grpc = match code.as_u16() {
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        413 | 429 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        502 | 503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    };
    Status::new(grpc, message)
}

/// A gRPC error as the HTTP error answer an HTTP server would give.
pub fn status_to_http(status: &Status) -> Response<Bytes> {
    let code = match status.code() {
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut reply = Response::new(protocol::error_body(status.message()));
    *reply.status_mut() = code;
    reply
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

/// Model metadata from its KServe v2 JSON form.
pub fn metadata_from_json(body: &[u8]) -> Result<pb::ModelMetadataResponse, Status> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Status::unavailable(format!("the backend's model metadata is not JSON: {e}")))?;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let tensors = |k: &str| -> Vec<TensorMetadata> {
        let list = v
            .get(k)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        list.iter()
            .map(|t| TensorMetadata {
                name: text(t, "name"),
                datatype: text(t, "datatype"),
                shape: t
                    .get("shape")
                    .and_then(Value::as_array)
                    .map(|s| s.iter().filter_map(Value::as_i64).collect())
                    .unwrap_or_default(),
            })
            .collect()
    };
    let versions = v
        .get("versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    Ok(pb::ModelMetadataResponse {
        name: text(&v, "name"),
        versions: versions.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        platform: text(&v, "platform"),
        inputs: tensors("inputs"),
        outputs: tensors("outputs"),
    })
}

/// Model metadata in its KServe v2 JSON form.
pub fn metadata_to_json(m: &pb::ModelMetadataResponse) -> Bytes {
    let tensors = |ts: &[TensorMetadata]| -> Vec<Value> {
        ts.iter()
            .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
            .collect()
    };
    let body = json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
    });
    Bytes::from(body.to_string())
}

/// The responses of one request on a `ModelStreamInfer` stream, as they come: one for
/// a model that answers once, 0..N for a decoupled model.
pub type Answers = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = pb::ModelStreamInferResponse> + Send>>;

/// A `ModelStreamInfer` response stream: `inbound`'s requests served in turn by
/// `serve`, each request's responses sent as they come; it stops when the client goes
/// away, dropping the request's work in progress (its backend call with it).
pub fn stream_in_order<F, Fut>(mut inbound: tonic::Streaming<pb::ModelInferRequest>, serve: F) -> InferStream
where
    F: Fn(pb::ModelInferRequest) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Answers> + Send,
{
    use tokio_stream::StreamExt as _;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let msg = match inbound.message().await {
                Ok(Some(msg)) => msg,
                Ok(None) => return,
                Err(status) => {
                    let _ = tx.send(Err(client_status(status))).await;
                    return;
                }
            };
            let mut answers = tokio::select! {
                answers = serve(msg) => answers,
                () = tx.closed() => return, // the client went away
            };
            loop {
                let next = tokio::select! {
                    next = answers.next() => next,
                    () = tx.closed() => return,
                };
                let Some(item) = next else { break };
                if tx.send(Ok(item)).await.is_err() {
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The one response of request `id` answered once: its answer, or its error message.
pub fn answered_once(id: String, answered: Result<pb::ModelInferResponse, Status>) -> Answers {
    let item = match answered {
        Ok(response) => pb::ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        },
        Err(status) => pb::ModelStreamInferResponse {
            error_message: status.message().to_owned(),
            infer_response: Some(pb::ModelInferResponse {
                id,
                ..Default::default()
            }),
        },
    };
    Box::pin(tokio_stream::once(item))
}

/// tonic refuses a message over the decoding limit with OUT_OF_RANGE and this message;
/// Triton (gRPC's C core) answers RESOURCE_EXHAUSTED, as the gateway does for every
/// other size limit.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// How tonic's framing layer says that a client's message could not be read (a
/// compressed flag without a coding, a flag that is neither 0 nor 1, a compressed
/// message that does not decompress, a message cut short): INTERNAL from tonic, but the
/// client's mistake, so INVALID_ARGUMENT here, as for a message that does not decode
/// and as the HTTP door answers such a body (400).
const UNREADABLE: [&str; 3] = [
    "protocol error: received message with",
    "Error decompressing",
    "Unexpected EOF decoding stream",
];

/// The code a call's status (its code and message, as tonic wrote them) is answered
/// with instead, when tonic's differs from the gateway's rule: RESOURCE_EXHAUSTED for
/// its refusal of a message over the size limit (`"8"`), INVALID_ARGUMENT for a message
/// its framing could not read (`"3"`).
pub fn client_code(code: &str, message: &str) -> Option<&'static str> {
    match code {
        "11" if message.starts_with(TOO_LARGE) => Some("8"),
        "13" if UNREADABLE.iter().any(|p| message.starts_with(p)) => Some("3"),
        _ => None,
    }
}

/// `status`, with its code as [`client_code`] says.
pub fn client_status(status: Status) -> Status {
    let code = (status.code() as i32).to_string();
    match client_code(&code, status.message()) {
        Some("8") => Status::resource_exhausted(status.message()),
        Some(_) => Status::invalid_argument(status.message()),
        None => status,
    }
}

/// The response stream of `ModelStreamInfer`.
pub type InferStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send + 'static>>;

fn not_kserve(e: &protocol::Error) -> Status {
    Status::unavailable(format!("the backend's answer is not a KServe v2 response: {e}"))
}
