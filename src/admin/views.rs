//! What the admin API shows: routes as they run, flags, and explained decisions.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::classify::classify;
use crate::control::{edit, route_etag};
use crate::decision::{BudgetSource, Decision, Meta, Refusal};
use crate::front::meta;
use crate::headers;
use crate::policy::{JsonAdapter, Policy, PoolSpec, Route, WhenUnmet};
use crate::tiers::MicroBatch;

/// A route's flags, as JSON.
pub fn flags(route: &Route) -> Value {
    let f = route.flags;
    json!({
        "realtime": f.realtime,
        "micro_batch": f.micro_batch,
        "offline": f.offline,
        "micro_batch_percent": f.micro_batch_percent,
        "shadow": f.shadow,
        "cache": f.cache,
    })
}

/// One line of the route list: what it serves, its flags and ETag.
pub fn summary(policy: &Policy, route: &Route) -> Value {
    json!({
        "name": route.name,
        "file": route.file.display().to_string(),
        "models": route.models,
        "paths": route.paths,
        "flags": flags(route),
        "etag": route_etag(policy, &route.name),
    })
}

/// A route in full: as written (`spec`, what PUT and PATCH edit) and as it runs.
pub fn route(policy: &Policy, route: &Route) -> Value {
    let spec = policy
        .sources()
        .iter()
        .find(|(p, _)| *p == route.file)
        .and_then(|(_, text)| edit::route_spec(text, &route.name));
    json!({
        "name": route.name,
        "file": route.file.display().to_string(),
        "policy_version": policy.version(),
        "etag": route_etag(policy, &route.name),
        "spec": spec,
        "effective": effective(route),
    })
}

/// The route's settings after defaults, as the classifier and tiers see them.
fn effective(route: &Route) -> Value {
    let b = route.budgets;
    json!({
        "models": route.models,
        "paths": route.paths,
        "default_budget_ms": ms(b.default),
        "realtime_below_ms": ms(b.realtime_below),
        "offline_from_ms": ms(b.offline_from),
        "when_unmet": match route.when_unmet { WhenUnmet::Reject => "reject", WhenUnmet::BestEffort => "best_effort" },
        "rollout_key_header": route.rollout_key_header.as_str(),
        "tenant_header": route.tenant_header.as_str(),
        "flags": flags(route),
        "realtime": route.realtime.as_deref().map(pool),
        "micro_batch": route.micro_batch.as_ref().map(|s| json!({
            "pool": pool(&s.pool),
            "max_batch": s.max_batch.get(),
            "max_wait_ms": ms(s.max_wait),
            "max_in_flight": s.max_in_flight.get(),
            "queue_capacity": s.queue_capacity.get(),
            "priority": s.scheduling.priority.as_str(),
            "max_priority": s.scheduling.max_priority.as_str(),
            "shed_at_rows": s.scheduling.shed_at,
            "tenant_weights": s.scheduling.tenant_weights.iter().map(|(t, w)| (t.clone(), w.get())).collect::<std::collections::BTreeMap<_, _>>(),
            "tenant_max_priority": s.scheduling.tenant_max_priority.iter().map(|(t, p)| (t.clone(), p.as_str())).collect::<std::collections::BTreeMap<_, _>>(),
            "json_adapter": s.json_adapter.map(|a| match a {
                JsonAdapter::TfServing => "tf_serving",
                JsonAdapter::OpenaiEmbeddings => "openai_embeddings",
                JsonAdapter::OpenaiCompletions => "openai_completions",
            }),
            "combined": s.combined.iter().map(|(member, m)| (member.clone(), json!({
                "model": m.combined,
                "outputs": m.outputs.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            }))).collect::<serde_json::Map<_, _>>(),
        })),
    })
}

fn pool(p: &PoolSpec) -> Value {
    json!({
        "endpoints": p.endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        "max_concurrency": p.max_concurrency.get(),
        "http2": p.http2,
        "binary_tensors": p.binary_tensors,
        "connect_timeout_ms": ms(p.connect_timeout),
    })
}

/// A request described for `POST /admin/explain`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Described {
    /// The KServe model it calls.
    pub model: Option<String>,
    /// The JSON path it calls.
    pub path: Option<String>,
    /// The route, by name.
    pub route: Option<String>,
    /// Shorthand for the `x-tiergate-budget-ms` header.
    pub budget_ms: Option<u64>,
    /// Its headers (budget, `Prefer`, the rollout key, `grpc-timeout`).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The request id (a rollout key when the rollout header is absent).
    pub id: Option<String>,
    /// Its body (a KServe v2 infer request, or a JSON path's), to say whether the
    /// route's cache holds its answer.
    pub body: Option<Value>,
}

