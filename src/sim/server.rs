//! The simulator's HTTP side: the accept loop, one task per connection (HTTP/1.1 or
//! h2c, detected per connection), and the KServe v2 route table.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::answer::{error, reply, Reply};
use super::{infer, Model, Simulator};

/// A KServe v2 endpoint, with the model and version it names.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint<'a> {
    Live,
    Ready,
    Server,
    Model(&'a str, Option<&'a str>),
    ModelReady(&'a str, Option<&'a str>),
    Stats(&'a str, Option<&'a str>),
    Config(&'a str, Option<&'a str>),
    Infer(&'a str, Option<&'a str>),
}

pub(crate) async fn listen(sim: Simulator, listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(connection(sim.clone(), stream, shutdown.clone()));
            }
            Err(error) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(%error, "simulator accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn connection(sim: Simulator, stream: TcpStream, shutdown: CancellationToken) {
    // Latency matters more than packet count for small infer answers.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| {
        let sim = sim.clone();
        async move { Ok::<_, Infallible>(route(&sim, req).await) }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "simulator connection ended with an error");
    }
}

async fn route(sim: &Simulator, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    if path == FAULTS {
        return faults(sim, req).await;
    }
    if path == "/metrics" {
        return reply(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            Bytes::from(engine_metrics(sim)),
        );
    }
    let llm = super::llm::openai::parse(&path);
    let inference = path.ends_with("/infer") || super::json::parse(&path).is_some() || llm.is_some();
    if sim.inner.gate.unavailable() && inference {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is unavailable (an injected fault)",
        );
    }
    let declared = req.headers().get(header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if inference && declared.is_some_and(|n| sim.inner.gate.too_large(n)) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is over the server's input limit",
        );
    }
    if let Some(api) = llm {
        let method = req.method().clone();
        let body = match super::answer::read_body(req).await {
            Ok(body) => body,
            Err(refusal) => return error(refusal.0, &refusal.1),
        };
        return super::llm::openai::serve(sim, api, &method, body).await;
    }
    if let Some(service) = super::json::parse(&path) {
        if req.method() != Method::POST {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes POST"));
            reply
                .headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
            return reply;
        }
        return super::json::serve(sim, service, req).await;
    }
    let Some(endpoint) = parse(&path) else {
        return error(StatusCode::NOT_FOUND, &format!("no route for {path}"));
    };
    let (method, allow) = match endpoint {
        Endpoint::Infer(..) => (Method::POST, "POST"),
        _ => (Method::GET, "GET"),
    };
    if req.method() != method {
        let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes {allow}"));
        reply
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static(allow));
        return reply;
    }
    match endpoint {
        Endpoint::Live | Endpoint::Ready => empty(StatusCode::OK),
        Endpoint::Server => json_reply(StatusCode::OK, &server_metadata()),
        Endpoint::Model(m, v) => match lookup(sim, m, v) {
            Ok(model) => json_reply(StatusCode::OK, &model_metadata(m, model)),
            Err(unknown) => *unknown,
        },
        Endpoint::ModelReady(m, v) => lookup(sim, m, v).map_or_else(|unknown| *unknown, |_| empty(StatusCode::OK)),
        Endpoint::Stats(m, v) => match lookup(sim, m, v) {
            Ok(_) => json_reply(StatusCode::OK, &model_statistics(sim, m)),
            Err(unknown) => *unknown,
        },
        Endpoint::Config(m, v) => match lookup(sim, m, v) {
            Ok(model) => json_reply(StatusCode::OK, &model_config(m, model, sim.llm(m).is_some())),
            Err(unknown) => *unknown,
        },
        Endpoint::Infer(m, v) => match lookup(sim, m, v) {
            Ok(model) => infer::infer(model, m, req).await,
            Err(unknown) => *unknown,
        },
    }
}

/// The path that sets the simulator's faults from outside its process (load-test
/// scenarios): `POST {"unavailable": bool, "slow": factor, "max_body_bytes": n,
/// "stall_after_tokens": n, "malformed_after_tokens": n}`, each key optional; the
/// answer is the faults in force. A test tool: the simulator has no authentication.
const FAULTS: &str = "/sim/faults";

