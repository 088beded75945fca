//! Tenants' quotas: what each tenant used today (UTC) and this calendar month, on each
//! route and across every route, and whether a quota is spent.
//!
//! Fed by the ledger's ticker with what it drains every tick (backend seconds charged,
//! requests answered), and at start from the store, so a restart forgets nothing: a
//! quota is held to its use up to the last tick (2 s). The request path reads it only on a
//! route with quotas (`policy::Route::quotas`); a spent quota refuses the tenant's
//! real-time and micro-batch requests with 429 until the period rolls over, and holds
//! its offline jobs queued until then or until the quota is raised.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::policy::usage::{Allowance, RouteQuotas};

/// Tenants tracked at most; past it a new tenant's use is not tracked (and its quota
/// never spent): a bound on memory a flood of made-up tenant names cannot pass.
const MAX_TENANTS: usize = 100_000;

/// What one tenant used in the current periods at one scope.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Backend nanoseconds today.
    pub day_ns: u64,
    /// Requests answered today.
    pub day_requests: u64,
    /// Backend nanoseconds this month.
    pub month_ns: u64,
    /// Requests answered this month.
    pub month_requests: u64,
}

impl Use {
    /// Adds `other`, today's and this month's alike.
    fn plus(&mut self, other: &Use) {
        self.day_ns = self.day_ns.saturating_add(other.day_ns);
        self.day_requests = self.day_requests.saturating_add(other.day_requests);
        self.month_ns = self.month_ns.saturating_add(other.month_ns);
        self.month_requests = self.month_requests.saturating_add(other.month_requests);
    }

    fn add(&mut self, (ns, requests): (u64, u64), today: bool) {
        if today {
            self.day_ns = self.day_ns.saturating_add(ns);
            self.day_requests = self.day_requests.saturating_add(requests);
        }
        self.month_ns = self.month_ns.saturating_add(ns);
        self.month_requests = self.month_requests.saturating_add(requests);
    }
}

#[derive(Debug, Default)]
struct TenantUse {
    overall: Use,
    routes: HashMap<Arc<str>, Use>,
}

#[derive(Debug, Default)]
struct Periods {
    /// The start of today and of this month (UTC), unix seconds.
    day: i64,
    month: i64,
    by_tenant: HashMap<String, TenantUse>,
}

/// Every tenant's use in the current day and month.
#[derive(Debug, Default)]
pub struct Uses {
    periods: RwLock<Periods>,
    /// The other replicas' (on the Kafka queue), as they last published it: when it
    /// was read (unix seconds), and per tenant.
    others: RwLock<(i64, HashMap<String, TenantUse>)>,
}

/// A spent quota: which, where, how much, and when it resets.
#[derive(Debug, Clone, PartialEq)]
pub struct Spent {
    /// The key that set it (`daily_backend_seconds`, ...), as `quotas.KEY`.
    pub knob: &'static str,
    /// What it said, its use and its reset, in words.
    pub message: String,
    /// When the period rolls over, unix seconds.
    pub resets_at: i64,
}

impl Uses {
    /// Adds `(backend ns, requests answered)` at `at` (unix seconds) for `tenant` on
    /// `route`, rolling the periods over first when `at` is past them.
    pub fn add(&self, at: i64, route: &Arc<str>, tenant: &str, used: (u64, u64)) {
        if used == (0, 0) {
            return;
        }
        let mut p = self.periods.write().unwrap_or_else(|e| e.into_inner());
        p.roll(at);
        if at < p.month {
            return; // a figure of last month (a late write): no quota counts it
        }
        let today = at >= p.day;
        if !p.by_tenant.contains_key(tenant) {
            if p.by_tenant.len() >= MAX_TENANTS {
                return;
            }
            p.by_tenant.insert(tenant.to_owned(), TenantUse::default());
        }
        let Some(entry) = p.by_tenant.get_mut(tenant) else {
            return;
        };
        entry.overall.add(used, today);
        match entry.routes.get_mut(route) {
            Some(u) => u.add(used, today),
            None => entry.routes.entry(route.clone()).or_default().add(used, today),
        }
    }

    /// Sets the other replicas' use, read at `at` (unix seconds): (tenant, route, use).
    pub fn set_others(&self, at: i64, others: Vec<(String, String, Use)>) {
        let mut by_tenant: HashMap<String, TenantUse> = HashMap::new();
        for (tenant, route, used) in others.into_iter().take(MAX_TENANTS) {
            let entry = by_tenant.entry(tenant).or_default();
            entry.routes.entry(Arc::from(route)).or_default().plus(&used);
            entry.overall.plus(&used);
        }
        *self.others.write().unwrap_or_else(|e| e.into_inner()) = (at, by_tenant);
    }

