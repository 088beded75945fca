//! The gRPC door's `inference.GRPCInferenceService`: each call's way through the door,
//! and, for every call but inference (which carries its trace's ids), the caller's
//! `x-request-id` (or one made for it) on its answer, as on the HTTP door.

use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::{bridge, meta, pb, status, with_metadata, GrpcDoor};
use crate::front::extensions;
use crate::headers;
use crate::protocol::grpc::pb::grpc_inference_service_server::GrpcInferenceService;
use crate::trace;

/// A statistics answer, saying what its figures count (`x-tiergate-statistics`).
fn scoped<T>(mut response: Response<T>) -> Response<T> {
    let key = bridge::metadata_key(&headers::STATISTICS);
    let scope = tonic::metadata::MetadataValue::from_static(headers::STATISTICS_SCOPE);
    response.metadata_mut().insert(key, scope);
    response
}

/// `result`, its answer or refusal carrying `id` as `x-request-id`.
fn identified<T>(id: &http::HeaderValue, result: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
    let key = bridge::metadata_key(&trace::REQUEST_ID);
    let value = id.to_str().ok().and_then(|v| v.parse().ok());
    match result {
        Ok(mut response) => {
            if let Some(value) = value {
                response.metadata_mut().insert(key, value);
            }
            Ok(response)
        }
        Err(mut refused) => {
            if let Some(value) = value {
                refused.metadata_mut().insert(key, value);
            }
            Err(refused)
        }
    }
}

/// The request id of a call with `metadata`.
fn id_of(metadata: &MetadataMap) -> http::HeaderValue {
    trace::request_id(&metadata.clone().into_headers())
}