async fn faults(sim: &Simulator, req: Request<Incoming>) -> Reply {
    use http_body_util::BodyExt as _;
    if req.method() != Method::POST {
        return error(StatusCode::METHOD_NOT_ALLOWED, "/sim/faults takes POST");
    }
    let body = match http_body_util::Limited::new(req.into_body(), 4096).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("the body could not be read: {e}")),
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Faults {
        unavailable: Option<bool>,
        slow: Option<u32>,
        max_body_bytes: Option<u64>,
        stall_after_tokens: Option<u64>,
        malformed_after_tokens: Option<u64>,
    }
    let faults: Faults = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("expected {{\"unavailable\": bool, \"slow\": factor}}: {e}"),
            )
        }
    };
    let gate = &sim.inner.gate;
    if let Some(unavailable) = faults.unavailable {
        gate.set_unavailable(unavailable);
    }
    if let Some(factor) = faults.slow {
        gate.set_slow(factor);
    }
    if let Some(bytes) = faults.max_body_bytes {
        gate.set_max_body(bytes);
    }
    let mut streams = gate.stream_faults();
    streams.stall_after = faults.stall_after_tokens.unwrap_or(streams.stall_after);
    streams.malformed_after = faults.malformed_after_tokens.unwrap_or(streams.malformed_after);
    gate.set_stream_faults(streams);
    json_reply(StatusCode::OK, &gate.faults())
}

/// Parses `/v2/...` paths; `None` for anything else.
fn parse(path: &str) -> Option<Endpoint<'_>> {
    let segments: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let (model, version, rest) = match segments.as_slice() {
        ["v2"] => return Some(Endpoint::Server),
        ["v2", "health", "live"] => return Some(Endpoint::Live),
        ["v2", "health", "ready"] => return Some(Endpoint::Ready),
        ["v2", "models", m, "versions", v, rest @ ..] => (*m, Some(*v), rest),
        ["v2", "models", m, rest @ ..] => (*m, None, rest),
        _ => return None,
    };
    match rest {
        [] => Some(Endpoint::Model(model, version)),
        ["ready"] => Some(Endpoint::ModelReady(model, version)),
        ["stats"] => Some(Endpoint::Stats(model, version)),
        ["config"] => Some(Endpoint::Config(model, version)),
        ["infer"] => Some(Endpoint::Infer(model, version)),
        _ => None,
    }
}

/// The model named in a path (version 1 or none), or the 404 to send.
fn lookup<'s>(sim: &'s Simulator, model: &str, version: Option<&str>) -> Result<&'s Model, Box<Reply>> {
    let unknown = |what: String| {
        let message = format!("Request for unknown model: {what} is not found");
        Box::new(error(StatusCode::NOT_FOUND, &message))
    };
    match (sim.model(model), version) {
        (None, _) => Err(unknown(format!("'{model}'"))),
        (Some(_), Some(v)) if v != "1" => Err(unknown(format!("'{model}' version {v}"))),
        (Some(found), _) => Ok(found),
    }
}

fn server_metadata() -> serde_json::Value {
    json!({
        "name": "tiergate-sim",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
    })
}

pub(crate) fn model_metadata(name: &str, model: &Model) -> serde_json::Value {
    let outputs = described(model, |name, copy| match copy {
        true => json!({"name": name, "datatype": "FP32", "shape": [-1, -1]}),
        false => json!({"name": name, "datatype": "FP64", "shape": [-1]}),
    });
    json!({
        "name": name,
        "versions": ["1"],
        "platform": "tiergate_sim",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": outputs,
    })
}

