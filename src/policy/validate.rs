//! From file types to runtime types, collecting every problem with its file and path.
//!
//! Validation never stops at the first mistake: an operator fixing a policy sees the
//! whole list at once, each line as `FILE: routes.NAME.KEY: what is wrong`.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::Uri;

use super::file::{
    BatchFile, CacheFile, DefaultsFile, HealthFile, HedgeFile, JsonAdapterFile, LimitsFile, PolicyFile, PoolFile,
    RetryFile, RouteFile, WhenUnmetFile,
};
use super::model::{
    BatchSpec, Borrow, Budgets, CacheSpec, Flags, HealthSpec, HedgeSpec, JsonAdapter, Policy, PoolSpec, Priority, Rate,
    RateLimits, RetryOn, RetrySpec, Route, Scheduling, WhenUnmet,
};
use super::problems::{Check, Problem, Problems};
use super::usage::UsageSpec;

/// Built-in defaults used when no `[defaults]` table sets them.
const DEFAULT_BUDGET: Duration = Duration::from_millis(200);
const REALTIME_BELOW: Duration = Duration::from_millis(300);
const OFFLINE_FROM: Duration = Duration::from_secs(60);
const MAX_CONCURRENCY: u32 = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const EJECT_AFTER: u32 = 3;
const EJECT_FOR: Duration = Duration::from_secs(5);
const CHECK_INTERVAL: Duration = Duration::from_secs(5);
const MAX_BATCH: u32 = 64;
const MAX_WAIT: Duration = Duration::from_millis(20);
const MAX_IN_FLIGHT: u32 = 2;
/// Triton's own default limit on an HTTP request body, and the gateway's.
const MAX_BATCH_BYTES: u64 = 64 << 20;
const QUEUE_CAPACITY: u32 = 4096;
/// The share of a queue beyond which sheddable requests are refused.
const SHED_ABOVE: f64 = 0.5;
/// The largest weight a tenant may have in a fair share.
const MAX_WEIGHT: u32 = 1000;
/// A batcher may hold a request at most this long: the micro-batch SLO.
const MAX_WAIT_CEILING: Duration = Duration::from_secs(5);

/// Validates parsed files, in order, into one policy.
pub(super) fn policy(files: Vec<(PathBuf, PolicyFile)>) -> Result<Policy, Problems> {
    let mut problems = Vec::new();
    let mut defaults = defaults(&files, &mut problems);
    defaults.quotas = overall_quotas(&files, &mut problems);
    let prices = files
        .iter()
        .filter_map(|(file, parsed)| Some((file, parsed.usage.as_ref()?.prices.as_ref()?)));
    defaults.prices = super::prices::overall(prices, &mut problems);
    let mut policy = Policy::default();
    for (file, parsed) in &files {
        let mut check = Check {
            file,
            problems: &mut problems,
        };
        for (name, route_file) in &parsed.routes {
            let route = Arc::new(route(&mut check, name, route_file, &defaults));
            index(&mut check, &mut policy, route);
        }
    }
    if problems.is_empty() {
        Ok(policy)
    } else {
        Err(Problems(problems))
    }
}

/// The effective defaults, and a problem for every file past the first that sets them.
fn defaults(files: &[(PathBuf, PolicyFile)], problems: &mut Vec<Problem>) -> Defaults {
    let mut found: Option<(&Path, &DefaultsFile)> = None;
    for (file, parsed) in files {
        let Some(d) = &parsed.defaults else { continue };
        match found {
            None => found = Some((file, d)),
            Some((first, _)) => problems.push(Problem {
                file: file.clone(),
                path: "defaults".into(),
                message: format!("already set in {}; keep one [defaults] table", first.display()),
            }),
        }
    }
    let d = found.map(|(_, d)| d);
    let header = d
        .and_then(|d| d.rollout_key_header.as_deref())
        .unwrap_or("x-request-id");
    let rollout_key_header = match http::HeaderName::try_from(header) {
        Ok(h) => h,
        Err(_) => {
            problems.push(Problem {
                file: found.map(|(f, _)| f.to_owned()).unwrap_or_default(),
                path: "defaults.rollout_key_header".into(),
                message: format!("{header:?} is not a valid HTTP header name"),
            });
            http::HeaderName::from_static("x-request-id")
        }
    };
    let defaults = Defaults {
        default_budget: d.and_then(|d| d.default_budget).unwrap_or(DEFAULT_BUDGET),
        realtime_below: d.and_then(|d| d.realtime_below).unwrap_or(REALTIME_BELOW),
        offline_from: d.and_then(|d| d.offline_from).unwrap_or(OFFLINE_FROM),
        when_unmet: d.and_then(|d| d.when_unmet).unwrap_or(WhenUnmetFile::Reject),
        rollout_key_header,
        body_check: d.and_then(|d| d.body_check).unwrap_or_default(),
        quotas: None,
        prices: None,
    };
    // Checked once, where they are written; a route that keeps them is not told again.
    if let Some((file, _)) = found {
        let budgets = Budgets {
            default: defaults.default_budget,
            realtime_below: defaults.realtime_below,
            offline_from: defaults.offline_from,
        };
        for (path, message) in budget_problems(&budgets) {
            problems.push(Problem {
                file: file.to_owned(),
                path: format!("defaults.{path}"),
                message,
            });
        }
    }
    defaults
}

