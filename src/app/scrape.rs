//! The metrics endpoint: `GET /metrics` in the Prometheus text format, on its own
//! listener (Triton's 8002), with the recorder's upkeep beside it.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `GET /metrics` in the Prometheus text format until `shutdown`.
pub(super) async fn listen(
    listener: TcpListener,
    handle: PrometheusHandle,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let upkeep = handle.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => upkeep.run_upkeep(),
                _ = stop.cancelled() => return,
            }
        }
    });
    let answer = move |req: http::Request<crate::server::Incoming>| {
        let handle = handle.clone();
        async move {
            if req.uri().path() != "/metrics" {
                return text(StatusCode::NOT_FOUND, "metrics are at /metrics\n".into());
            }
            text(StatusCode::OK, handle.render())
        }
    };
    crate::server::listen(
        listener,
        crate::server::Connections::small(256),
        (shutdown.clone(), shutdown),
        answer,
    )
    .await
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}