/// The decision `policy` makes for `described`, without sending anything; `Err` is a
/// message for a 400 or 404 (with its status).
pub fn explain(
    policy: &Policy,
    (micro_batch, cache): (&MicroBatch, &crate::cache::Cache),
    described: &Described,
) -> Result<Value, (u16, String)> {
    let route = match (&described.model, &described.path, &described.route) {
        (Some(m), None, None) => policy
            .route_for_model(m)
            .ok_or_else(|| (404, format!("no route serves model {m:?}")))?,
        (None, Some(p), None) => policy
            .route_for_path(p)
            .ok_or_else(|| (404, format!("no route serves path {p:?}")))?,
        (None, None, Some(r)) => policy.route(r).ok_or_else(|| (404, format!("no route named {r:?}")))?,
        _ => return Err((400, "name exactly one of model, path or route".into())),
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &described.headers {
        let name = HeaderName::try_from(name.as_str()).map_err(|e| (400, format!("header name {name:?}: {e}")))?;
        let value = HeaderValue::try_from(value.as_str()).map_err(|e| (400, format!("header {name}: {e}")))?;
        headers.append(name, value);
    }
    if let Some(ms) = described.budget_ms {
        headers.insert(headers::BUDGET, HeaderValue::from(ms));
    }
    let keyed = headers.contains_key(&route.rollout_key_header) || described.id.is_some();
    let meta = meta::read(&headers, None, described.id.as_deref(), route).map_err(|e| (400, e.message))?;
    let (decision, outside) = if keyed {
        (classify(route, &meta), None)
    } else {
        let inside = classify(route, &Meta { key: 0, ..meta });
        let outside = classify(route, &Meta { key: 99, ..meta });
        (inside, (outside != inside).then_some(outside))
    };
    let percent = u64::from(route.flags.micro_batch_percent);
    let state = micro_batch.pool_state(&route.name);
    let batch = route.micro_batch.as_ref().map(|spec| {
        let cost = state.and_then(|s| s.cost);
        json!({
            "max_batch": spec.max_batch.get(),
            "batch_limit": state.map_or(u64::from(spec.max_batch.get()), |s| s.batch_limit),
            "max_wait_ms": ms(spec.max_wait),
            "queued_rows": state.map_or(0, |s| s.queued_rows),
            "free_slots": state.map(|s| s.free_slots),
            "learned_cost": cost.map(|c| json!({
                "fixed_ms": ms(c.fixed),
                "per_row_ms": ms(c.per_row),
                "samples": c.samples,
                "full_batch_ms": ms(c.predict(u64::from(spec.max_batch.get()))),
            })),
            "one_row_ms": state.and_then(|s| s.one_row).map(ms),
        })
    });
    Ok(json!({
        "route": route.name,
        "policy_version": policy.version(),
        "result": outcome(decision),
        "outside_rollout": outside.map(outcome),
        "rollout": {
            "percent": percent,
            "key_header": route.rollout_key_header.as_str(),
            "keyed": keyed,
            "in_rollout": keyed.then_some(meta.key % 100 < percent),
        },
        "micro_batch": batch,
        "cache": cached(route, cache, described, headers),
        "flags": flags(route),
        "sent": false,
    }))
}

/// Whether the route's cache would answer `described` (sent with `headers`): `null`
/// without a cache; `would` is `hit`, `miss`, `bypass` (not cacheable, or asked not to
/// be), `off` (the flag), or `unknown` without a body to key.
fn cached(route: &Route, cache: &crate::cache::Cache, described: &Described, headers: HeaderMap) -> Value {
    let Some(spec) = &route.cache else {
        return Value::Null;
    };
    let would = match (&described.body, route.flags.cache) {
        (_, false) => "off",
        (None, true) => "unknown",
        (Some(body), true) => {
            let path =
                match (&described.model, &described.path) {
                    (Some(m), _) => format!("/v2/models/{m}/infer"),
                    (None, Some(p)) => p.clone(),
                    (None, None) => route.paths.first().cloned().unwrap_or_else(|| {
                        format!("/v2/models/{}/infer", route.models.first().map_or("", String::as_str))
                    }),
                };
            let mut request = http::Request::new(bytes::Bytes::from(body.to_string()));
            *request.headers_mut() = headers;
            match path.parse() {
                Ok(uri) => *request.uri_mut() = uri,
                Err(_) => return json!({"on": true, "would": "bypass"}),
            }
            match crate::cache::asked(route, spec, &request) {
                None => "bypass",
                Some(_) if crate::cache::entry::wants_fresh(request.headers()) => "miss",
                Some((key, _)) if cache.holds(&route.name, spec, &key) => "hit",
                Some(_) => "miss",
            }
        }
    };
    json!({"on": route.flags.cache, "would": would})
}

fn outcome(result: Result<Decision, Refusal>) -> Value {
    match result {
        Ok(d) => json!({
            "status": "served",
            "tier": d.tier.as_str(),
            "reason": d.reason.as_str(),
            "budget_ms": ms(d.budget),
            "budget_source": match d.source {
                BudgetSource::Header => headers::BUDGET.to_string(),
                BudgetSource::GrpcTimeout => meta::GRPC_TIMEOUT.to_string(),
                BudgetSource::KserveTimeout => "kserve timeout parameter".to_owned(),
                BudgetSource::RouteDefault => "route default_budget".to_owned(),
                BudgetSource::KafkaSource => "kafka source budget".to_owned(),
            },
        }),
        Err(r) => json!({
            "status": "refused",
            "http_status": 503,
            "reason": r.as_str(),
        }),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