struct Defaults {
    default_budget: Duration,
    realtime_below: Duration,
    offline_from: Duration,
    when_unmet: WhenUnmetFile,
    rollout_key_header: http::HeaderName,
    body_check: crate::protocol::BodyCheck,
    /// Tenants' quotas across every route (`[quotas]`).
    quotas: Option<Arc<super::usage::Quotas>>,
    /// Token prices for every route (`[usage.prices]`).
    prices: Option<Arc<super::prices::TokenPrices>>,
}

/// The `[quotas]` table across every route, and a problem for every file past the first
/// that sets one.
fn overall_quotas(files: &[(PathBuf, PolicyFile)], problems: &mut Vec<Problem>) -> Option<Arc<super::usage::Quotas>> {
    let mut found: Option<(&Path, super::usage::Quotas)> = None;
    for (file, parsed) in files {
        let Some(q) = &parsed.quotas else { continue };
        match &found {
            None => {
                let mut check = Check { file, problems };
                found = Some((file, super::usage::quotas(&mut check, "quotas", q)));
            }
            Some((first, _)) => problems.push(Problem {
                file: file.clone(),
                path: "quotas".into(),
                message: format!("already set in {}; keep one [quotas] table", first.display()),
            }),
        }
    }
    found.map(|(_, q)| Arc::new(q))
}

