//! The bulk doors (`listen.bulk_http`, `listen.bulk_grpc`): the same API as the HTTP and
//! gRPC doors, served by the batch threads. The proof is a gateway whose real-time
//! runtime is stopped: its doors stand still, and the bulk doors still answer.

use crate::common;

use common::*;
use tiergate::protocol::grpc::pb;
use tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;

const MICRO_BATCH: [(&str, &str); 1] = [("x-tiergate-budget-ms", "5000")];
const REALTIME: [(&str, &str); 1] = [("x-tiergate-budget-ms", "100")];

/// One row of two FP32 values for model `m`, with a micro-batch budget.
fn grpc_request() -> tonic::Request<pb::ModelInferRequest> {
    common::grpc::with_budget(common::grpc::fp32_request("", &[[1.0, 2.0]]), "5000")
}

#[test]
fn the_bulk_doors_answer_while_the_real_time_threads_stand_still() {
    // The backends and the clients run on a runtime of their own.
    let others = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let backends = others.block_on(async { (backend(&["m"]).await, backend(&["m"]).await) });
    let (rt_pool, batch_pool) = backends;
    // The gateway's doors and real-time tier run on this one-thread runtime, which moves
    // only while the test blocks on it.
    let realtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = config();
    config.listen.bulk_http = Some("127.0.0.1:0".parse().expect("addr"));
    config.listen.bulk_grpc = Some("127.0.0.1:0".parse().expect("addr"));
    let policy = route(
        &rt_pool.url(),
        &batch_pool.url(),
        "realtime = true\nmicro_batch = true",
        "",
    );
    let gw = realtime.block_on(gateway_with(config, &policy));
    let bulk_http = gw.bulk_http_addr().expect("the bulk HTTP door is on");
    let bulk_grpc = gw.bulk_grpc_addr().expect("the bulk gRPC door is on");

    // From here nothing drives the real-time runtime: a request at the HTTP door waits.
    let waiting = others.spawn(infer(gw.http_addr(), "m", &MICRO_BATCH, BODY));
    let answers = others.block_on(async {
        let batched = infer(bulk_http, "m", &MICRO_BATCH, BODY).await;
        let realtime = infer(bulk_http, "m", &REALTIME, BODY).await;
        let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{bulk_grpc}"))
            .await
            .expect("connects to the bulk gRPC door");
        let over_grpc = grpc.model_infer(grpc_request()).await;
        (batched, realtime, over_grpc)
    });
    let (batched, realtime_call, over_grpc) = answers;
    assert_eq!(batched.status, 200, "{}", batched.text());
    assert_eq!(batched.tier().0, Some("micro_batch"));
    assert_eq!(realtime_call.status, 200, "{}", realtime_call.text());
    assert_eq!(
        realtime_call.tier().0,
        Some("realtime"),
        "a real-time call at the bulk door still goes to the real-time pool"
    );
    let over_grpc = over_grpc.expect("the bulk gRPC door answers");
    assert_eq!(over_grpc.get_ref().outputs.len(), 2, "{:?}", over_grpc.get_ref());
    assert!(
        !waiting.is_finished(),
        "the HTTP door answered with its runtime stopped: the test proves nothing"
    );

    // Driven again, the real-time runtime answers the request that waited at its door.
    let answered = realtime.block_on(waiting).expect("joined");
    assert_eq!(answered.status, 200, "{}", answered.text());
    assert_eq!(answered.tier().0, Some("micro_batch"));
    realtime.block_on(gw.stop()).expect("stops");
    drop((rt_pool, batch_pool));
}
