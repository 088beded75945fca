//! `GET /admin/batching`: every route's micro-batch pool now: its size limit against
//! `max_batch`, the learned cost `t(n) = a + b·n` with how far batches fall from it,
//! the rows waiting by band and tenant, and each tenant's share of the rows served over
//! the last 15 minutes (from the usage ledger) against its share of the weights.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::policy::Policy;
use crate::tiers::MicroBatch;
use crate::usage::{unix, Field, Ledger, Source};

/// How far back the served shares look.
const SHARE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Every micro-batch route of `policy`, its queue and its shares.
pub(super) async fn pools(policy: &Policy, micro_batch: &MicroBatch, ledger: &Arc<Ledger>) -> Result<Value, String> {
    let since = unix(SystemTime::now() - SHARE_WINDOW);
    let rows = ledger.read(since).await?;
    // Rows served per route and tenant on the micro-batch tier.
    let mut served: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.source == Source::MicroBatch) {
        *served.entry((row.route.as_str(), row.tenant.as_str())).or_default() += row.figures.get(Field::Rows);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut routes = Vec::new();
    for route in policy.routes() {
        let Some(spec) = &route.micro_batch else { continue };
        let weights = &spec.scheduling.tenant_weights;
        let weight = |tenant: &str| weights.get(tenant).map_or(1, |w| w.get());
        // The route's tenants served, with their rows.
        let tenants_served: Vec<(&str, u64)> = served
            .iter()
            .filter(|((r, _), _)| *r == route.name)
            .map(|((_, t), rows)| (*t, *rows))
            .collect();
        let names = weights
            .keys()
            .map(String::as_str)
            .chain(tenants_served.iter().map(|(t, _)| *t))
            .chain([""]);
        let queue: Vec<Value> = micro_batch
            .queued_by_tenant(&route.name, names)
            .into_iter()
            .map(|(band, tenant, weight, rows)| {
                json!({"band": band.as_str(), "tenant": shown(&tenant), "weight": weight, "rows": rows})
            })
            .collect();
        let total: u64 = tenants_served.iter().map(|(_, rows)| rows).sum();
        let total_weight: u64 = tenants_served.iter().map(|(t, _)| u64::from(weight(t))).sum();
        let shares: Vec<Value> = tenants_served
            .iter()
            .map(|&(t, rows)| {
                json!({
                    "tenant": shown(t),
                    "weight": weight(t),
                    "rows": rows,
                    "share": rows as f64 / total.max(1) as f64,
                    "weight_share": f64::from(weight(t)) / total_weight.max(1) as f64,
                })
            })
            .collect();
        let state = micro_batch.pool_state(&route.name);
        let cost = state.and_then(|s| s.cost);
        routes.push(json!({
            "route": route.name,
            "max_batch": spec.max_batch.get(),
            "batch_limit": state.map_or(u64::from(spec.max_batch.get()), |s| s.batch_limit),
            "max_wait_ms": ms(spec.max_wait),
            "queue_capacity": spec.queue_capacity.get(),
            "queued_rows": state.map_or(0, |s| s.queued_rows),
            "free_slots": state.map(|s| s.free_slots),
            "learned_cost": cost.map(|c| json!({
                "fixed_ms": ms(c.fixed),
                "per_row_ms": ms(c.per_row),
                "rms_error_ms": ms(c.rms_error),
                "samples": c.samples,
            })),
            "one_row_ms": state.and_then(|s| s.one_row).map(ms),
            "tenant_weights": weights.iter().map(|(t, w)| (t.clone(), w.get())).collect::<BTreeMap<_, _>>(),
            "queue": queue,
            "served_15m": shares,
        }));
    }
    Ok(json!({ "policy_version": policy.version(), "routes": routes }))
}

/// A tenant as the tables show it: the anonymous one by name.
fn shown(tenant: &str) -> &str {
    match tenant {
        "" => crate::usage::report::ANONYMOUS,
        named => named,
    }
}