/// The model's config as Triton's HTTP endpoint writes it (the gRPC side sends the same,
/// converted): no batch dimension of Triton's own (`max_batch_size` 0), so the dims are
/// the metadata's whole shapes.
pub(crate) fn model_config(name: &str, model: &Model, llm: bool) -> serde_json::Value {
    if llm {
        // As Triton's LLM backends describe theirs: text in, text out, decoupled.
        return json!({
            "name": name,
            "platform": "tiergate_sim",
            "max_batch_size": 0,
            "model_transaction_policy": {"decoupled": true},
            "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
            "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        });
    }
    let outputs = described(model, |name, copy| match copy {
        true => json!({"name": name, "data_type": "TYPE_FP32", "dims": [-1, -1]}),
        false => json!({"name": name, "data_type": "TYPE_FP64", "dims": [-1]}),
    });
    json!({
        "name": name,
        "platform": "tiergate_sim",
        "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
        "output": outputs,
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    })
}

/// Each of the model's outputs as `describe` writes it, given its name and whether it is
/// a copy of the first input (FP32, two dimensions) rather than row sums (FP64, one).
fn described(model: &Model, describe: impl Fn(&str, bool) -> serde_json::Value) -> Vec<serde_json::Value> {
    let outputs = infer::outputs_of(&model.heads);
    outputs.iter().map(|o| describe(o.name(), o.is_copy())).collect()
}

/// The model's statistics as Triton's HTTP endpoint writes them (the gRPC side sends
/// the same, converted): requests and the batches that served them.
pub(crate) fn model_statistics(sim: &Simulator, model: &str) -> serde_json::Value {
    let stats = sim.stats(model).unwrap_or_default();
    let version = json!({"name": model, "version": "1", "inference_count": stats.requests,
                         "execution_count": stats.batches});
    json!({ "model_stats": [version] })
}

/// Its LLMs' engine figures under vLLM's metric names (`vllm:num_requests_running`,
/// `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` as a fraction,
/// `vllm:num_preemptions_total`, `vllm:generation_tokens_total`,
/// `vllm:prompt_tokens_total`), labelled by `model_name` as vLLM's are.
fn engine_metrics(sim: &Simulator) -> String {
    let mut out = String::new();
    for model in sim.llm_models() {
        let (Some(stats), Some(kv)) = (sim.llm_stats(&model), sim.llm(&model).map(|e| e.profile().kv_tokens)) else {
            continue;
        };
        let usage = stats.reserved as f64 / kv.max(1) as f64;
        for (name, value) in [
            ("vllm:num_requests_running", stats.running.to_string()),
            ("vllm:num_requests_waiting", stats.waiting.to_string()),
            ("vllm:kv_cache_usage_perc", format!("{usage}")),
            ("vllm:num_preemptions_total", stats.preemptions.to_string()),
            ("vllm:generation_tokens_total", stats.tokens.to_string()),
            ("vllm:prompt_tokens_total", stats.prompt_tokens.to_string()),
        ] {
            out.push_str(&format!("{name}{{model_name=\"{model}\"}} {value}\n"));
        }
    }
    out
}

fn json_reply(status: StatusCode, value: &serde_json::Value) -> Reply {
    reply(status, "application/json", Bytes::from(value.to_string()))
}

fn empty(status: StatusCode) -> Reply {
    let mut reply = Response::new(super::answer::SimBody::Whole(Full::new(Bytes::new())));
    *reply.status_mut() = status;
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let table = [
            ("/v2", Some(Endpoint::Server)),
            ("/v2/health/live", Some(Endpoint::Live)),
            ("/v2/health/ready", Some(Endpoint::Ready)),
            ("/v2/models/m", Some(Endpoint::Model("m", None))),
            ("/v2/models/m/versions/1", Some(Endpoint::Model("m", Some("1")))),
            ("/v2/models/m/ready", Some(Endpoint::ModelReady("m", None))),
            (
                "/v2/models/m/versions/2/ready",
                Some(Endpoint::ModelReady("m", Some("2"))),
            ),
            ("/v2/models/m/infer", Some(Endpoint::Infer("m", None))),
            ("/v2/models/m/versions/1/infer", Some(Endpoint::Infer("m", Some("1")))),
            ("/v2/models/m/explain", None),
            ("/v2/models", None),
            ("/v1/models/m", None),
            ("", None),
        ];
        for (path, want) in table {
            assert_eq!(parse(path), want, "{path}");
        }
    }
}
