//! Tracing: one request's trace id at the client, in the gateway's exported spans (an
//! OTLP collector run by the test) and at the simulated backend, with the spans nested
//! request → classify → tier → backend (→ batch → backend for micro-batches), and the
//! request id on the gateway's log lines.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::Notify;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/gRPC collector that keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    arrived: Arc<Notify>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.spans.lock().expect("not poisoned").extend(spans);
        self.arrived.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn one_trace_id_from_client_through_gateway_spans_to_backend() {
    let backend = backend(&["m"]).await;
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let otlp = listener.local_addr().expect("addr");
    let server = collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("policy")).expect("policy dir");
    std::fs::write(
        dir.path().join("policy/route.toml"),
        route(
            &backend.url(),
            &backend.url(),
            "realtime = true\nmicro_batch = true",
            "",
        ),
    )
    .expect("policy");
    let log_path = dir.path().join("gateway.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_tiergate"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TIERGATE_") || k == "RUST_LOG") {
        command.env_remove(key);
    }
    let mut gateway = Killed(
        command
            .args(["serve", "--policy-dir"])
            .arg(dir.path().join("policy"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
            ])
            .env("TIERGATE_TRACE__OTLP_ENDPOINT", format!("http://{otlp}"))
            .env("TIERGATE_LOG__FORMAT", "json")
            .env("TIERGATE_LOG__LEVEL", "info,tiergate=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).expect("log file"))
            .spawn()
            .expect("tiergate starts"),
    );
    let addr = common::ports::wait_serving(&log_path, 0, &mut gateway.0, Duration::from_secs(30))
        .await
        .http;
    wait_ready(addr.port(), "/v2/health/ready", Duration::from_secs(30)).await;
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let answer = infer(
        addr,
        "m",
        &[("traceparent", &traceparent), ("x-request-id", "trace-test-7")],
        BODY,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-request-id"), Some("trace-test-7"));
    let response = answer.header("traceresponse").expect("traceresponse header").to_owned();
    assert!(response.starts_with(&format!("00-{TRACE}-")), "{response}");
    let gateway_span = response.split('-').nth(2).expect("span id").to_owned();

    // The backend got the client's trace, with a gateway span as its parent.
    let at_backend = backend
        .sim
        .stats("m")
        .expect("model")
        .last_traceparent
        .expect("a traceparent reached the backend");
    let fields: Vec<&str> = at_backend.split('-').collect();
    assert_eq!(fields[1], TRACE, "{at_backend}");
    assert_ne!(
        fields[2], CLIENT_SPAN,
        "the backend's parent is the gateway's span, not the client's"
    );

    // A micro-batch request in another trace: its batch's backend call carries it.
    const BATCH_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let batched = infer(
        addr,
        "m",
        &[
            ("traceparent", &format!("00-{BATCH_TRACE}-b7ad6b7169203331-01")),
            ("x-tiergate-budget-ms", "2000"),
        ],
        BODY,
    )
    .await;
    assert_eq!(batched.status, 200, "{}", batched.text());
    assert_eq!(batched.tier().0, Some("micro_batch"));
    let at_batch_backend = backend
        .sim
        .stats("m")
        .expect("model")
        .last_traceparent
        .expect("traceparent");
    let batch_fields: Vec<&str> = at_batch_backend.split('-').collect();
    assert_eq!(batch_fields[1], BATCH_TRACE, "{at_batch_backend}");

    // The gateway exported its spans: request (child of the client's span) → classify,
    // tier → backend, whose id is the backend's parent.
    let spans = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let arrived = collector.arrived.notified();
            {
                let spans = collector.spans.lock().expect("not poisoned");
                if spans.iter().filter(|s| s.name == "request").count() == 2 && spans.iter().any(|s| s.name == "batch")
                {
                    return spans.clone();
                }
            }
            arrived.await;
        }
    })
    .await
    .expect("the gateway exports its spans within 20 s (the batch exporter sends every 5 s)");
    let (spans, batch_spans): (Vec<Span>, Vec<Span>) = spans.into_iter().partition(|s| hex(&s.trace_id) == TRACE);
    assert!(
        batch_spans.iter().all(|s| hex(&s.trace_id) == BATCH_TRACE),
        "every span is in a client's trace"
    );
    let by_name = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span"))
    };
    let request = by_name("request");
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        hex(&request.span_id),
        gateway_span,
        "traceresponse names the request span"
    );
    let tier = by_name("tier");
    assert_eq!(tier.parent_span_id, request.span_id);
    assert_eq!(by_name("classify").parent_span_id, request.span_id);
    let call = by_name("backend");
    assert_eq!(call.parent_span_id, tier.span_id);
    assert_eq!(
        hex(&call.span_id),
        fields[2],
        "the backend's parent is the gateway's backend span"
    );

    // The batch: a child of the caller's tier span, with the backend call under it.
    let in_batch = |name: &str| {
        batch_spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in the batched trace"))
    };
    let batch = in_batch("batch");
    assert_eq!(batch.parent_span_id, in_batch("tier").span_id);
    let batch_call = in_batch("backend");
    assert_eq!(batch_call.parent_span_id, batch.span_id);
    assert_eq!(hex(&batch_call.span_id), batch_fields[2]);

    // Each request's `served` line carries its request id, trace id, route and decision.
    let log = std::fs::read_to_string(&log_path).expect("log");
    let served: Vec<&str> = log.lines().filter(|l| l.contains("\"served\"")).collect();
    assert_eq!(served.len(), 2, "a debug line per served request:\n{log}");
    let mut seen = Vec::new();
    for line in served {
        let line: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
        let fields = &line["fields"];
        assert_eq!(fields["door"], "http", "{line}");
        assert_eq!(fields["route"], "r", "{line}");
        assert_eq!(fields["outcome"], "ok", "{line}");
        seen.push((
            fields["trace_id"].clone(),
            fields["request_id"].clone(),
            fields["tier"].clone(),
        ));
    }
    assert_eq!(seen[0], (TRACE.into(), "trace-test-7".into(), "realtime".into()));
    assert_eq!(seen[1].0, BATCH_TRACE, "{seen:?}");
    assert_eq!(seen[1].2, "micro_batch", "{seen:?}");
    assert_eq!(
        seen[1].1.as_str().map(str::len),
        Some(32),
        "a request id was made: {seen:?}"
    );
    assert!(!log.contains("\"inputs\""), "no request body is logged");

    // A client that sent no traceparent follows no trace: it gets its request id only.
    let untraced = infer(addr, "m", &[], BODY).await;
    assert_eq!(untraced.status, 200, "{}", untraced.text());
    assert!(untraced.header("x-request-id").is_some());
    assert_eq!(untraced.header("traceresponse"), None);
}

