//! `GET /admin/backends`: every route's pools (real-time, batch, shadow candidate and
//! fallback), endpoint by endpoint, as HAProxy's stats page shows a backend: the circuit
//! (and for how long it stays open), failures and ejections in a row, calls in flight,
//! what calls take lately, and the last active check.

use serde_json::{json, Value};

use crate::backend::EndpointView;
use crate::policy::{Policy, PoolSpec};

/// Every pool of `policy`'s routes, endpoint by endpoint, as `admin`'s tiers hold them.
pub(super) fn pools(policy: &Policy, admin: &super::Admin) -> Value {
    let mut pools = Vec::new();
    for route in policy.routes() {
        let name = route.name.as_str();
        if let Some(spec) = &route.realtime {
            pools.push(pool(name, "realtime", spec, admin.realtime.endpoints_now(name, spec)));
        }
        if let Some(batch) = &route.micro_batch {
            let spec = &batch.pool;
            pools.push(pool(
                name,
                "micro_batch",
                spec,
                admin.micro_batch.endpoints_now(name, spec),
            ));
        }
        if let Some(shadow) = &route.shadow {
            pools.push(pool(
                name,
                "shadow",
                &shadow.candidate,
                admin.shadow.endpoints_now(name, shadow),
            ));
        }
        if let Some(spec) = &route.fallback {
            pools.push(pool(
                name,
                "fallback",
                spec,
                admin.dispatch.fallback_endpoints_now(name, spec),
            ));
        }
    }
    json!({ "policy_version": policy.version(), "pools": pools })
}

/// One pool: its settings and endpoints (as the policy lists them, `unused` before the
/// pool's first call).
fn pool(route: &str, tier: &str, spec: &PoolSpec, now: Option<Vec<EndpointView>>) -> Value {
    let endpoints: Vec<Value> = match now {
        Some(endpoints) => endpoints.iter().map(endpoint).collect(),
        None => spec
            .endpoints
            .iter()
            .map(|uri| json!({"endpoint": uri.authority().map(|a| a.to_string()), "circuit": "unused"}))
            .collect(),
    };
    let checks = match (&spec.health.check_path, spec.is_grpc()) {
        (_, true) => Some("ServerReady".to_owned()),
        (Some(path), false) => Some(format!("GET {path}")),
        (None, false) => None,
    };
    json!({
        "route": route,
        "tier": tier,
        "max_concurrency": spec.max_concurrency.get(),
        "eject_after": spec.health.eject_after,
        "checks": checks,
        "check_interval_ms": checks.is_some().then_some(spec.health.check_interval.as_millis() as u64),
        "endpoints": endpoints,
    })
}

fn endpoint(e: &EndpointView) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    json!({
        "endpoint": e.endpoint,
        "circuit": e.circuit.state,
        "ejected_for_ms": e.circuit.ejected_for.map(ms),
        "failures_in_a_row": e.circuit.failures,
        "ejections_in_a_row": e.circuit.trips,
        "in_flight": e.in_flight,
        "latency_ms": e.latency.map(ms),
        "first_token_ms": e.first_token.map(ms),
        "per_token_ms": e.per_token.map(ms),
        "last_check": e.circuit.last_check.map(|(at, passed)| json!({
            "at": humantime::format_rfc3339_seconds(at).to_string(),
            "passed": passed,
        })),
    })
}
