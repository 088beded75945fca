//! `tiergate infer`: one KServe v2 inference over gRPC, as Triton's clients send it, with
//! the tier that served it. The request is written as KServe v2 JSON (what the demo's
//! curl lines send over HTTP); the answer is printed as JSON.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Args;
use tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tiergate::protocol::grpc::{request_to_grpc, response_from_grpc};
use tiergate::protocol::{decode_request, encode_response};

/// `tiergate infer`'s flags.
#[derive(Debug, Args)]
pub struct InferArgs {
    /// The gateway's gRPC door (or any KServe v2 gRPC server), as HOST:PORT.
    #[arg(long, env = "TIERGATE_GRPC")]
    grpc: SocketAddr,
    /// The model to ask.
    #[arg(long)]
    model: String,
    /// The request's budget, sent as `x-tiergate-budget-ms` metadata.
    #[arg(long)]
    budget_ms: Option<u64>,
    /// The request as KServe v2 JSON: {"inputs": [{"name", "datatype", "shape", "data"}]}.
    request: String,
}

/// What one gRPC inference answered: the answer as KServe v2 JSON, and the tier and
/// reason the gateway gave (none from a plain model server).
#[derive(Debug)]
pub struct Answer {
    /// The answer, as KServe v2 JSON.
    pub json: String,
    /// `x-tiergate-tier`.
    pub tier: Option<String>,
    /// `x-tiergate-reason`.
    pub reason: Option<String>,
}

/// Runs `tiergate infer`: the tier and reason on stderr, the answer on stdout.
pub fn run(args: InferArgs) -> anyhow::Result<ExitCode> {
    let answer = super::runtime(1)?.block_on(infer(args.grpc, &args.model, args.budget_ms, &args.request))?;
    eprintln!(
        "x-tiergate-tier: {}\nx-tiergate-reason: {}",
        answer.tier.as_deref().unwrap_or("-"),
        answer.reason.as_deref().unwrap_or("-")
    );
    println!("{}", answer.json);
    Ok(ExitCode::SUCCESS)
}

/// Sends `request` (KServe v2 JSON) for `model` to the gRPC server at `grpc`.
pub async fn infer(grpc: SocketAddr, model: &str, budget_ms: Option<u64>, request: &str) -> anyhow::Result<Answer> {
    let parsed = decode_request(&Bytes::copy_from_slice(request.as_bytes()), None)
        .context("the request is not KServe v2 JSON")?;
    let mut call = tonic::Request::new(request_to_grpc(model, None, &parsed));
    if let Some(ms) = budget_ms {
        call.metadata_mut().insert("x-tiergate-budget-ms", ms.into());
    }
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{grpc}"))
        .await
        .with_context(|| format!("cannot connect to the gRPC door on {grpc}"))?;
    let reply = client
        .model_infer(call)
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?;
    let meta = |name: &str| {
        reply
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (tier, reason) = (meta("x-tiergate-tier"), meta("x-tiergate-reason"));
    let response = response_from_grpc(reply.into_inner()).context("the answer is not a KServe v2 answer")?;
    let (body, _) = encode_response(&response, &|_| false);
    Ok(Answer {
        json: String::from_utf8_lossy(&body).into_owned(),
        tier,
        reason,
    })
}