fn route(check: &mut Check<'_>, name: &str, file: &RouteFile, defaults: &Defaults) -> Route {
    let at = format!("routes.{name}");
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        check.fail(&at, "route names use only letters, digits, '_' and '-'");
    }
    if file.models.is_empty() && file.paths.is_empty() {
        check.fail(
            &at,
            "matches nothing: set `models` (KServe model names) or `paths` (JSON routes)",
        );
    }
    let budgets = budgets(check, &at, file, defaults);
    let flags = flags(check, &at, file);
    // KServe v2 routes have a standard readiness path to poll; JSON services do not.
    let kserve = file.paths.is_empty();
    let realtime = file
        .realtime
        .as_ref()
        .map(|p| Arc::new(pool(check, &format!("{at}.realtime"), p, kserve)));
    let micro_batch = file.micro_batch.as_ref().map(|b| {
        Arc::new(batch(
            check,
            &format!("{at}.micro_batch"),
            b,
            (kserve, budgets.realtime_below),
        ))
    });
    if let Some(b) = micro_batch.as_ref().filter(|b| b.json_adapter.is_some()) {
        let at = format!("{at}.micro_batch.json_adapter");
        if file.paths.is_empty() {
            check.fail(
                at,
                "is set but the route serves no JSON paths; add `paths` or remove it",
            );
        } else if b.pool.is_grpc() {
            check.fail(
                at,
                "needs http:// or https:// endpoints: JSON routes are not KServe v2 and cannot go over gRPC",
            );
        }
    }
    if let Some(b) = &micro_batch {
        super::combined::reachable(check, &format!("{at}.micro_batch.combined"), &b.combined, &file.models);
    }
    if flags.realtime && realtime.is_none() {
        check.fail(
            format!("{at}.flags.realtime"),
            "is on but the route has no [realtime] pool",
        );
    }
    for (on, flag) in [(flags.micro_batch, "micro_batch"), (flags.offline, "offline")] {
        if on && micro_batch.is_none() {
            check.fail(
                format!("{at}.flags.{flag}"),
                "is on but the route has no [micro_batch] pool",
            );
        }
    }
    let shadow = file.shadow.as_ref().and_then(|s| {
        let at = format!("{at}.shadow");
        let candidate = s.candidate.as_ref().map(|c| {
            let mut spec = pool(check, &format!("{at}.candidate"), c, kserve);
            if c.max_concurrency.is_none() {
                spec.max_concurrency = NonZeroU32::new(super::shadow::MAX_CONCURRENCY).expect("non-zero");
            }
            spec
        });
        super::shadow::spec(check, &at, s, candidate).map(Arc::new)
    });
    let cache = file
        .cache
        .as_ref()
        .map(|c| Arc::new(cache(check, &format!("{at}.cache"), c)));
    if flags.cache && cache.is_none() {
        check.fail(format!("{at}.flags.cache"), "is on but the route has no [cache] table");
    }
    if flags.shadow && file.shadow.is_none() {
        check.fail(
            format!("{at}.flags.shadow"),
            "is on but the route has no [shadow] table",
        );
    }
    let borrow = Borrow {
        realtime_overflow: file.borrow.realtime_overflow.unwrap_or(false),
        offline_on_realtime: file.borrow.offline_on_realtime.unwrap_or(false),
    };
    if borrow.realtime_overflow && micro_batch.is_none() {
        check.fail(
            format!("{at}.borrow.realtime_overflow"),
            "needs a [micro_batch] pool to overflow into",
        );
    }
    let fallback = file
        .fallback
        .as_ref()
        .map(|p| Arc::new(pool(check, &format!("{at}.fallback"), p, kserve)));
    let candidate = file.shadow.as_ref().and_then(|s| s.candidate.as_ref());
    for (pool_file, pool_at) in [(file.fallback.as_ref(), "fallback"), (candidate, "shadow.candidate")] {
        if let Some(p) = pool_file {
            let keys = (p.cost_per_hour.is_some(), p.currency.is_some(), p.capacity.is_some());
            super::usage::none_here(check, &format!("{at}.{pool_at}"), keys);
        }
    }
    let usage = UsageSpec {
        realtime: file.realtime.as_ref().map_or_else(Default::default, |p| {
            super::usage::pool(
                check,
                &format!("{at}.realtime"),
                (p.cost_per_hour, p.currency.as_ref(), p.capacity.as_ref()),
            )
        }),
        micro_batch: file.micro_batch.as_ref().map_or_else(Default::default, |b| {
            super::usage::pool(
                check,
                &format!("{at}.micro_batch"),
                (b.cost_per_hour, b.currency.as_ref(), b.capacity.as_ref()),
            )
        }),
    };
    if fallback.is_some() && realtime.is_none() {
        check.fail(
            format!("{at}.fallback"),
            "stands in for the [realtime] pool, and the route has none",
        );
    }
    if borrow.offline_on_realtime && realtime.is_none() {
        check.fail(
            format!("{at}.borrow.offline_on_realtime"),
            "needs a [realtime] pool to borrow",
        );
    }
    let streams = streams(check, &at, file);
    Route {
        streams,
        backend_priority: file.backend_priority,
        name: name.to_owned(),
        file: check.file.to_owned(),
        models: file.models.clone(),
        paths: file.paths.clone(),
        budgets,
        when_unmet: match file.when_unmet.unwrap_or(defaults.when_unmet) {
            WhenUnmetFile::Reject => WhenUnmet::Reject,
            WhenUnmetFile::BestEffort => WhenUnmet::BestEffort,
        },
        rollout_key_header: defaults.rollout_key_header.clone(),
        body_check: file.body_check.unwrap_or(defaults.body_check),
        tenant_header: route_tenant_header(check, &at, file),
        flags,
        realtime,
        micro_batch,
        limits: file
            .limits
            .as_ref()
            .and_then(|l| limits(check, &format!("{at}.limits"), l)),
        borrow,
        shadow,
        cache,
        fallback,
        usage,
        quotas: route_quotas(check, &at, file.quotas.as_ref(), defaults.quotas.as_ref()),
        tokens: file
            .tokens
            .as_ref()
            .map(|t| Arc::new(super::tokens::rules(check, &format!("{at}.tokens"), t))),
        prices: match &file.prices {
            Some(p) => Some(Arc::new(super::prices::prices(check, &format!("{at}.prices"), p))),
            None => defaults.prices.clone(),
        },
        version: std::sync::OnceLock::new(),
        index: std::sync::OnceLock::new(),
    }
}

/// The quotas `at`'s requests are held to: its own `quotas` table and `overall`;
/// `None` when neither is set (the request path then checks nothing).
fn route_quotas(
    check: &mut Check<'_>,
    at: &str,
    file: Option<&super::file::QuotasFile>,
    overall: Option<&Arc<super::usage::Quotas>>,
) -> Option<Arc<super::usage::RouteQuotas>> {
    let route = file.map(|q| super::usage::quotas(check, &format!("{at}.quotas"), q));
    (route.is_some() || overall.is_some()).then(|| {
        Arc::new(super::usage::RouteQuotas {
            route,
            overall: overall.cloned(),
        })
    })
}

/// The route's one tenant header: `tenant_header` of the route, or as its `limits` or
/// `micro_batch` table says it (the places it was set before it was the route's), which
/// must then all name the same header; `x-api-key` when none does.
fn route_tenant_header(check: &mut Check<'_>, at: &str, file: &RouteFile) -> http::HeaderName {
    let said = [
        (format!("{at}.tenant_header"), file.tenant_header.as_deref()),
        (
            format!("{at}.limits.tenant_header"),
            file.limits.as_ref().and_then(|l| l.tenant_header.as_deref()),
        ),
        (
            format!("{at}.micro_batch.tenant_header"),
            file.micro_batch.as_ref().and_then(|b| b.tenant_header.as_deref()),
        ),
    ];
    let mut chosen: Option<(String, http::HeaderName)> = None;
    for (path, value) in said {
        let Some(value) = value else { continue };
        let Ok(header) = http::HeaderName::try_from(value) else {
            check.fail(path, format!("{value:?} is not a valid header name"));
            continue;
        };
        match &chosen {
            None => chosen = Some((path, header)),
            Some((first, named)) if *named != header => check.fail(
                path,
                format!(
                    "names {header} but {first} names {named}: a route has one tenant header, used by its cache, \
                     rate limits and fair shares alike; set it once, as {at}.tenant_header"
                ),
            ),
            Some(_) => {}
        }
    }
    chosen.map_or(http::HeaderName::from_static("x-api-key"), |(_, h)| h)
}