/// The gRPC answer to an error of the gateway's.
fn refused<T>(e: &crate::error::Error) -> Result<Response<T>, Status> {
    Err(status(e))
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcDoor {
    async fn server_live(
        &self,
        req: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        identified(
            &id_of(req.metadata()),
            Ok(Response::new(pb::ServerLiveResponse { live: true })),
        )
    }

    async fn server_ready(
        &self,
        req: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        let ready = self.dispatch.not_ready().is_empty();
        identified(
            &id_of(req.metadata()),
            Ok(Response::new(pb::ServerReadyResponse { ready })),
        )
    }

    async fn model_ready(
        &self,
        req: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = async {
            self.let_in_call(&req)?;
            let req = req.into_inner();
            // As Triton: a model nobody serves is not ready, which is no error.
            let ready = match self.control(&req.name, &req.version, "/ready", None).await {
                Ok(reply) => reply.status().is_success(),
                Err(status) if status.code() == tonic::Code::NotFound => false,
                Err(status) => return Err(status),
            };
            Ok(Response::new(pb::ModelReadyResponse { ready }))
        };
        identified(&id, answered.await)
    }

    async fn server_metadata(
        &self,
        req: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = self.let_in_call(&req).map(|()| {
            Response::new(pb::ServerMetadataResponse {
                name: "tiergate".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions: vec!["binary_tensor_data".into()],
            })
        });
        identified(&id, answered)
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = async {
            self.let_in_call(&req)?;
            let req = req.into_inner();
            let reply = self.control(&req.name, &req.version, "", None).await?;
            if !reply.status().is_success() {
                return Err(bridge::status_from_http(reply.status(), reply.body()));
            }
            Ok(Response::new(bridge::metadata_from_json(reply.body())?))
        };
        identified(&id, answered.await)
    }

    async fn model_infer(
        &self,
        req: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let (metadata, _, msg) = req.into_parts();
        let mut headers = metadata.into_headers();
        let tenant = self.let_in(&mut headers)?;
        with_metadata(self.infer((&headers, &tenant), msg).await)
    }

    /// Serves a stream's requests in order; each gets its answer or its error message on
    /// the response stream. The stream's own deadline bounds the stream, not each request,
    /// so each request's budget comes from its `timeout` parameter or the route default.
    async fn model_stream_infer(
        &self,
        req: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<bridge::InferStream>, Status> {
        let (metadata, _, inbound) = req.into_parts();
        let id = id_of(&metadata);
        let mut headers = metadata.into_headers();
        let tenant = self.let_in(&mut headers)?;
        headers.remove(meta::GRPC_TIMEOUT);
        let (door, headers) = (self.clone(), Arc::new(headers));
        let stream = bridge::stream_in_order(inbound, move |msg| {
            let (door, headers, tenant) = (door.clone(), headers.clone(), tenant.clone());
            async move { door.infer_streamed((&headers, &tenant), msg).await }
        });
        identified(&id, Ok(Response::new(stream)))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = async {
            self.let_in_call(&req)?;
            let req = req.into_inner();
            let config = self.config(&req.name, &req.version).await?;
            Ok(Response::new(pb::ModelConfigResponse { config }))
        };
        identified(&id, answered.await)
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = async {
            self.let_in_call(&req)?;
            let req = req.into_inner();
            if !req.name.is_empty() {
                return Ok(scoped(Response::new(self.statistics(&req.name, &req.version).await?)));
            }
            // No name: every model's, as Triton (one its backend does not know is left
            // out, and so is one whose backend fails: the others are still answered).
            let mut all = pb::ModelStatisticsResponse::default();
            for model in self.dispatch.models() {
                match self.statistics(&model, &req.version).await {
                    Ok(stats) => all.model_stats.extend(stats.model_stats),
                    Err(status) if status.code() == tonic::Code::NotFound => {}
                    Err(status) => super::super::failures::skipped_statistics(&model, "grpc", status.message(), &id),
                }
            }
            Ok(scoped(Response::new(all)))
        };
        identified(&id, answered.await)
    }

    async fn repository_index(
        &self,
        req: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let id = id_of(req.metadata());
        let answered = self.let_in_call(&req).map(|()| {
            let models = extensions::repository(&self.dispatch, req.get_ref().ready)
                .into_iter()
                .map(|m| pb::repository_index_response::ModelIndex {
                    state: m.state().to_owned(),
                    reason: m.not_ready.unwrap_or_default(),
                    name: m.name,
                    version: String::new(),
                })
                .collect();
            Response::new(pb::RepositoryIndexResponse { models })
        });
        identified(&id, answered)
    }

    async fn repository_model_load(
        &self,
        req: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let error = extensions::model_control("load", &req.get_ref().model_name);
        identified(&id_of(req.metadata()), refused(&error))
    }

    async fn repository_model_unload(
        &self,
        req: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let error = extensions::model_control("unload", &req.get_ref().model_name);
        identified(&id_of(req.metadata()), refused(&error))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        let name = Some(req.get_ref().name.as_str()).filter(|n| !n.is_empty());
        let answered = extensions::shared_memory_status(name)
            .map(|()| Response::new(pb::SystemSharedMemoryStatusResponse::default()))
            .map_err(|e| status(&e));
        identified(&id_of(req.metadata()), answered)
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        identified(&id_of(req.metadata()), refused(&extensions::shared_memory_register()))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        // Nothing is ever registered, so there is nothing to unregister (as on HTTP).
        identified(
            &id_of(req.metadata()),
            Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {})),
        )
    }

    async fn cuda_shared_memory_status(
        &self,
        req: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        let name = Some(req.get_ref().name.as_str()).filter(|n| !n.is_empty());
        let answered = extensions::shared_memory_status(name)
            .map(|()| Response::new(pb::CudaSharedMemoryStatusResponse::default()))
            .map_err(|e| status(&e));
        identified(&id_of(req.metadata()), answered)
    }

    async fn cuda_shared_memory_register(
        &self,
        req: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        identified(&id_of(req.metadata()), refused(&extensions::shared_memory_register()))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        req: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        identified(
            &id_of(req.metadata()),
            Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {})),
        )
    }

    async fn trace_setting(
        &self,
        req: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        identified(&id_of(req.metadata()), refused(&extensions::settings("trace settings")))
    }

    async fn log_settings(
        &self,
        req: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        identified(&id_of(req.metadata()), refused(&extensions::settings("log settings")))
    }
}
