//! Active health checks: every endpoint of an HTTP pool polled on its `check_path`.
//!
//! Beside the pool. One task per pool, holding the pool's endpoints weakly, so it ends
//! when the pool is dropped (a policy change replaced it, or the gateway stopped). A
//! check that does not answer 200 within its timeout counts as a failed call; a passing
//! one lets an ejected endpoint be probed again by real traffic.

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use tokio::time::Instant;

use super::pool::{Endpoint, Endpoints};

/// Longest a check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts polling `path` on every endpoint every `interval`, if a runtime is running.
pub(super) fn start(
    endpoints: Weak<Endpoints>,
    client: Client<HttpConnector, Full<Bytes>>,
    path: &str,
    interval: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let path = path.to_owned();
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
                let (endpoints, client, path) = (endpoints.clone(), client.clone(), path.clone());
                checks.spawn(async move { check(&endpoints[at], &client, &path, interval).await });
            }
            drop(endpoints);
            while checks.join_next().await.is_some() {}
        }
    });
}

/// One check of one endpoint.
async fn check(endpoint: &Endpoint, client: &Client<HttpConnector, Full<Bytes>>, path: &str, interval: Duration) {
    let uri = format!("http://{}{path}", endpoint.authority);
    let Ok(request) = http::Request::get(uri).body(Full::new(Bytes::new())) else {
        return;
    };
    let exchange = async {
        let response = client.request(request).await.ok()?;
        let ok = response.status() == http::StatusCode::OK;
        // Read the (small) body so the connection goes back to the pool.
        Limited::new(response.into_body(), 64 << 10).collect().await.ok()?;
        Some(ok)
    };
    match tokio::time::timeout(CHECK_TIMEOUT.min(interval), exchange).await {
        Ok(Some(true)) => endpoint.health.check_passed(),
        _ => endpoint.health.failed("check", Instant::now()),
    }
}