/// Rate limits, or `None` when the table sets no rate.
fn limits(check: &mut Check<'_>, at: &str, file: &LimitsFile) -> Option<Arc<RateLimits>> {
    let route = rate(check, at, "rate", file.rate, "burst", file.burst);
    let tenant = rate(
        check,
        at,
        "tenant_rate",
        file.tenant_rate,
        "tenant_burst",
        file.tenant_burst,
    );
    (route.is_some() || tenant.is_some()).then(|| Arc::new(RateLimits { route, tenant }))
}

fn rate(
    check: &mut Check<'_>,
    at: &str,
    key: &str,
    rate: Option<f64>,
    burst_key: &str,
    burst: Option<i64>,
) -> Option<Rate> {
    let Some(per_second) = rate else {
        if burst.is_some() {
            check.fail(format!("{at}.{burst_key}"), format!("needs {key} as well"));
        }
        return None;
    };
    if !(per_second.is_finite() && (0.001..=1_000_000.0).contains(&per_second)) {
        check.fail(
            format!("{at}.{key}"),
            format!("must be 0.001 to 1000000 requests per second, got {per_second}"),
        );
        return None;
    }
    let default_burst = per_second.ceil().max(1.0) as i64;
    let burst = burst.unwrap_or(default_burst);
    let Some(burst) = u32::try_from(burst).ok().and_then(NonZeroU32::new) else {
        check.fail(format!("{at}.{burst_key}"), format!("must be 1 or more, got {burst}"));
        return None;
    };
    Some(Rate {
        period: Duration::from_secs_f64(1.0 / per_second),
        burst,
    })
}

fn budgets(check: &mut Check<'_>, at: &str, file: &RouteFile, defaults: &Defaults) -> Budgets {
    let budgets = Budgets {
        default: file.default_budget.unwrap_or(defaults.default_budget),
        realtime_below: file.realtime_below.unwrap_or(defaults.realtime_below),
        offline_from: file.offline_from.unwrap_or(defaults.offline_from),
    };
    // Only what the route sets itself: the defaults were checked where they are written.
    for (path, message) in budget_problems(&budgets) {
        let own = match path {
            "default_budget" => file.default_budget.is_some(),
            _ => file.realtime_below.is_some() || file.offline_from.is_some(),
        };
        if own {
            check.fail(format!("{at}.{path}"), message);
        }
    }
    budgets
}

/// What is wrong with `budgets`: (key, message) pairs.
fn budget_problems(budgets: &Budgets) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if budgets.default.is_zero() {
        out.push(("default_budget", "must be more than 0ms".to_owned()));
    }
    if budgets.realtime_below >= budgets.offline_from {
        out.push((
            "offline_from",
            format!(
                "must be above realtime_below ({}), got {}",
                humantime::format_duration(budgets.realtime_below),
                humantime::format_duration(budgets.offline_from)
            ),
        ));
    }
    out
}

fn flags(check: &mut Check<'_>, at: &str, file: &RouteFile) -> Flags {
    let f = &file.flags;
    let percent = match f.micro_batch_percent {
        None => 100,
        Some(p) => u8::try_from(p).ok().filter(|p| *p <= 100).unwrap_or_else(|| {
            check.fail(
                format!("{at}.flags.micro_batch_percent"),
                format!("must be 0 to 100, got {p}"),
            );
            100
        }),
    };
    Flags {
        realtime: f.realtime.unwrap_or(true),
        micro_batch: f.micro_batch.unwrap_or(false),
        offline: f.offline.unwrap_or(false),
        micro_batch_percent: percent,
        shadow: f.shadow.unwrap_or(false),
        cache: f.cache.unwrap_or(false),
    }
}

