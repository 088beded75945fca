//! A pool's price and capacity settings (`cost_per_hour`, `currency`, `[capacity]` in
//! a route's `[realtime]` and `[micro_batch]` tables): what the usage ledger turns
//! backend-seconds into money with, and how the capacity signal is worked out.
//!
//! Kept beside the pool's spec, not in it: a new price or target leaves the pool (its
//! connections, its learned costs) as it is.

use std::time::Duration;

use super::file::CapacityFile;
use super::problems::Check;

/// The share of its time an endpoint should be busy, unless the policy says.
pub const TARGET_UTILISATION: f64 = 0.7;
/// The window a pool's arrivals and cost are averaged over, unless the policy says.
pub const WINDOW: Duration = Duration::from_secs(30);
/// The shortest and longest window.
const WINDOWS: std::ops::RangeInclusive<Duration> = Duration::from_secs(5)..=Duration::from_secs(600);

/// One pool's price and capacity settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolUsage {
    /// What an hour of one endpoint's time costs; `None`: the ledger counts seconds only.
    pub price: Option<Price>,
    /// How the pool's capacity signal is worked out.
    pub capacity: Capacity,
}

/// What an hour of one endpoint's time costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Price {
    /// Per endpoint-hour of backend time.
    pub per_hour: f64,
    /// The currency it is in, as the operator names it.
    pub currency: String,
}

/// How a pool's capacity signal is worked out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// The share of its time an endpoint should be busy, in (0, 1].
    pub target_utilisation: f64,
    /// The window arrivals and costs are averaged over.
    pub window: Duration,
    /// Calls one endpoint runs at once at full speed.
    pub calls_per_endpoint: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            target_utilisation: TARGET_UTILISATION,
            window: WINDOW,
            calls_per_endpoint: 1,
        }
    }
}

/// A route's pools' price and capacity settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageSpec {
    /// The real-time pool's (the fallback's calls are the real-time tier's).
    pub realtime: PoolUsage,
    /// The batch pool's (the offline tier's jobs ride on it too).
    pub micro_batch: PoolUsage,
}

/// The settings at `at` (a pool's table), from its `cost_per_hour`, `currency` and
/// `[capacity]`.
pub(super) fn pool(
    check: &mut Check<'_>,
    at: &str,
    (cost_per_hour, currency, capacity): (Option<f64>, Option<&String>, Option<&CapacityFile>),
) -> PoolUsage {
    let price = match cost_per_hour {
        None => {
            if currency.is_some() {
                check.fail(
                    format!("{at}.currency"),
                    "names the currency of cost_per_hour, which is not set",
                );
            }
            None
        }
        Some(per_hour) if !(per_hour.is_finite() && per_hour >= 0.0) => {
            check.fail(
                format!("{at}.cost_per_hour"),
                format!("must be a price of 0 or more, got {per_hour}"),
            );
            None
        }
        Some(per_hour) => {
            let currency = currency.cloned().unwrap_or_else(|| "USD".to_owned());
            if !currency_fits(&currency) {
                check.fail(
                    format!("{at}.currency"),
                    format!("must be a short name (letters and digits, at most 16), got {currency:?}"),
                );
            }
            Some(Price { per_hour, currency })
        }
    };
    PoolUsage {
        price,
        capacity: capacity.map_or_else(Capacity::default, |c| {
            self::capacity(check, &format!("{at}.capacity"), c)
        }),
    }
}

/// Whether `currency` is a short name: letters, digits and `$-_.`, at most 16.
pub(super) fn currency_fits(currency: &str) -> bool {
    !currency.is_empty()
        && currency.len() <= 16
        && currency
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"$-_.".contains(&b))
}

