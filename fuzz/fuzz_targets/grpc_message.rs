//! A gRPC `ModelInferRequest` as it arrives (protobuf bytes), converted as the gRPC door
//! converts it: to a KServe v2 request, then to the HTTP form sent to the tiers.
#![no_main]

use tiergate::protocol::grpc::pb::ModelInferRequest;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(msg) = <ModelInferRequest as prost::Message>::decode(data) else {
        return;
    };
    let model = msg.model_name.clone();
    if let Ok(req) = tiergate::protocol::grpc::request_from_grpc(msg) {
        let _ = tiergate::protocol::grpc::bridge::http_infer_request(&model, None, req, true);
    }
});