/// Longest a cached answer may be kept.
const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The validated `[cache]` table at `at`.
fn cache(check: &mut Check<'_>, at: &str, file: &CacheFile) -> CacheSpec {
    let ttl = file.ttl.unwrap_or(Duration::from_secs(300));
    if ttl.is_zero() || ttl > MAX_TTL {
        check.fail(format!("{at}.ttl"), "must be more than 0s and at most 7d");
    }
    let max_bytes = match file.max_bytes {
        None => 64 << 20,
        Some(n) if (1024..=1 << 40).contains(&n) => n as u64,
        Some(n) => {
            check.fail(
                format!("{at}.max_bytes"),
                format!("must be 1024 to 2^40 bytes, got {n}"),
            );
            64 << 20
        }
    };
    let mut headers = |key: &str, names: &[String]| -> Vec<http::HeaderName> {
        let mut out = Vec::new();
        for (i, name) in names.iter().enumerate() {
            match http::HeaderName::try_from(name.as_str()) {
                Ok(header) if !out.contains(&header) => out.push(header),
                Ok(_) => check.fail(format!("{at}.{key}[{i}]"), format!("{name:?} is named twice")),
                Err(_) => check.fail(
                    format!("{at}.{key}[{i}]"),
                    format!("{name:?} is not a valid header name"),
                ),
            }
        }
        out
    };
    let vary = headers("vary", &file.vary);
    let ignore_headers = headers("ignore_headers", &file.ignore_headers);
    for (i, header) in ignore_headers.iter().enumerate() {
        if vary.contains(header) {
            check.fail(
                format!("{at}.ignore_headers[{i}]"),
                format!("{header} is in vary too: a header either changes the answer or does not"),
            );
        }
    }
    CacheSpec {
        ttl,
        max_bytes,
        shared_across_tenants: file.shared_across_tenants.unwrap_or(false),
        coalesce: file.coalesce.unwrap_or(true),
        rows: file.rows.unwrap_or(true),
        vary,
        ignore_headers,
    }
}

fn pool(check: &mut Check<'_>, at: &str, file: &PoolFile, kserve: bool) -> PoolSpec {
    PoolSpec {
        endpoints: endpoints(check, at, &file.endpoints),
        max_concurrency: check.nonzero(format!("{at}.max_concurrency"), file.max_concurrency, MAX_CONCURRENCY),
        http2: file.http2.unwrap_or(false),
        binary_tensors: file.binary_tensors.unwrap_or(true),
        connect_timeout: connect_timeout(check, at, file.connect_timeout),
        health: health(check, at, file.health.as_ref(), kserve),
        retry: retry(check, at, file.retry.as_ref()),
        hedge: file.hedge.as_ref().map(|hedge| hedge_spec(check, at, hedge)),
        model: file
            .model
            .as_ref()
            .and_then(|model| served_as(check, at, model, kserve)),
    }
}

/// A `[fallback]` pool's `model`: a KServe v2 route's, a model name that fits a path.
fn served_as(check: &mut Check<'_>, at: &str, model: &str, kserve: bool) -> Option<String> {
    let key = format!("{at}.model");
    if !at.ends_with(".fallback") {
        check.fail(key, "only a [fallback] pool serves the calls as another model");
        return None;
    }
    if !kserve {
        check.fail(
            key,
            "serves KServe v2 inference as another model; the route has no `models`",
        );
        return None;
    }
    let fits = !model.is_empty()
        && model.len() <= 256
        && model.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !fits {
        check.fail(
            key,
            format!("must be a model name (letters, digits, '-', '_' and '.', at most 256), got {model:?}"),
        );
        return None;
    }
    Some(model.to_owned())
}

/// Hedge defaults: after the pool's learned p95, within 2% more calls.
fn hedge_spec(check: &mut Check<'_>, at: &str, file: &HedgeFile) -> HedgeSpec {
    let at = format!("{at}.hedge");
    let after = file.after.filter(|after| {
        let fits = (Duration::from_millis(1)..=Duration::from_secs(60)).contains(after);
        if !fits {
            check.fail(format!("{at}.after"), format!("must be 1ms to 60s, got {after:?}"));
        }
        fits
    });
    let budget_per_mille = match file.budget_percent {
        None => 20,
        // Within 0..=100, so the rounded per-mille fits.
        Some(p) if (0.0..=100.0).contains(&p) => (p * 10.0).round() as u32,
        Some(p) => {
            check.fail(format!("{at}.budget_percent"), format!("must be 0 to 100, got {p}"));
            20
        }
    };
    HedgeSpec {
        after,
        budget_per_mille,
    }
}

