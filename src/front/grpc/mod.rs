//! The KServe v2 gRPC door: `inference.GRPCInferenceService` on Triton's port 8001.
//!
//! First on the request path for gRPC clients (tritonclient's gRPC flavour and any
//! KServe v2 gRPC client). An infer request is checked and converted exactly to the
//! KServe v2 HTTP form (binary tensor extension) that the tiers carry, served through
//! the same [`Dispatch`] as the HTTP door, and the answer converted back. The budget
//! comes from the gRPC deadline (`grpc-timeout`) or the request's `timeout` parameter;
//! tier and reason travel as response metadata; errors map through the same table as
//! HTTP, with `google.rpc.RetryInfo` where waiting helps. Model config and statistics
//! come from the route's backend: as they are from a gRPC one, converted from Triton's
//! JSON from an HTTP one (`protocol::grpc::config`).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use serde_json::Value;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tracing::Instrument;

use crate::headers;
use crate::tenant::Tenant;
use crate::trace;
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};

use crate::config::{Compression, Limits};
use crate::decision::Door;
use crate::error::{Error, Kind};
use crate::protocol::grpc::pb::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::protocol::grpc::{bridge, config, pb, request_from_grpc};
use crate::protocol::Reply;
use crate::timing::Line;

use super::meta;
use super::pipeline::dispatch::{unmatched_model, Dispatch, Served};

mod decoupled;
mod service;

/// The gRPC door.
#[derive(Debug, Clone)]
pub struct GrpcDoor {
    dispatch: Arc<Dispatch>,
    /// Whether each model is decoupled, as its backend's config said, with the policy
    /// version it was read under (see `decoupled`).
    decoupled: Arc<dashmap::DashMap<String, (u64, bool)>>,
}

/// A served infer call rendered for gRPC: the message (or status) and the metadata
/// sent with it.
type Rendered = (MetadataMap, Result<pb::ModelInferResponse, Status>);

impl GrpcDoor {
    /// A gRPC door over `dispatch`.
    pub fn new(dispatch: Arc<Dispatch>) -> Self {
        GrpcDoor {
            dispatch,
            decoupled: Arc::default(),
        }
    }

    /// The tonic service, refusing messages over `limits.max_body_bytes` (once
    /// decompressed) and sending none over `limits.max_response_bytes`; as Triton, it
    /// reads gzip and deflate messages, and compresses answers as `answers` says for a
    /// client that accepts it (uncompressed by default, as Triton).
    pub fn service(self, limits: &Limits, answers: Compression) -> GrpcInferenceServiceServer<GrpcDoor> {
        use tonic::codec::CompressionEncoding::{Deflate, Gzip};
        let service = GrpcInferenceServiceServer::new(self)
            .max_decoding_message_size(limits.max_body_bytes)
            .max_encoding_message_size(limits.max_response_bytes)
            .accept_compressed(Gzip)
            .accept_compressed(Deflate);
        match answers {
            Compression::None => service,
            Compression::Gzip => service.send_compressed(Gzip),
            Compression::Deflate => service.send_compressed(Deflate),
        }
    }

    /// Serves one infer request of `tenant`'s; `headers` are the call's metadata as HTTP
    /// headers.
    async fn infer(&self, (headers, tenant): (&HeaderMap, &Tenant), msg: pb::ModelInferRequest) -> Rendered {
        let mut ids = trace::Ids::read(headers);
        let span = ids.span(Door::Grpc);
        let (mut metadata, result) = self.infer_traced((headers, tenant), msg, &ids).instrument(span).await;
        for (name, value) in [
            (trace::REQUEST_ID, ids.request_id.to_str().ok().map(str::to_owned)),
            (trace::TRACERESPONSE, ids.traceresponse().map(|t| t.to_string())),
        ] {
            if let Some(value) = value.and_then(|v| v.parse().ok()) {
                metadata.insert(bridge::metadata_key(&name), value);
            }
        }
        (metadata, result)
    }

