//! `GET /admin/tokens`: each LLM route's tenants' tokens against their token limits
//! (`[routes.NAME.tokens]`), as the usage ledger counts them (what calls used, not what
//! they hold while running): over the last minute against `tokens_per_minute`, today
//! (UTC) against `daily_tokens`, this month against `monthly_tokens`; the route's own
//! limits on every tenant's together as tenant `*`; and each route's batch pool's
//! admission window now.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::policy::tokens::TokenAllowance;
use crate::policy::Policy;
use crate::usage::quota::{day_start, month_start};
use crate::usage::report::ANONYMOUS;
use crate::usage::{Field, Ledger};

/// Tokens over the last minute, today and this month.
#[derive(Debug, Default, Clone, Copy)]
struct Used {
    minute: u64,
    day: u64,
    month: u64,
}

/// The answer: every limited route's tenants (those the ledger saw this month and
/// those the policy names), and the windows `window` tells of.
pub(super) async fn table(
    ledger: &Arc<Ledger>,
    policy: &Policy,
    window: &(dyn Fn(&str) -> Option<crate::tiers::micro_batch::WindowState> + Sync),
    now: i64,
) -> Result<Value, String> {
    let limited: BTreeMap<&str, &crate::policy::tokens::TokenRules> = policy
        .routes()
        .iter()
        .filter_map(|r| Some((r.name.as_str(), r.tokens.as_deref().filter(|t| t.limits_anything())?)))
        .collect();
    let mut used: BTreeMap<(String, String), Used> = BTreeMap::new();
    if !limited.is_empty() {
        for row in ledger.read(month_start(now)).await? {
            if !limited.contains_key(row.route.as_str()) {
                continue;
            }
            let tokens = row.figures.get(Field::PromptTokens) + row.figures.get(Field::CompletionTokens);
            for tenant in [row.tenant.clone(), "*".to_owned()] {
                let u = used.entry((row.route.clone(), tenant)).or_default();
                u.month += tokens;
                if row.period >= day_start(now) {
                    u.day += tokens;
                }
                if row.period + row.span > now - 60 {
                    u.minute += tokens;
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (route, rules) in &limited {
        let mut tenants: Vec<String> = rules.tenants.keys().cloned().collect();
        tenants.extend(used.keys().filter(|(r, _)| r == route).map(|(_, t)| t.clone()));
        tenants.sort();
        tenants.dedup();
        for tenant in tenants {
            let allowance = match tenant.as_str() {
                "*" => rules.route.as_ref(),
                name => rules.of(name),
            };
            let Some(allowance) = allowance else { continue };
            let u = used
                .get(&(route.to_string(), tenant.clone()))
                .copied()
                .unwrap_or_default();
            rows.push(row(route, &tenant, u, allowance));
        }
    }
    let windows: Vec<Value> = policy
        .routes()
        .iter()
        .filter_map(|r| {
            let state = window(&r.name)?;
            Some(json!({
                "route": r.name,
                "sequences": state.sequences.0, "max_sequences": state.sequences.1,
                "tokens": state.tokens.0, "max_tokens": state.tokens.1,
            }))
        })
        .collect();
    Ok(json!({ "tenants": rows, "windows": windows }))
}

fn row(route: &str, tenant: &str, used: Used, allowance: &TokenAllowance) -> Value {
    let pair = |used: u64, limit: Option<u64>| json!({ "used": used, "limit": limit });
    let tenant = match tenant {
        "" => ANONYMOUS,
        name => name,
    };
    json!({
        "route": route,
        "tenant": tenant,
        "minute": pair(used.minute, allowance.tokens_per_minute),
        "day": pair(used.day, allowance.daily_tokens),
        "month": pair(used.month, allowance.monthly_tokens),
    })
}