#[tokio::test]
async fn every_5xx_is_logged_with_the_request_id_the_client_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("policies")).expect("dir");
    let policy = format!(
        "[routes.gone]\nmodels = [\"gone\"]\n[routes.gone.realtime]\nendpoints = [\"http://{}\"]\n",
        dead_addr().await
    );
    std::fs::write(dir.path().join("policies/test.toml"), policy).expect("policy");
    let gw = common::served::serve(dir.path(), &[]);
    let asked = [
        ("GET", "/v2/models/gone", "log-meta"),
        ("GET", "/v2/models/gone/config", "log-config"),
        ("POST", "/v2/models/gone/infer", "log-infer"),
    ];
    for (method, path, id) in asked {
        let answer = send(method, gw.http, path, &[("x-request-id", id)], BODY.to_owned()).await;
        assert_eq!(answer.status, 502, "{method} {path}: {}", answer.text());
    }
    let logged = eventually(Duration::from_secs(10), "the 502s are logged", || async {
        let lines: Vec<serde_json::Value> = gw
            .lines()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|l: &serde_json::Value| {
                l["level"] == "WARN"
                    && l["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("answered 502"))
            })
            .collect();
        (lines.len() >= asked.len()).then_some(lines)
    })
    .await;
    for (_, path, id) in asked {
        let named = logged
            .iter()
            .any(|l| l["fields"]["request_id"] == id || l["span"]["request_id"] == id);
        assert!(named, "{path}: a line with request id {id} in {logged:#?}");
    }
}