    /// [`GrpcDoor::infer`] inside the request's span: the door pipeline
    /// ([`super::pipeline`]), its own step converting the message.
    async fn infer_traced(
        &self,
        (headers, tenant): (&HeaderMap, &Tenant),
        msg: pb::ModelInferRequest,
        ids: &trace::Ids,
    ) -> Rendered {
        let received = Instant::now();
        let Some(route) = self.dispatch.policy().route_for_model(&msg.model_name).cloned() else {
            return (
                MetadataMap::new(),
                Err(status(&unmatched_model("grpc", &msg.model_name))),
            );
        };
        // Read from the request by the tiers, as they read an HTTP request's headers.
        let carried = [route.tenant_header.clone(), headers::PRIORITY];
        let mut admitted = match self.dispatch.admit(Door::Grpc, route, (headers, tenant), ids, received) {
            Ok(admitted) => admitted,
            Err(refused) => return render(*refused, received),
        };
        if let Err(e) = admitted.hold(prost::Message::encoded_len(&msg)) {
            return render(admitted.failed(e), received);
        }
        let model = msg.model_name.clone();
        let version = Some(msg.model_version.clone()).filter(|v| !v.is_empty());
        let prepared = request_from_grpc(msg)
            .map_err(|e| Error::new(Kind::BadRequest, e.to_string()))
            .and_then(|req| {
                let timeout_us = req.parameters.get("timeout").and_then(Value::as_u64);
                let meta = admitted.meta(headers, timeout_us, req.id.as_deref())?;
                let sequence = crate::protocol::sequence(&req.parameters)
                    .map_err(|e| Error::new(Kind::BadRequest, e.to_string()))?;
                let mut request = bridge::http_infer_request(&model, version.as_deref(), req, true);
                for name in carried {
                    if let Some(value) = headers.get(&name) {
                        request.headers_mut().insert(name, value.clone());
                    }
                }
                if let Some(sequence) = sequence {
                    request.extensions_mut().insert(sequence);
                }
                Ok((request, meta))
            });
        let served = match prepared {
            Ok((request, meta)) => {
                let served = admitted.serve(request, meta).await;
                admitted.log_failure(&served);
                served
            }
            Err(e) => admitted.failed(e),
        };
        let rendered = render(served, received);
        drop(admitted);
        rendered
    }

    /// A model GET on the route's backend; `accept` asks a gRPC backend for protobuf.
    async fn control(
        &self,
        model: &str,
        version: &str,
        suffix: &str,
        accept: Option<&'static str>,
    ) -> Result<Reply, Status> {
        let mut request = Request::new(Bytes::new());
        *request.uri_mut() = bridge::model_path(model, Some(version), suffix);
        if let Some(accept) = accept {
            request
                .headers_mut()
                .insert(http::header::ACCEPT, HeaderValue::from_static(accept));
        }
        self.dispatch.control(model, request).await.map_err(|e| status(&e))
    }

    /// One model's config: a gRPC backend's as it is, an HTTP backend's converted.
    async fn config(&self, model: &str, version: &str) -> Result<Bytes, Status> {
        match self.model_get(model, version, "/config").await? {
            Answer::Protobuf(config) => Ok(config),
            Answer::Json(json) => config::config_from_json(&json).map_err(Status::unavailable),
        }
    }

    /// One model's statistics: a gRPC backend's whole ModelStatisticsResponse as it is,
    /// an HTTP backend's converted.
    async fn statistics(&self, model: &str, version: &str) -> Result<pb::ModelStatisticsResponse, Status> {
        match self.model_get(model, version, "/stats").await? {
            Answer::Protobuf(encoded) => <pb::ModelStatisticsResponse as prost::Message>::decode(encoded)
                .map_err(|e| Status::unavailable(format!("the backend's statistics do not decode: {e}"))),
            Answer::Json(json) => config::statistics_from_json(&json)
                .map(|model_stats| pb::ModelStatisticsResponse { model_stats })
                .map_err(Status::unavailable),
        }
    }

    /// Model config or statistics from the route's backend: protobuf from a gRPC
    /// backend (asked for it), JSON from an HTTP one.
    async fn model_get(&self, model: &str, version: &str, suffix: &str) -> Result<Answer, Status> {
        let reply = self.control(model, version, suffix, Some(bridge::PROTOBUF)).await?;
        if !reply.status().is_success() {
            return Err(bridge::status_from_http(reply.status(), reply.body()));
        }
        let protobuf = reply
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v == bridge::PROTOBUF);
        Ok(match protobuf {
            true => Answer::Protobuf(reply.into_body()),
            false => Answer::Json(reply.into_body()),
        })
    }
}

/// A backend's model config or statistics, in the form its protocol gave.
enum Answer {
    Protobuf(Bytes),
    Json(Bytes),
}