/// Retry defaults: at most 2 retries, within 10% of the calls over 10 s, at least 3 a
/// second; which failures by the call's path.
fn retry(check: &mut Check<'_>, at: &str, file: Option<&RetryFile>) -> RetrySpec {
    let empty = RetryFile::default();
    let file = file.unwrap_or(&empty);
    let at = format!("{at}.retry");
    let on = file.on.as_ref().map(|kinds| {
        let mut on = RetryOn::default();
        for (i, kind) in kinds.iter().enumerate() {
            match kind.as_str() {
                "reset" => on.reset = true,
                "unavailable" => on.unavailable = true,
                "error" => on.error = true,
                other => check.fail(
                    format!("{at}.on[{i}]"),
                    format!(
                        "must be \"reset\", \"unavailable\" or \"error\", got {other:?} (an unreachable endpoint is \
                         always retried)"
                    ),
                ),
            }
        }
        on
    });
    let max_retries = match file.max_retries {
        None => 2,
        Some(n) => u32::try_from(n).ok().filter(|n| *n <= 10).unwrap_or_else(|| {
            check.fail(format!("{at}.max_retries"), format!("must be 0 to 10, got {n}"));
            2
        }),
    };
    let budget_per_mille = match file.budget_percent {
        None => 100,
        // Within 0..=100, so the rounded per-mille fits.
        Some(p) if (0.0..=100.0).contains(&p) => (p * 10.0).round() as u32,
        Some(p) => {
            check.fail(format!("{at}.budget_percent"), format!("must be 0 to 100, got {p}"));
            100
        }
    };
    let min_per_second = match file.min_per_second {
        None => 3,
        Some(n) => u32::try_from(n).ok().filter(|n| *n <= 10_000).unwrap_or_else(|| {
            check.fail(format!("{at}.min_per_second"), format!("must be 0 to 10000, got {n}"));
            3
        }),
    };
    RetrySpec {
        on,
        max_retries,
        budget_per_mille,
        min_per_second,
    }
}

/// Health defaults: eject after 3 failures in a row for 5 s; poll KServe readiness every 5 s.
fn health(check: &mut Check<'_>, at: &str, file: Option<&HealthFile>, kserve: bool) -> HealthSpec {
    let empty = HealthFile::default();
    let file = file.unwrap_or(&empty);
    let at = format!("{at}.health");
    let eject_after = match file.eject_after {
        None => EJECT_AFTER,
        Some(n) => u32::try_from(n).unwrap_or_else(|_| {
            check.fail(
                format!("{at}.eject_after"),
                format!("must be 0 (never) or more, got {n}"),
            );
            EJECT_AFTER
        }),
    };
    let eject_for = file.eject_for.unwrap_or(EJECT_FOR);
    if eject_for.is_zero() {
        check.fail(format!("{at}.eject_for"), "must be more than 0ms");
    }
    if file.slow_call.is_some_and(|d| d.is_zero()) {
        check.fail(
            format!("{at}.slow_call"),
            "must be more than 0ms (leave it out to turn it off)",
        );
    }
    let check_path = match file.check_path.as_deref() {
        Some("") => None,
        Some(p) if p.starts_with('/') && p.parse::<http::uri::PathAndQuery>().is_ok() => Some(p.to_owned()),
        Some(p) => {
            check.fail(
                format!("{at}.check_path"),
                format!("must be a path such as \"/v2/health/ready\", got {p:?}"),
            );
            None
        }
        None => kserve.then(|| "/v2/health/ready".to_owned()),
    };
    let check_interval = file.check_interval.unwrap_or(CHECK_INTERVAL);
    if check_interval < Duration::from_millis(100) {
        check.fail(format!("{at}.check_interval"), "must be at least 100ms");
    }
    HealthSpec {
        eject_after,
        eject_for,
        slow_call: file.slow_call,
        check_path,
        check_interval,
    }
}

fn batch(check: &mut Check<'_>, at: &str, file: &BatchFile, (kserve, realtime_below): (bool, Duration)) -> BatchSpec {
    let endpoints = endpoints(check, at, &file.endpoints);
    let max_batch = check.nonzero(format!("{at}.max_batch"), file.max_batch, MAX_BATCH);
    let max_in_flight = check.nonzero(format!("{at}.max_in_flight"), file.max_in_flight, MAX_IN_FLIGHT);
    let queue_capacity = check.nonzero(format!("{at}.queue_capacity"), file.queue_capacity, QUEUE_CAPACITY);
    if queue_capacity < max_batch {
        check.fail(
            format!("{at}.queue_capacity"),
            format!("must hold at least one full batch (max_batch = {max_batch}), got {queue_capacity}"),
        );
    }
    let max_wait = file.max_wait.unwrap_or(MAX_WAIT);
    if max_wait.is_zero() || max_wait > MAX_WAIT_CEILING {
        check.fail(
            format!("{at}.max_wait"),
            "must be more than 0ms and at most 5s (the micro-batch SLO)",
        );
    }
    let max_batch_bytes = match file.max_batch_bytes {
        None => MAX_BATCH_BYTES,
        Some(n) if (1024..=1 << 40).contains(&n) => n as u64,
        Some(n) => {
            check.fail(
                format!("{at}.max_batch_bytes"),
                format!("must be 1024 to 2^40 bytes, got {n}"),
            );
            MAX_BATCH_BYTES
        }
    };
    let endpoint_count = u32::try_from(endpoints.len().max(1)).unwrap_or(u32::MAX);
    let window = file
        .window
        .as_ref()
        .map(|w| super::window::window(check, &format!("{at}.window"), w, realtime_below));
    // A window's sequences are calls in flight on the pool too.
    let per_endpoint = window
        .as_ref()
        .map_or(max_in_flight, |w| w.max_sequences.max(max_in_flight));
    let max_concurrency = NonZeroU32::new(endpoint_count.saturating_mul(per_endpoint.get()))
        .expect("product of non-zero numbers, saturating");
    BatchSpec {
        pool: Arc::new(PoolSpec {
            endpoints,
            max_concurrency,
            http2: file.http2.unwrap_or(false),
            binary_tensors: file.binary_tensors.unwrap_or(true),
            connect_timeout: connect_timeout(check, at, file.connect_timeout),
            health: health(check, at, file.health.as_ref(), kserve),
            retry: retry(check, at, file.retry.as_ref()),
            hedge: None,
            model: None,
        }),
        max_batch,
        max_wait,
        max_batch_bytes,
        max_in_flight,
        queue_capacity,
        json_adapter: file.json_adapter.map(|a| match a {
            JsonAdapterFile::TfServing => JsonAdapter::TfServing,
            JsonAdapterFile::OpenaiEmbeddings => JsonAdapter::OpenaiEmbeddings,
            JsonAdapterFile::OpenaiCompletions => JsonAdapter::OpenaiCompletions,
        }),
        scheduling: scheduling(check, at, file, queue_capacity),
        combined: super::combined::members(check, &format!("{at}.combined"), &file.combined),
        window,
    }
}