    /// `tenant`'s use at `route` (`None`: across every route).
    pub fn of(&self, tenant: &str, route: Option<&str>) -> Use {
        let p = self.periods.read().unwrap_or_else(|e| e.into_inner());
        let Some(t) = p.by_tenant.get(tenant) else {
            return Use::default();
        };
        match route {
            None => t.overall,
            Some(route) => t.routes.get(route).copied().unwrap_or_default(),
        }
    }

    /// The first of `quotas` `tenant` has spent on `route` as of `now` (unix seconds).
    pub fn spent(&self, route: &str, tenant: &str, quotas: &RouteQuotas, now: i64) -> Option<Spent> {
        let (day, month) = (day_start(now), month_start(now));
        let (next_day, next_month) = (day + 86_400, next_month_start(now));
        let p = self.periods.read().unwrap_or_else(|e| e.into_inner());
        let others = self.others.read().unwrap_or_else(|e| e.into_inner());
        // Periods the ticker has not rolled yet count as fresh; so do the other
        // replicas' figures read in an earlier one.
        let (day_current, month_current) = (p.day == day, p.month == month);
        let (others_day, others_month) = (day_start(others.0) == day, month_start(others.0) == month);
        let (t, o) = (p.by_tenant.get(tenant), others.1.get(tenant));
        let scopes = [
            (
                quotas.route.as_ref(),
                (
                    t.and_then(|t| t.routes.get(route).copied()),
                    o.and_then(|o| o.routes.get(route).copied()),
                ),
                Some(route),
            ),
            (
                quotas.overall.as_deref(),
                (t.map(|t| t.overall), o.map(|o| o.overall)),
                None,
            ),
        ];
        for (q, (own, theirs), scope) in scopes {
            let Some(allowance) = q.and_then(|q| q.of(tenant)) else {
                continue;
            };
            let mut used = own.unwrap_or_default();
            if !day_current {
                (used.day_ns, used.day_requests) = (0, 0);
            }
            if !month_current {
                used = Use::default();
            }
            if let (Some(theirs), true) = (theirs, others_month) {
                let today = if others_day {
                    (theirs.day_ns, theirs.day_requests)
                } else {
                    (0, 0)
                };
                used.add((theirs.month_ns, theirs.month_requests), false);
                (used.day_ns, used.day_requests) = (
                    used.day_ns.saturating_add(today.0),
                    used.day_requests.saturating_add(today.1),
                );
            }
            if let Some(spent) = check(allowance, &used, (tenant, scope), (next_day, next_month)) {
                return Some(spent);
            }
        }
        None
    }
}

impl Periods {
    fn roll(&mut self, at: i64) {
        let (day, month) = (day_start(at), month_start(at));
        if month > self.month {
            self.by_tenant.clear();
            (self.day, self.month) = (day, month);
        } else if day > self.day {
            self.day = day;
            for t in self.by_tenant.values_mut() {
                (t.overall.day_ns, t.overall.day_requests) = (0, 0);
                for u in t.routes.values_mut() {
                    (u.day_ns, u.day_requests) = (0, 0);
                }
            }
        }
    }
}

/// The first limit of `allowance` that `used` reaches.
fn check(
    allowance: &Allowance,
    used: &Use,
    (tenant, route): (&str, Option<&str>),
    (next_day, next_month): (i64, i64),
) -> Option<Spent> {
    let secs = |ns: u64| ns as f64 / 1e9;
    let limits = [
        (
            allowance.daily_backend.map(|d| d.as_secs_f64()),
            secs(used.day_ns),
            "quotas.daily_backend_seconds",
            "backend seconds today",
            next_day,
        ),
        (
            allowance.monthly_backend.map(|d| d.as_secs_f64()),
            secs(used.month_ns),
            "quotas.monthly_backend_seconds",
            "backend seconds this month",
            next_month,
        ),
        (
            allowance.daily_requests.map(|n| n as f64),
            used.day_requests as f64,
            "quotas.daily_requests",
            "requests today",
            next_day,
        ),
        (
            allowance.monthly_requests.map(|n| n as f64),
            used.month_requests as f64,
            "quotas.monthly_requests",
            "requests this month",
            next_month,
        ),
    ];
    let (limit, used, knob, what, resets_at) = limits
        .into_iter()
        .find(|(limit, used, ..)| limit.is_some_and(|l| *used >= l))?;
    let limit = limit.unwrap_or_default();
    let whose = match tenant {
        "" => "the anonymous tenant".to_owned(),
        name => format!("tenant {name}"),
    };
    let scope = route.map_or_else(|| "across every route".to_owned(), |r| format!("on route {r}"));
    let reset = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(resets_at.max(0) as u64));
    let name = knob.trim_start_matches("quotas.");
    Some(Spent {
        knob,
        message: format!(
            "{name} {limit} reached for {whose} {scope} ({used:.3} {what}); it resets at {reset}: wait, or ask for \
             a bigger quota"
        ),
        resets_at,
    })
}

