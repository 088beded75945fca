//! `ModelStreamInfer` for decoupled models (0..N responses a request, as Triton's
//! TensorRT-LLM and vLLM backends answer): a request whose route's endpoints speak
//! gRPC and whose model's config says `model_transaction_policy.decoupled` goes to the
//! tiers as `/infer_stream` ([`crate::protocol::INFER_STREAM`]) marked as a stream; the
//! gRPC pool calls the backend's `ModelStreamInfer` and hands its responses up as
//! events; the relay ([`crate::front::relay`]) holds them to the budget of the first
//! response, the route's idle and duration limits and the event size, exactly as for
//! HTTP streams; and each event goes back to the caller as one response, its
//! `triton_final_response` parameter kept. A relay's own error (a stall, a broken
//! stream) reaches the caller as a response's `error_message`, as Triton's own errors
//! do. The caller cancelling its call drops the relay, which resets the backend's
//! stream. Whether a model is decoupled is read from its backend's config once per
//! policy version.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;
use tokio::time::Instant;

use super::{status, GrpcDoor};
use crate::decision::Door;
use crate::front::relay::{Relay, Relayed};
use crate::protocol::grpc::bridge::{self, Answers};
use crate::protocol::grpc::{pb, request_from_grpc};
use crate::tenant::Tenant;
use crate::trace;

impl GrpcDoor {
    /// Serves one request of a `ModelStreamInfer` stream: a decoupled model's relayed
    /// response by response, any other's answered once, as `ModelInfer`.
    pub(super) async fn infer_streamed(
        &self,
        (headers, tenant): (&HeaderMap, &Tenant),
        msg: pb::ModelInferRequest,
    ) -> Answers {
        if self.decoupled(&msg.model_name, &msg.model_version).await {
            return self.relayed((headers, tenant), msg).await;
        }
        let id = msg.id.clone();
        let (_, answered) = self.infer((headers, tenant), msg).await;
        bridge::answered_once(id, answered)
    }

    /// Whether `model` is decoupled and served by gRPC endpoints only (an HTTP endpoint
    /// cannot stream a decoupled model's responses), as its backend's config says; read
    /// once per policy version (a config that cannot be read: not decoupled, asked again
    /// next time).
    async fn decoupled(&self, model: &str, version: &str) -> bool {
        let policy = self.dispatch.policy();
        let Some(route) = policy.route_for_model(model) else {
            return false;
        };
        let grpc = route.realtime.as_ref().is_none_or(|p| p.is_grpc())
            && route.micro_batch.as_ref().is_none_or(|b| b.pool.is_grpc())
            && (route.realtime.is_some() || route.micro_batch.is_some());
        if !grpc {
            return false;
        }
        if let Some(known) = self.decoupled.get(model).filter(|k| k.0 == policy.version()) {
            return known.1;
        }
        let Ok(config) = self.config(model, version).await else {
            return false;
        };
        let decoupled = crate::protocol::grpc::config::config_to_json(&config)
            .ok()
            .and_then(|json| serde_json::from_slice::<Value>(&json).ok())
            .is_some_and(|c| c["model_transaction_policy"]["decoupled"] == Value::Bool(true));
        self.decoupled.insert(model.to_owned(), (policy.version(), decoupled));
        decoupled
    }

    /// A decoupled model's request through the pipeline as a stream, its events turned
    /// back into responses as they come.
    async fn relayed(&self, (headers, tenant): (&HeaderMap, &Tenant), msg: pb::ModelInferRequest) -> Answers {
        let received = Instant::now();
        let id = msg.id.clone();
        let ids = trace::Ids::read(headers);
        let Some(route) = self.dispatch.policy().route_for_model(&msg.model_name).cloned() else {
            let unmatched = super::unmatched_model("grpc", &msg.model_name);
            return bridge::answered_once(id, Err(status(&unmatched)));
        };
        let admitted = match self
            .dispatch
            .admit(Door::Grpc, route, (headers, tenant), &ids, received)
        {
            Ok(admitted) => admitted,
            Err(refused) => return once(id, refused.result),
        };
        let mut admitted = admitted;
        if let Err(e) = admitted.hold(prost::Message::encoded_len(&msg)) {
            return once(id, admitted.failed(e).result);
        }
        let model = msg.model_name.clone();
        let version = Some(msg.model_version.clone()).filter(|v| !v.is_empty());
        let prepared = request_from_grpc(msg)
            .map_err(|e| crate::error::Error::new(crate::error::Kind::BadRequest, e.to_string()))
            .and_then(|req| {
                let timeout_us = req.parameters.get("timeout").and_then(Value::as_u64);
                let meta = admitted.meta(headers, timeout_us, req.id.as_deref())?;
                let mut request = bridge::http_infer_request(&model, version.as_deref(), req, false);
                *request.uri_mut() = bridge::model_path(&model, version.as_deref(), crate::protocol::INFER_STREAM);
                request
                    .extensions_mut()
                    .insert(crate::backend::stream::Wanted::default());
                Ok((request, meta))
            });
        let served = match prepared {
            Ok((request, meta)) => admitted.serve(request, meta).await,
            Err(e) => admitted.failed(e),
        };
        admitted.log_failure(&served);
        let mut reply = match served.result {
            Ok(reply) => reply,
            Err(e) => return bridge::answered_once(id, Err(status(&e))),
        };
        match Relayed::of(&mut reply) {
            Some(relay) => responses(relay, id),
            None => once(id, Ok(reply)),
        }
    }
}

/// The one response of a request answered whole (or refused).
fn once(id: String, result: Result<crate::protocol::Reply, crate::error::Error>) -> Answers {
    let answered = match result {
        Ok(reply) => bridge::infer_response_from_http(reply),
        Err(e) => Err(status(&e)),
    };
    bridge::answered_once(id, answered)
}

/// A relay's events as responses: each event's KServe v2 JSON as its message, an error
/// event as a response's `error_message`.
fn responses(relay: Relay, id: String) -> Answers {
    let events = http_body_util::BodyStream::new(relay);
    let answers = tokio_stream::StreamExt::filter_map(events, move |frame| {
        let data = frame.ok()?.into_data().ok()?;
        Some(response(&data, &id))
    });
    Box::pin(answers)
}

/// The response an event (`data: ...\n\n`) stands for.
fn response(event: &[u8], id: &str) -> pb::ModelStreamInferResponse {
    let data: Vec<u8> = event
        .split(|b| *b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data: ").or_else(|| line.strip_prefix(b"data:")))
        .flat_map(|d| d.iter().copied())
        .collect();
    let failed = |message: String| pb::ModelStreamInferResponse {
        error_message: message,
        infer_response: Some(pb::ModelInferResponse {
            id: id.to_owned(),
            ..Default::default()
        }),
    };
    if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(&data) {
        if let Some(error) = object.get("error") {
            return failed(error.as_str().map_or_else(|| error.to_string(), str::to_owned));
        }
    }
    let mut answer = http::Response::new(Bytes::from(data));
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    match bridge::infer_response_from_http(answer) {
        Ok(response) => pb::ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        },
        Err(status) => failed(status.message().to_owned()),
    }
}
