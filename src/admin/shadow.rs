//! The admin API's shadow endpoints: a route's shadow report, and promotion of its
//! candidate through the control plane (validated, written back, versioned and audited
//! like any change, so `POST /admin/policy/rollback` undoes it).

use std::time::SystemTime;

use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::control::{edit, Edit};
use crate::policy::{Policy, Route, ShadowSpec};
use crate::shadow::Shadow;

/// Why a shadow endpoint refuses: status, error code, and what to do.
pub(super) type Refusal = (StatusCode, &'static str, String);

/// Pool keys a promotion copies from the candidate into the route's own pools (its
/// concurrency limit and health settings were for shadow traffic, so they are not).
const PROMOTED_KEYS: [&str; 4] = ["endpoints", "http2", "binary_tensors", "connect_timeout"];

/// Route `name`'s shadow report (since `since`, when given), with its candidate, share
/// and gate (which judges the report since its reset).
pub(super) fn report(
    shadow: &Shadow,
    policy: &Policy,
    name: &str,
    since: Option<SystemTime>,
) -> Result<Value, Refusal> {
    let (route, spec) = shadowed(policy, name)?;
    let mut report = shadow
        .report(name, since)
        .unwrap_or_else(|| json!({"compared": 0, "rows": 0}));
    report["route"] = json!(name);
    report["on"] = json!(route.flags.shadow);
    report["candidate"] = json!(spec
        .candidate
        .endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>());
    report["percent"] = json!(spec.percent);
    let unmet = gate(shadow, name, spec).err().unwrap_or_default();
    report["gate"] = json!({
        "min_compared": spec.gate.min_compared,
        "min_agreement": spec.gate.min_agreement,
        "met": unmet.is_empty(),
        "unmet": unmet,
    });
    Ok(report)
}

/// The time a report's `since` query names: an RFC 3339 time in UTC
/// (`2026-12-01T08:00:00Z`, its colons as they are or as `%3A`) or a duration before now
/// (`1h`, `30m`); 400 naming both forms otherwise.
pub(super) fn since(query: Option<&str>) -> Result<Option<SystemTime>, Refusal> {
    let Some(value) = query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("since="))
    else {
        return Ok(None);
    };
    let value = value.replace("%3A", ":").replace("%3a", ":");
    if let Ok(at) = humantime::parse_rfc3339_weak(&value) {
        return Ok(Some(at));
    }
    match humantime::parse_duration(&value) {
        Ok(ago) => Ok(Some(
            SystemTime::now().checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH),
        )),
        Err(_) => Err((
            StatusCode::BAD_REQUEST,
            "bad_since",
            format!("since={value:?}: give an RFC 3339 time (2026-12-01T08:00:00Z) or a duration before now (1h, 30m)"),
        )),
    }
}

/// The change that makes route `name`'s candidate its pool: the candidate's endpoints
/// (and how to speak to them) in every pool the route has, its `[shadow]` table and flag
/// removed; with each unmet part of its gate (none: met). Refused below the gate unless
/// `force` (a dry run shows it below the gate too, with what is unmet).
pub(super) fn promotion(
    shadow: &Shadow,
    policy: &Policy,
    name: &str,
    force: bool,
) -> Result<(Edit, Vec<String>), Refusal> {
    let (route, spec) = shadowed(policy, name)?;
    let unmet = gate(shadow, name, spec).err().unwrap_or_default();
    if !unmet.is_empty() && !force {
        let message = format!(
            "the gate is not met: {}; keep comparing, or promote anyway with `tiergate shadow promote --force` \
             (POST .../promote?force=true)",
            unmet.join("; ")
        );
        return Err((StatusCode::CONFLICT, "gate_not_met", message));
    }
    let file_spec = policy
        .sources()
        .iter()
        .find(|(p, _)| *p == route.file)
        .and_then(|(_, text)| edit::route_spec(text, name))
        .unwrap_or(Value::Null);
    let Some(candidate) = file_spec.pointer("/shadow/candidate").and_then(Value::as_object) else {
        let message = format!("route {name}'s file has no [routes.{name}.shadow.candidate] table to promote");
        return Err((StatusCode::CONFLICT, "no_candidate", message));
    };
    let pool: Map<String, Value> = PROMOTED_KEYS
        .iter()
        .filter_map(|k| candidate.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    let mut patch = json!({"shadow": null, "flags": {"shadow": null}});
    for tier in ["realtime", "micro_batch"] {
        if file_spec.get(tier).is_some() {
            patch[tier] = Value::Object(pool.clone());
        }
    }
    let edit = Edit::Promote {
        name: name.to_owned(),
        patch,
    };
    Ok((edit, unmet))
}

fn shadowed<'p>(policy: &'p Policy, name: &str) -> Result<(&'p Route, &'p ShadowSpec), Refusal> {
    let Some(route) = policy.route(name) else {
        return Err((
            StatusCode::NOT_FOUND,
            "no_such_route",
            format!("no route named {name:?}"),
        ));
    };
    match route.shadow.as_deref() {
        Some(spec) => Ok((route, spec)),
        None => Err((
            StatusCode::NOT_FOUND,
            "no_shadow",
            format!("route {name} has no [shadow] table; add one with a candidate to compare"),
        )),
    }
}

/// Whether the report since its reset meets `spec`'s gate: rows compared, the share of
/// them within tolerance, and the share of compared calls whose status and shapes
/// matched; else each part that is not met, with its value and the gate's threshold.
fn gate(shadow: &Shadow, name: &str, spec: &ShadowSpec) -> Result<(), Vec<String>> {
    // A row the primary answered differently when asked twice (the noise floor) counts
    // as agreeing: it is not held against the candidate.
    let standing = shadow.standing(name);
    let (rows, within, calls, mismatched) = (standing.rows, standing.agreeing, standing.calls, standing.mismatched);
    let gate = spec.gate;
    let mut unmet = Vec::new();
    if rows < gate.min_compared {
        unmet.push(format!("{rows} rows compared, the gate asks for {}", gate.min_compared));
    }
    let agreement = if rows == 0 { 1.0 } else { within as f64 / rows as f64 };
    if agreement < gate.min_agreement {
        unmet.push(format!(
            "{within} of {rows} rows within tolerance ({agreement:.4}), the gate asks for {}",
            gate.min_agreement
        ));
    }
    let matched = if calls == 0 {
        1.0
    } else {
        1.0 - mismatched as f64 / calls as f64
    };
    if matched < gate.min_agreement {
        unmet.push(format!(
            "{mismatched} of {calls} compared calls differ in status or shape ({:.4}), the gate allows {:.4}",
            1.0 - matched,
            1.0 - gate.min_agreement
        ));
    }
    match unmet.is_empty() {
        true => Ok(()),
        false => Err(unmet),
    }
}