/// A route's stream settings, each from 1 s to a day.
fn streams(check: &mut Check<'_>, at: &str, file: &RouteFile) -> crate::policy::model::Streams {
    let defaults = crate::policy::model::Streams::default();
    let mut within = |key: &str, value: Option<Duration>, default: Duration| match value {
        None => default,
        Some(d) if (Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&d) => d,
        Some(d) => {
            check.fail(format!("{at}.{key}"), format!("must be 1s to 24h, got {d:?}"));
            default
        }
    };
    crate::policy::model::Streams {
        max_duration: within("max_stream_duration", file.max_stream_duration, defaults.max_duration),
        idle: within("stream_idle_timeout", file.stream_idle_timeout, defaults.idle),
    }
}

/// The batch pool's bands and fair shares.
fn scheduling(check: &mut Check<'_>, at: &str, file: &BatchFile, capacity: NonZeroU32) -> Scheduling {
    let mut band = |key: &str, value: Option<&str>, default: Priority| match value {
        None => default,
        Some(name) => Priority::parse(name).unwrap_or_else(|| {
            check.fail(
                format!("{at}.{key}"),
                format!("{name:?} is not a band; use \"critical\", \"standard\" or \"sheddable\""),
            );
            default
        }),
    };
    let priority = band("priority", file.priority.as_deref(), Priority::Standard);
    // Standard by default (or the route's own band, when that is higher): a band above
    // it is a promise to some callers over others, which only the operator can make
    // (tenant_max_priority, for tenants with keys).
    let max_priority = band(
        "max_priority",
        file.max_priority.as_deref(),
        priority.max(Priority::Standard),
    );
    let tenant_max_priority = file
        .tenant_max_priority
        .iter()
        .map(|(tenant, name)| {
            let ceiling = band(&format!("tenant_max_priority.{tenant}"), Some(name), max_priority);
            (tenant.clone(), ceiling)
        })
        .collect();
    if priority > max_priority {
        check.fail(
            format!("{at}.priority"),
            format!(
                "{} is above max_priority ({})",
                priority.as_str(),
                max_priority.as_str()
            ),
        );
    }
    let shed_above = file.shed_above.unwrap_or(SHED_ABOVE);
    if !(shed_above > 0.0 && shed_above <= 1.0) {
        check.fail(
            format!("{at}.shed_above"),
            format!("must be a share of queue_capacity, more than 0 and at most 1, got {shed_above}"),
        );
    }
    let shed_at = (f64::from(capacity.get()) * shed_above.clamp(0.0, 1.0)).ceil() as u32;
    let mut tenant_weights = std::collections::BTreeMap::new();
    for (tenant, &weight) in &file.tenant_weights {
        match u32::try_from(weight).ok().filter(|w| (1..=MAX_WEIGHT).contains(w)) {
            Some(w) => {
                tenant_weights.insert(tenant.clone(), NonZeroU32::new(w).expect("at least 1"));
            }
            None => check.fail(
                format!("{at}.tenant_weights.{tenant}"),
                format!("must be between 1 and {MAX_WEIGHT}, got {weight}"),
            ),
        }
    }
    Scheduling {
        priority,
        max_priority,
        shed_at,
        tenant_weights,
        tenant_max_priority,
    }
}

fn connect_timeout(check: &mut Check<'_>, at: &str, value: Option<Duration>) -> Duration {
    let timeout = value.unwrap_or(CONNECT_TIMEOUT);
    if timeout.is_zero() {
        check.fail(format!("{at}.connect_timeout"), "must be more than 0ms");
    }
    timeout
}