/// Renders a served request for gRPC, with the decision as metadata (the HTTP door's
/// `render` does the same in headers), and `server-timing` closed with the time since
/// `received` (see [`crate::timing`]): in the answer's metadata, or an error's.
fn render(mut served: Served, received: Instant) -> Rendered {
    let mut pairs: Vec<(http::HeaderName, &'static str)> = Vec::with_capacity(2);
    if let Some(d) = served.decision {
        pairs.extend([(headers::TIER, d.tier.as_str()), (headers::REASON, d.reason.as_str())]);
    }
    if let Some(r) = served.refusal {
        pairs.push((headers::REASON, r.as_str()));
    }
    let tag = |metadata: &mut MetadataMap| {
        for (key, value) in &pairs {
            metadata.insert(
                bridge::metadata_key(key),
                tonic::metadata::MetadataValue::from_static(value),
            );
        }
    };
    let mut metadata = MetadataMap::new();
    metadata.insert(
        bridge::metadata_key(&headers::POLICY_VERSION),
        served.policy_version.into(),
    );
    // Where the time went: in the answer's metadata, or a refusal's status.
    let (timing, answered) = match &mut served.result {
        Ok(reply) => {
            let parts = reply.extensions_mut().remove::<crate::timing::Noted>();
            (
                Line::answer(
                    parts,
                    served.elapsed.unwrap_or_else(|| received.elapsed()),
                    served.tier_took,
                ),
                true,
            )
        }
        Err(_) => (Line::error(received.elapsed()), false),
    };
    let timing: Option<tonic::metadata::MetadataValue<_>> = timing.to_string().parse().ok();
    let timing_key = bridge::metadata_key(&crate::timing::SERVER_TIMING);
    if let (Some(value), true) = (&timing, answered) {
        metadata.insert(timing_key.clone(), value.clone());
    }
    if let Ok(reply) = &served.result {
        // How a batched request was batched, and how the cache took part, as on HTTP.
        for key in [
            headers::BATCH_SIZE,
            headers::BATCH_ID,
            headers::QUEUE_MS,
            headers::CACHE,
            // An answer the cache gave says so as its reason (it had no decision).
            headers::REASON,
        ] {
            let value = reply.headers().get(&key).and_then(|v| v.to_str().ok());
            if let Some(value) = value.and_then(|v| v.parse().ok()) {
                metadata.insert(bridge::metadata_key(&key), value);
            }
        }
    }
    let result = served
        .result
        .map_err(|e| status(&e))
        .and_then(bridge::infer_response_from_http);
    let result = result.map_err(|mut s| {
        tag(s.metadata_mut());
        if let (Some(value), false) = (timing, answered) {
            s.metadata_mut().insert(timing_key, value);
        }
        s
    });
    tag(&mut metadata);
    (metadata, result)
}

/// `response` (a unary call's trailers-only answer) with the code of a refusal of
/// tonic's made the gateway's ([`bridge::client_code`]: RESOURCE_EXHAUSTED for a message
/// over the size limit, as Triton answers; INVALID_ARGUMENT for one its framing could
/// not read); for the gRPC door's server, in `tower::util::MapResponseLayer`.
pub fn client_codes<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers();
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = headers.get("grpc-message").and_then(|v| v.to_str().ok());
    if let (Some(code), Some(message)) = (code, message) {
        // The message is percent-encoded; its first words are plain text.
        if let Some(ours) = bridge::client_code(code, &message.replace("%20", " ")) {
            response
                .headers_mut()
                .insert("grpc-status", HeaderValue::from_static(ours));
        }
    }
    response
}

/// `response` with its `server-timing` (the answer's metadata) in its trailers too:
/// tonic sends a unary answer's metadata as headers only, and gRPC clients read an
/// answer's timing from its trailing metadata as well. For the gRPC door's server,
/// after [`client_codes`].
pub fn trailing_timing<B>(response: http::Response<B>) -> http::Response<TimingTrailer<B>> {
    let timing = response.headers().get(crate::timing::SERVER_TIMING).cloned();
    response.map(|body| TimingTrailer { body, timing })
}

/// An answer's body with a `server-timing` trailer added to its trailers (see
/// [`trailing_timing`]).
#[derive(Debug)]
pub struct TimingTrailer<B> {
    body: B,
    timing: Option<HeaderValue>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for TimingTrailer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        let std::task::Poll::Ready(Some(Ok(frame))) = polled else {
            return polled;
        };
        let frame = match (frame.into_trailers(), self.timing.take()) {
            (Ok(mut trailers), Some(timing)) => {
                trailers.insert(crate::timing::SERVER_TIMING, timing);
                hyper::body::Frame::trailers(trailers)
            }
            (Ok(trailers), None) => hyper::body::Frame::trailers(trailers),
            (Err(data), timing) => {
                self.timing = timing;
                data
            }
        };
        std::task::Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The gRPC status for a gateway error, with `RetryInfo` when waiting helps.
pub fn status(e: &Error) -> Status {
    match e.retry() {
        Some(after) => Status::with_error_details(
            e.kind.grpc_code(),
            &e.message,
            ErrorDetails::with_retry_info(Some(after)),
        ),
        None => Status::new(e.kind.grpc_code(), &e.message),
    }
}

impl GrpcDoor {
    /// The tenant `headers` (a call's metadata) authenticate as, the credential removed
    /// (see [`super::auth`]); UNAUTHENTICATED without a known key when one is needed.
    fn let_in(&self, headers: &mut HeaderMap) -> Result<Tenant, Status> {
        self.dispatch.callers().authenticate(headers).map_err(|e| status(&e))
    }

    /// [`Self::let_in`] for a call that needs only to be let in (metadata, readiness).
    fn let_in_call<T>(&self, req: &tonic::Request<T>) -> Result<(), Status> {
        if self.dispatch.callers().required() {
            self.let_in(&mut req.metadata().clone().into_headers())?;
        }
        Ok(())
    }
}

fn with_metadata<T>((metadata, result): (MetadataMap, Result<T, Status>)) -> Result<tonic::Response<T>, Status> {
    result.map(|body| {
        let mut response = tonic::Response::new(body);
        *response.metadata_mut() = metadata;
        response
    })
}
