//! gRPC test support: a client for a door or a backend, and the messages the tests send.

use std::net::SocketAddr;

use bytes::Bytes;
use tiergate::protocol::grpc::pb;
use tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tiergate::protocol::grpc::pb::model_infer_request::InferInputTensor;
use tonic::transport::Channel;

/// A client of the KServe v2 gRPC service at `addr` (a gateway's gRPC door or a backend).
pub async fn client(addr: SocketAddr) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connects")
}

/// An infer request for model `m` with request `id` and `rows` of two FP32 values in
/// `INPUT0`, as raw contents.
pub fn fp32_request(id: &str, rows: &[[f32; 2]]) -> pb::ModelInferRequest {
    let raw: Vec<u8> = rows.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    pb::ModelInferRequest {
        model_name: "m".into(),
        id: id.into(),
        inputs: vec![input("FP32", vec![rows.len() as i64, 2], None)],
        raw_input_contents: vec![Bytes::from(raw)],
        ..Default::default()
    }
}

/// Input `INPUT0` of `datatype` and `shape`, its values typed in `contents` or (`None`)
/// sent raw.
pub fn input(datatype: &str, shape: Vec<i64>, contents: Option<pb::InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: "INPUT0".into(),
        datatype: datatype.into(),
        shape,
        parameters: Default::default(),
        contents,
    }
}

/// `msg` with a budget of `ms` milliseconds in its metadata.
pub fn with_budget<T>(msg: T, ms: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-tiergate-budget-ms", ms.parse().expect("ascii"));
    req
}

/// The simulator's `OUTPUT1` (each row's sum, FP64) of `resp`.
pub fn sums(resp: &pb::ModelInferResponse) -> Vec<f64> {
    let i = resp.outputs.iter().position(|o| o.name == "OUTPUT1").expect("OUTPUT1");
    resp.raw_output_contents[i]
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}