fn endpoints(check: &mut Check<'_>, at: &str, raw: &[String]) -> Vec<Uri> {
    if raw.is_empty() {
        check.fail(
            format!("{at}.endpoints"),
            "needs at least one backend URL such as \"http://10.0.0.5:8000\"",
        );
    }
    let mut out: Vec<Uri> = Vec::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        let path = format!("{at}.endpoints[{i}]");
        match endpoint(text) {
            Ok(uri) if out.contains(&uri) => check.fail(path, format!("{text:?} is listed twice")),
            Ok(uri) if out.first().is_some_and(|first| first.scheme() != uri.scheme()) => check.fail(
                path,
                format!(
                    "{text:?} speaks another protocol than {}; a pool's endpoints speak one",
                    out[0]
                ),
            ),
            Ok(uri) => out.push(uri),
            Err(why) => check.fail(path, format!("{text:?} {why}")),
        }
    }
    out
}

/// Parses one backend base URL: `http://host:port` (or `https`, `grpc`, `grpcs`),
/// nothing after the authority.
fn endpoint(text: &str) -> Result<Uri, &'static str> {
    let uri: Uri = text.parse().map_err(|_| "is not a URL; write it as http://host:port")?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https" | "grpc" | "grpcs")) => s.to_owned(),
        _ => {
            return Err(
                "must start with http:// or https:// (KServe v2 over HTTP, clear or TLS) or grpc:// or grpcs:// (over gRPC)",
            )
        }
    };
    let authority = uri.authority().ok_or("has no host")?;
    if authority.port_u16().is_none() {
        return Err("has no port; write it as http://host:port");
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    if matches!(scheme.as_str(), "https" | "grpcs") && rustls_pki_types::ServerName::try_from(host).is_err() {
        return Err("has a host that cannot be a TLS server name (a DNS name or an IP address)");
    }
    if authority.as_str().contains('@') {
        return Err("must not carry credentials");
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err("must not have a path or query: the request path is appended to it");
    }
    Uri::builder()
        .scheme(scheme.as_str())
        .authority(authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|_| "is not a valid URL")
}

/// Adds `route` to the policy and its model and path indexes, refusing overlaps.
fn index(check: &mut Check<'_>, policy: &mut Policy, route: Arc<Route>) {
    let at = format!("routes.{}", route.name);
    if let Some(other) = policy.route(&route.name) {
        check.fail(&at, format!("route name already used in {}", other.file.display()));
        return;
    }
    claim(
        check,
        &mut policy.by_model,
        &route,
        &route.models,
        &format!("{at}.models"),
        "model",
    );
    for (i, path) in route.paths.iter().enumerate() {
        if !path.starts_with('/') || path.starts_with("/v2/") || path == "/v2" {
            check.fail(
                format!("{at}.paths[{i}]"),
                format!("{path:?} must start with '/' and must not be under /v2 (the KServe door owns it)"),
            );
        } else if RESERVED.iter().any(|r| path == r || path.starts_with(&format!("{r}/"))) {
            check.fail(
                format!("{at}.paths[{i}]"),
                format!(
                    "{path:?} is under {}, which the offline tier's API owns",
                    RESERVED.join(", ")
                ),
            );
        }
    }
    // OpenAI's paths are shared by routes that list the `model` values they serve; a
    // route listing none has its path to itself, as any JSON route.
    let (openai, plain): (Vec<String>, Vec<String>) = route
        .paths
        .iter()
        .cloned()
        .partition(|p| crate::llm::openai::is_path(p) && !route.models.is_empty());
    let keys: Vec<String> = openai
        .iter()
        .flat_map(|p| route.models.iter().map(move |m| format!("{p}\n{m}")))
        .collect();
    claim(
        check,
        &mut policy.by_openai,
        &route,
        &keys,
        &format!("{at}.models"),
        "OpenAI path and model",
    );
    claim(
        check,
        &mut policy.by_path,
        &route,
        &plain,
        &format!("{at}.paths"),
        "path",
    );
    policy.routes.push(route);
}

/// Paths the gateway answers itself (offline jobs and the Batch API).
const RESERVED: [&str; 3] = ["/v1/jobs", "/v1/files", "/v1/batches"];

fn claim(
    check: &mut Check<'_>,
    index: &mut super::model::Index,
    route: &Arc<Route>,
    keys: &[String],
    at: &str,
    what: &str,
) {
    for (i, key) in keys.iter().enumerate() {
        if key.is_empty() {
            check.fail(format!("{at}[{i}]"), format!("an empty {what} matches nothing"));
        } else if let Some(owner) = index.get(key) {
            let message = format!(
                "{what} {key:?} is already served by route {} ({})",
                owner.name,
                owner.file.display()
            );
            check.fail(format!("{at}[{i}]"), message);
        } else {
            index.insert(key.clone(), route.clone());
        }
    }
}
