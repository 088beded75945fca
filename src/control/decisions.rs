//! Which requests a policy change would serve differently.
//!
//! The classifier is a step function of the budget with steps only at a route's
//! thresholds, so comparing two policies needs only one probe per band: for every model
//! and path either policy serves, each budget band between the thresholds of both, no
//! budget at all (the route's default) and `Prefer: respond-async`. The rollout is
//! probed on both sides (inside and outside `micro_batch_percent`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::classify::classify;
use crate::decision::{BudgetSource, Decision, Meta, Refusal};
use crate::policy::{Policy, Route};

/// Most changes reported; a change to a widely used default could list thousands.
const MAX_CHANGES: usize = 200;

/// One kind of request whose answer a change alters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecisionChange {
    /// The route serving it after the change (before, when the change removes it).
    pub route: String,
    /// The requests: their model or path and budget band.
    pub request: String,
    /// How they are served now.
    pub before: String,
    /// How they would be served.
    pub after: String,
}

/// The requests `new` would serve differently from `old` (at most 200 of them).
pub fn compare(old: &Policy, new: &Policy) -> Vec<DecisionChange> {
    let mut targets = BTreeSet::new();
    for policy in [old, new] {
        for route in policy.routes() {
            targets.extend(route.models.iter().map(|m| Target::Model(m.clone())));
            targets.extend(route.paths.iter().map(|p| Target::Path(p.clone())));
        }
    }
    let mut changes = Vec::new();
    for target in targets {
        let (before, after) = (target.route(old), target.route(new));
        let Some(name) = after.or(before).map(|r| r.name.clone()) else {
            continue;
        };
        for (probe, meta) in probes(before, after) {
            let (b, a) = (outcome(before, meta), outcome(after, meta));
            if b != a && changes.len() < MAX_CHANGES {
                changes.push(DecisionChange {
                    route: name.clone(),
                    request: format!("{target}, {probe}"),
                    before: b,
                    after: a,
                });
            }
        }
    }
    changes
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Model(String),
    Path(String),
}

impl Target {
    fn route<'p>(&self, policy: &'p Policy) -> Option<&'p Arc<Route>> {
        match self {
            Target::Model(m) => policy.route_for_model(m),
            Target::Path(p) => policy.route_for_path(p),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Model(m) => write!(f, "model {m}"),
            Target::Path(p) => write!(f, "path {p}"),
        }
    }
}

/// One probe per budget band of both routes, plus no budget and respond-async.
fn probes(a: Option<&Arc<Route>>, b: Option<&Arc<Route>>) -> Vec<(String, Meta)> {
    let mut edges = BTreeSet::from([Duration::ZERO]);
    for route in a.into_iter().chain(b) {
        edges.insert(route.budgets.realtime_below);
        edges.insert(route.budgets.offline_from);
    }
    let edges: Vec<_> = edges.into_iter().collect();
    let meta = |budget: Option<Duration>, prefer_async| Meta {
        budget: budget.map(|d| (d, BudgetSource::Header)),
        prefer_async,
        key: 0,
    };
    let mut probes = vec![
        ("no budget (the route's default)".to_owned(), meta(None, false)),
        ("Prefer: respond-async".to_owned(), meta(None, true)),
    ];
    for (i, from) in edges.iter().enumerate() {
        let band = match edges.get(i + 1) {
            Some(to) => format!("budget {} to under {}", show(*from), show(*to)),
            None => format!("budget {} or more", show(*from)),
        };
        probes.push((band, meta(Some(*from), false)));
    }
    probes
}

/// How `route` serves a request like `meta`, on both sides of its rollout.
fn outcome(route: Option<&Arc<Route>>, meta: Meta) -> String {
    let Some(route) = route else {
        return "404 (no route)".into();
    };
    let percent = u64::from(route.flags.micro_batch_percent);
    let inside = describe(classify(route, &Meta { key: 0, ..meta }));
    let outside = describe(classify(route, &Meta { key: 99, ..meta }));
    match percent {
        0 => outside,
        100 => inside,
        _ if inside == outside => inside,
        p => format!("{inside} for {p}%, {outside} for {}%", 100 - p),
    }
}

fn describe(result: Result<Decision, Refusal>) -> String {
    match result {
        Ok(d) => format!("{} ({})", d.tier.as_str(), d.reason.as_str()),
        Err(r) => format!("503 ({})", r.as_str()),
    }
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn policy(flags: &str) -> Policy {
        let text = format!(
            "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\n{flags}\n[routes.r.realtime]\nendpoints = [\"http://h:1\"]\n\
             [routes.r.micro_batch]\nendpoints = [\"http://h:2\"]\n"
        );
        Policy::from_texts(vec![(PathBuf::from("t.toml"), text)]).expect("valid")
    }

    #[test]
    fn only_the_bands_a_flag_touches_change() {
        let off = policy("realtime = true\nmicro_batch = false");
        let on = policy("realtime = true\nmicro_batch = true");
        assert!(compare(&on, &on).is_empty());
        let changes = compare(&off, &on);
        assert_eq!(changes.len(), 2, "{changes:#?}");
        assert_eq!(changes[0].request, "model m, budget 300ms to under 1m");
        assert_eq!(changes[0].before, "realtime (micro_batch_off)");
        assert_eq!(changes[0].after, "micro_batch (budget_micro_batch)");
        // Offline is off too, so the offline band falls through to micro-batch now.
        assert_eq!(changes[1].request, "model m, budget 1m or more");
        assert_eq!(changes[1].after, "micro_batch (offline_off)");
    }

    #[test]
    fn a_partial_rollout_is_reported_as_shares() {
        let off = policy("realtime = true\nmicro_batch = false");
        let ten = policy("realtime = true\nmicro_batch = true\nmicro_batch_percent = 10");
        let changes = compare(&off, &ten);
        assert_eq!(
            changes[0].after,
            "micro_batch (budget_micro_batch) for 10%, realtime (micro_batch_rollout) for 90%"
        );
    }
}
