//! Active health checks: every endpoint of a pool polled, an HTTP pool with `GET` on its
//! `check_path`, a gRPC pool with the `ServerReady` RPC.
//!
//! Beside the pool. One task per pool, holding the pool's endpoints weakly, so it ends
//! when the pool is dropped (a policy change replaced it, or the gateway stopped). A
//! check that does not answer 200 within its timeout counts as a failed call; a passing
//! one lets an ejected endpoint be probed again by real traffic.

use std::sync::Weak;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;

use super::endpoint::{Endpoint, Endpoints};
use super::h1::Conns;

/// Longest a check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest check answer read.
const CHECK_BODY: usize = 64 << 10;

/// How a pool's endpoints are asked whether they are ready.
#[derive(Clone)]
pub(super) enum Probe {
    /// `GET` this path over the pool's own HTTP/1.1 connections (same order as the
    /// endpoints); 200 is ready.
    Http1(Arc<Vec<Conns>>, String),
    /// `GET` this path over the pool's HTTP/2 client; 200 is ready.
    Http2(Box<super::h2::Client>, String),
    /// `ServerReady` on each endpoint's channel (same order as the endpoints).
    Grpc(Vec<super::grpc::Client>),
}

/// Starts checking every endpoint every `interval` with `probe`, if a runtime is running.
pub(super) fn start(endpoints: Weak<Endpoints>, probe: Probe, interval: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate; let the pool warm up first
        loop {
            tick.tick().await;
            let Some(endpoints) = endpoints.upgrade() else {
                return;
            };
            let mut checks = tokio::task::JoinSet::new();
            for at in 0..endpoints.len() {
                let (endpoints, probe) = (endpoints.clone(), probe.clone());
                checks.spawn(async move { check(&endpoints[at], at, &probe, interval).await });
            }
            drop(endpoints);
            while checks.join_next().await.is_some() {}
        }
    });
}

/// One check of endpoint `at`.
async fn check(endpoint: &Endpoint, at: usize, probe: &Probe, interval: Duration) {
    let exchange = async {
        match probe {
            Probe::Http1(conns, path) => {
                let request = http::Request::get(path.as_str()).body(Bytes::new()).ok()?;
                let response = conns.get(at)?.send(request, CHECK_BODY).await.ok()?;
                Some(response.status() == http::StatusCode::OK)
            }
            Probe::Http2(client, path) => {
                let uri = client.uri(&endpoint.authority, path.parse().ok()?).ok()?;
                let request = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
                // The (small) body is read whole, so the connection goes back to the pool.
                let response = client.request(request, (CHECK_BODY, false)).await.ok()?;
                Some(response.status() == http::StatusCode::OK)
            }
            Probe::Grpc(clients) => {
                let mut client = clients.get(at)?.clone();
                let ready = client
                    .server_ready(crate::protocol::grpc::pb::ServerReadyRequest {})
                    .await
                    .ok()?;
                Some(ready.into_inner().ready)
            }
        }
    };
    let passed = matches!(
        tokio::time::timeout(CHECK_TIMEOUT.min(interval), exchange).await,
        Ok(Some(true))
    );
    endpoint.health.checked(passed, std::time::SystemTime::now());
}