/// `[capacity]` at `at`.
fn capacity(check: &mut Check<'_>, at: &str, file: &CapacityFile) -> Capacity {
    let mut spec = Capacity::default();
    if let Some(target) = file.target_utilisation {
        if target > 0.0 && target <= 1.0 {
            spec.target_utilisation = target;
        } else {
            check.fail(
                format!("{at}.target_utilisation"),
                format!("must be more than 0 and at most 1, got {target}"),
            );
        }
    }
    if let Some(window) = file.window {
        if WINDOWS.contains(&window) {
            spec.window = window;
        } else {
            check.fail(format!("{at}.window"), format!("must be 5s to 10m, got {window:?}"));
        }
    }
    if let Some(calls) = file.calls_per_endpoint {
        match u32::try_from(calls).ok().filter(|c| (1..=1024).contains(c)) {
            Some(calls) => spec.calls_per_endpoint = calls,
            None => check.fail(
                format!("{at}.calls_per_endpoint"),
                format!("must be 1 to 1024, got {calls}"),
            ),
        }
    }
    spec
}

/// Fails the price and capacity keys of a pool that has no usage of its own (a
/// fallback, a shadow candidate).
pub(super) fn none_here(check: &mut Check<'_>, at: &str, keys: (bool, bool, bool)) {
    for (set, key) in [(keys.0, "cost_per_hour"), (keys.1, "currency"), (keys.2, "capacity")] {
        if set {
            check.fail(
                format!("{at}.{key}"),
                "is read on a route's [realtime] and [micro_batch] pools only (this pool's calls count as theirs)",
            );
        }
    }
}

/// What one tenant may use per UTC day and calendar month (each `None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Allowance {
    /// Backend seconds charged per UTC day.
    pub daily_backend: Option<Duration>,
    /// Backend seconds charged per calendar month.
    pub monthly_backend: Option<Duration>,
    /// Requests answered per UTC day.
    pub daily_requests: Option<u64>,
    /// Requests answered per calendar month.
    pub monthly_requests: Option<u64>,
}

/// Tenants' quotas at one scope (a route, or every route).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Quotas {
    /// Every tenant without an allowance of its own.
    pub default: Option<Allowance>,
    /// Named tenants' own allowances.
    pub tenants: std::collections::BTreeMap<String, Allowance>,
}

impl Quotas {
    /// `tenant`'s allowance here: its own, else the default.
    pub fn of(&self, tenant: &str) -> Option<&Allowance> {
        self.tenants.get(tenant).or(self.default.as_ref())
    }
}

/// The quotas a route's requests are held to: the route's own and those across every
/// route.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteQuotas {
    /// The route's own (`[routes.NAME.quotas]`).
    pub route: Option<Quotas>,
    /// Across every route (`[quotas]`).
    pub overall: Option<std::sync::Arc<Quotas>>,
}

/// The quotas table at `at`.
pub(super) fn quotas(check: &mut Check<'_>, at: &str, file: &super::file::QuotasFile) -> Quotas {
    Quotas {
        default: file
            .default
            .as_ref()
            .map(|a| allowance(check, &format!("{at}.default"), a)),
        tenants: file
            .tenants
            .iter()
            .map(|(name, a)| {
                if name.is_empty() || name.len() > 256 {
                    check.fail(
                        format!("{at}.tenants"),
                        format!("a tenant's name is 1 to 256 characters, got {name:?}"),
                    );
                }
                (name.clone(), allowance(check, &format!("{at}.tenants.{name}"), a))
            })
            .collect(),
    }
}

fn allowance(check: &mut Check<'_>, at: &str, file: &super::file::AllowanceFile) -> Allowance {
    let mut seconds = |key: &str, value: Option<f64>| {
        value.and_then(|s| match Duration::try_from_secs_f64(s) {
            Ok(d) if s > 0.0 => Some(d),
            _ => {
                check.fail(format!("{at}.{key}"), format!("must be more than 0 seconds, got {s}"));
                None
            }
        })
    };
    let daily_backend = seconds("daily_backend_seconds", file.daily_backend_seconds);
    let monthly_backend = seconds("monthly_backend_seconds", file.monthly_backend_seconds);
    let mut requests = |key: &str, value: Option<i64>| check.count(|| format!("{at}.{key}"), value);
    let allowance = Allowance {
        daily_backend,
        monthly_backend,
        daily_requests: requests("daily_requests", file.daily_requests),
        monthly_requests: requests("monthly_requests", file.monthly_requests),
    };
    if allowance == Allowance::default() {
        check.fail(
            at.to_owned(),
            "sets no quota: name daily_backend_seconds, monthly_backend_seconds, daily_requests or monthly_requests",
        );
    }
    allowance
}