/// The start of the UTC day `t` (unix seconds) is in.
pub fn day_start(t: i64) -> i64 {
    t - t.rem_euclid(86_400)
}

/// The start of the calendar month (UTC) `t` is in.
pub fn month_start(t: i64) -> i64 {
    let days = t.div_euclid(86_400);
    let (_, _, d) = civil(days);
    (days - (d - 1)) * 86_400
}

/// The start of the calendar month after the one `t` is in.
pub fn next_month_start(t: i64) -> i64 {
    let (y, m, _) = civil(t.div_euclid(86_400));
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    days_from_civil(y, m, 1) * 86_400
}

/// Year, month (1–12) and day (1–31) of the day `days` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days from 1970-01-01 to `y-m-d` (`days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::usage::Quotas;

    // 2026-12-04T10:00:00Z
    const NOW: i64 = 1_796_378_400;

    #[test]
    fn periods_are_utc_days_and_calendar_months() {
        assert_eq!(day_start(NOW), 1_796_342_400); // 2026-12-04T00:00:00Z
        assert_eq!(month_start(NOW), 1_796_083_200); // 2026-12-01
        assert_eq!(next_month_start(NOW), 1_798_761_600); // 2027-01-01
        assert_eq!(next_month_start(1_771_000_000), 1_772_323_200); // 2026-02-13 → 2026-03-01
        assert_eq!(month_start(1_772_323_199), 1_769_904_000); // 2026-02-28T23:59:59Z → 2026-02-01
    }

    fn quotas(daily_requests: u64) -> RouteQuotas {
        let mut tenants = std::collections::BTreeMap::new();
        tenants.insert(
            "a".to_owned(),
            Allowance {
                daily_requests: Some(daily_requests),
                ..Allowance::default()
            },
        );
        RouteQuotas {
            route: Some(Quotas { default: None, tenants }),
            overall: None,
        }
    }

    #[test]
    fn a_quota_is_spent_at_its_limit_and_fresh_the_next_day() {
        let uses = Uses::default();
        let route: Arc<str> = Arc::from("r");
        uses.add(NOW, &route, "a", (5, 2));
        assert_eq!(uses.spent("r", "a", &quotas(3), NOW), None);
        uses.add(NOW, &route, "a", (5, 1));
        let spent = uses.spent("r", "a", &quotas(3), NOW).expect("spent");
        assert_eq!(spent.knob, "quotas.daily_requests");
        assert_eq!(spent.resets_at, day_start(NOW) + 86_400);
        assert!(
            spent
                .message
                .contains("daily_requests 3 reached for tenant a on route r"),
            "{}",
            spent.message
        );
        assert!(spent.message.contains("2026-12-05T00:00:00Z"), "{}", spent.message);
        // Another tenant, another route: untouched.
        assert_eq!(uses.spent("r", "b", &quotas(3), NOW), None);
        assert_eq!(uses.spent("s", "a", &quotas(3), NOW), None);
        // The next day, before the ticker rolled the periods: fresh.
        assert_eq!(uses.spent("r", "a", &quotas(3), NOW + 86_400), None);
        uses.add(NOW + 86_400, &route, "a", (1, 1));
        assert_eq!(uses.of("a", Some("r")).day_requests, 1);
        assert_eq!(uses.of("a", None).month_requests, 4);
    }

    #[test]
    fn the_other_replicas_use_counts_while_it_is_this_period_s() {
        let uses = Uses::default();
        let route: Arc<str> = Arc::from("r");
        uses.add(NOW, &route, "a", (0, 1));
        let theirs = Use {
            day_requests: 2,
            month_requests: 2,
            ..Use::default()
        };
        uses.set_others(NOW, vec![("a".into(), "r".into(), theirs)]);
        assert_eq!(
            uses.spent("r", "a", &quotas(3), NOW).map(|s| s.knob),
            Some("quotas.daily_requests")
        );
        // Read yesterday: not today's.
        uses.set_others(NOW - 86_400, vec![("a".into(), "r".into(), theirs)]);
        assert_eq!(uses.spent("r", "a", &quotas(3), NOW), None);
    }
}
