//! The simulator's gRPC side: `inference.GRPCInferenceService` on a port of its own (as
//! Triton serves gRPC on 8001 beside HTTP on 8000), answering through the same models,
//! instances and statistics as the HTTP side.

use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::{infer, server, Model, Simulator};
use crate::protocol::grpc::pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use crate::protocol::grpc::{bridge, config, pb, request_from_grpc};

/// The simulator as a gRPC service.
#[derive(Clone)]
struct SimGrpc(Simulator);

/// Serves the simulator's models over gRPC on `listener` until `shutdown` fires.
pub(crate) async fn listen(sim: Simulator, listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    tonic::transport::Server::builder()
        .add_service(GrpcInferenceServiceServer::new(SimGrpc(sim)).max_decoding_message_size(super::answer::MAX_BODY))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown.cancelled())
        .await
        .map_err(std::io::Error::other)
}

impl SimGrpc {
    /// One infer call, through the same instances and counters as the HTTP side.
    async fn infer(&self, msg: pb::ModelInferRequest) -> Result<pb::ModelInferResponse, Status> {
        let name = msg.model_name.clone();
        let model = self.model(&name, &msg.model_version)?;
        let version = Some(msg.model_version.clone());
        let request = request_from_grpc(msg).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (parts, body) = bridge::http_infer_request(&name, version.as_deref(), request, true).into_parts();
        let header_len = crate::protocol::header_len(&parts.headers).map_err(|e| Status::internal(e.to_string()))?;
        let (head, body) = infer::infer_bytes(model, &name, header_len, body).await.into_parts();
        let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        bridge::infer_response_from_http(http::Response::from_parts(head, body))
    }

    fn model(&self, name: &str, version: &str) -> Result<&Model, Status> {
        match (self.0.model(name), version) {
            (Some(model), "" | "1") => Ok(model),
            _ => Err(Status::not_found(format!(
                "Request for unknown model: '{name}' version '{version}' is not found"
            ))),
        }
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for SimGrpc {
    async fn server_live(&self, _: Request<pb::ServerLiveRequest>) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse { ready: true }))
    }

    async fn model_ready(
        &self,
        req: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let req = req.into_inner();
        self.model(&req.name, &req.version)?;
        Ok(Response::new(pb::ModelReadyResponse { ready: true }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "tiergate-sim".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec![],
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let req = req.into_inner();
        let model = self.model(&req.name, &req.version)?;
        let json = server::model_metadata(&req.name, model).to_string();
        Ok(Response::new(bridge::metadata_from_json(json.as_bytes())?))
    }

    async fn model_infer(
        &self,
        req: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let traceparent = req
            .metadata()
            .get(crate::trace::TRACEPARENT.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let msg = req.into_inner();
        if let Ok(model) = self.model(&msg.model_name, &msg.model_version) {
            infer::traced(model, traceparent.as_deref());
        }
        self.infer(msg).await.map(Response::new)
    }

    /// Answers a stream's requests in order, each with its answer or its error message;
    /// an LLM's as a decoupled model, a response a token.
    async fn model_stream_infer(
        &self,
        req: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<bridge::InferStream>, Status> {
        let sim = self.clone();
        let stream = bridge::stream_in_order(req.into_inner(), move |msg| {
            let sim = sim.clone();
            async move {
                if let Some(engine) = sim.0.llm(&msg.model_name) {
                    return super::llm::decoupled::answers(engine, sim.0.stream_faults(), msg);
                }
                let id = msg.id.clone();
                bridge::answered_once(id, sim.infer(msg).await)
            }
        });
        Ok(Response::new(stream))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let req = req.into_inner();
        let model = self.model(&req.name, &req.version)?;
        let json = server::model_config(&req.name, model, self.0.llm(&req.name).is_some()).to_string();
        let config = config::config_from_json(json.as_bytes()).map_err(Status::internal)?;
        Ok(Response::new(pb::ModelConfigResponse { config }))
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let req = req.into_inner();
        self.model(&req.name, &req.version)?;
        let json = server::model_statistics(&self.0, &req.name).to_string();
        let model_stats = config::statistics_from_json(json.as_bytes()).map_err(Status::internal)?;
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }
}
