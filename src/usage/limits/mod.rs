//! Token limits that hold: an LLM call **reserves** what it may use before it is sent
//! (its prompt's estimate, and `max_tokens` for each choice), against every limit of
//! its route's `[tokens]` that applies (the route's, and its tenant's: tokens and
//! requests per minute, tokens per UTC day and calendar month), all of them checked
//! and taken at once or none. When its usage is known the reservation is **settled**:
//! what it did not use is given back (what it used past it is taken). So calls in
//! flight together can never spend past a limit, whatever their number; only a prompt
//! longer than its estimate can pass it, by that much (`prompt_bytes_per_token = 1`
//! makes the estimate an upper bound).
//!
//! A minute's limit is a bucket of that many tokens (or requests), refilled evenly over
//! the minute; a day's or a month's is a count of what was taken in that period. With
//! Redis named (`usage.redis`), every replica's calls check and take the same counts,
//! each check one atomic script ([`shared`]); without it, or while Redis cannot be
//! reached, each replica holds the limits on its own calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::policy::tokens::{TokenAllowance, TokenRules};

mod fit;
pub mod shared;

pub use fit::{fit, Fitted, Unfit};

/// Counts kept at most per replica; past it a new one is not kept (its limit not
/// held), a bound on memory a flood of made-up tenant names cannot pass.
const MAX_COUNTS: usize = 100_000;
/// A minute, in milliseconds: the window a per-minute limit refills over.
const MINUTE_MS: i64 = 60_000;

/// What a count measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Tokens.
    Tokens,
    /// Requests.
    Requests,
}

/// The window a count is kept over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// A bucket refilled evenly over a minute.
    Minute,
    /// The period from `.0` to `.1` (unix milliseconds): a UTC day or a month.
    Period(i64, i64),
}

/// One limit a call is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Its count's key (the route, the scope, what, and the period).
    pub key: String,
    /// Where the policy sets it, as `tokens.default.tokens_per_minute`.
    pub knob: String,
    /// How much.
    pub limit: u64,
    /// Over what.
    pub window: Window,
    /// Of what.
    pub unit: Unit,
}

/// What one limit had left after a call was taken, or when it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Left {
    /// The limit.
    pub limit: u64,
    /// What is left of it.
    pub remaining: u64,
    /// Until it is whole again.
    pub reset: Duration,
}

/// What the caller is told of its per-minute limits: OpenAI's `x-ratelimit-*` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headroom {
    /// Tokens per minute.
    pub tokens: Option<Left>,
    /// Requests per minute.
    pub requests: Option<Left>,
}

/// Why a call was not let through.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// It asks for more than the limit holds when whole: it can never pass (400).
    TooLarge {
        /// What it would reserve, and the limit it passes.
        asked: u64,
        /// The limit.
        limit: Limit,
    },
    /// A limit has too little left now (429).
    Spent {
        /// The limit.
        limit: Limit,
        /// What the call needed of it, and what it had.
        asked: u64,
        /// What was left.
        left: u64,
        /// When enough will be back.
        retry_after: Duration,
        /// The per-minute limits, for the headers.
        headroom: Headroom,
    },
}

/// The limits that hold tokens and requests, for every route.
#[derive(Debug, Default)]
pub struct Limits {
    local: Mutex<HashMap<String, Count>>,
    shared: Option<shared::Shared>,
}

/// One count as a replica keeps it.
#[derive(Debug, Clone, Copy)]
struct Count {
    /// A bucket's level, or a period's use.
    level: f64,
    /// When the bucket's level was last worked out (unix ms); a period's end.
    at: i64,
}

/// A call's hold on its limits, from before it is sent until its usage is known.
/// Settled once ([`Reservation::settle`]); dropped unsettled, it gives back every
/// token it held (the call used none that could be counted: refused, failed, or never
/// sent).
#[derive(Debug, Clone)]
pub struct Reservation(Arc<Held>);

#[derive(Debug)]
struct Held {
    limits: Arc<Limits>,
    taken: Vec<Limit>,
    tokens: u64,
    settled: AtomicBool,
}

/// A call to reserve for: its route and tenant, the route's rules, and its tokens.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The route.
    pub route: &'a str,
    /// The tenant ("" for the anonymous one).
    pub tenant: &'a str,
    /// The route's rules.
    pub rules: &'a TokenRules,
    /// Tokens it reserves.
    pub tokens: u64,
}

impl Limits {
    /// Limits held by this replica alone.
    pub fn local() -> Limits {
        Limits::default()
    }

    /// Limits shared with every replica through `shared`'s Redis.
    pub fn shared(shared: shared::Shared) -> Limits {
        Limits {
            shared: Some(shared),
            ..Limits::default()
        }
    }

    /// Reserves `call`'s tokens and one request against every limit of its route and
    /// tenant, all or none; `Ok(None)` when no limit applies.
    pub async fn reserve(self: &Arc<Self>, call: Call<'_>) -> Result<(Option<Reservation>, Headroom), Refused> {
        let now = unix_ms(SystemTime::now());
        let limits = applying(&call, now);
        if limits.is_empty() {
            return Ok((None, Headroom::default()));
        }
        let amounts: Vec<u64> = limits.iter().map(|l| amount(l.unit, call.tokens)).collect();
        for (limit, asked) in limits.iter().zip(&amounts) {
            if *asked > limit.limit {
                return Err(Refused::TooLarge {
                    asked: *asked,
                    limit: limit.clone(),
                });
            }
        }
        let taken = match &self.shared {
            Some(shared) => match shared.take(&limits, &amounts).await {
                Some(taken) => taken,
                None => self.take_local(&limits, &amounts, now),
            },
            None => self.take_local(&limits, &amounts, now),
        };
        let headroom = headroom(&limits, &taken.lefts);
        if let Some(i) = taken.refused {
            return Err(Refused::Spent {
                limit: limits[i].clone(),
                asked: amounts[i],
                left: taken.lefts[i].remaining,
                retry_after: taken.retry_after,
                headroom,
            });
        }
        Ok((
            Some(Reservation(Arc::new(Held {
                limits: self.clone(),
                taken: limits,
                tokens: call.tokens,
                settled: AtomicBool::new(false),
            }))),
            headroom,
        ))
    }

    /// Checks and takes `amounts` of `limits` in this replica's counts, at `now`.
    fn take_local(&self, limits: &[Limit], amounts: &[u64], now: i64) -> Taken {
        let mut counts = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= MAX_COUNTS {
            counts.retain(|_, c| c.at > now - MINUTE_MS);
        }
        let mut lefts = Vec::with_capacity(limits.len());
        let mut refused = None;
        let mut retry_after = Duration::ZERO;
        let mut levels = Vec::with_capacity(limits.len());
        for (i, (limit, asked)) in limits.iter().zip(amounts).enumerate() {
            let count = counts.get(&limit.key).copied();
            let (level, fits, wait) = check(limit, count, *asked as f64, now);
            levels.push(level);
            lefts.push(left(limit, level, now));
            if !fits && refused.is_none() {
                refused = Some(i);
                retry_after = wait;
            }
        }
        if refused.is_none() {
            lefts.clear();
            for ((limit, asked), level) in limits.iter().zip(amounts).zip(levels) {
                let taken = take(limit, level, *asked as f64, now);
                if counts.len() < MAX_COUNTS || counts.contains_key(&limit.key) {
                    counts.insert(limit.key.clone(), taken);
                }
                lefts.push(left(limit, taken.level, now));
            }
        }
        Taken {
            refused,
            lefts,
            retry_after,
        }
    }

    /// Gives `tokens` back to the token limits of `taken` (takes them, when negative).
    async fn give_back(&self, taken: &[Limit], tokens: i64) {
        if tokens == 0 {
            return;
        }
        if let Some(shared) = &self.shared {
            if shared.give_back(taken, tokens).await {
                return;
            }
        }
        self.give_back_local(taken, tokens, unix_ms(SystemTime::now()));
    }

    fn give_back_local(&self, taken: &[Limit], tokens: i64, now: i64) {
        let mut counts = self.local.lock().unwrap_or_else(|e| e.into_inner());
        for limit in taken.iter().filter(|l| l.unit == Unit::Tokens) {
            if let Some(count) = counts.get_mut(&limit.key) {
                *count = given_back(limit, *count, tokens as f64, now);
            }
        }
    }
}

/// What a check and take found: the limit that refused (its index), what each had
/// left, and when the one that refused has enough again.
#[derive(Debug, Clone, Default)]
pub(crate) struct Taken {
    pub(crate) refused: Option<usize>,
    pub(crate) lefts: Vec<Left>,
    pub(crate) retry_after: Duration,
}

impl Reservation {
    /// Tokens it holds.
    pub fn tokens(&self) -> u64 {
        self.0.tokens
    }

    /// The call used `used` tokens: what it reserved and did not use is given back,
    /// what it used past that taken. Once; later calls (and the drop) do nothing.
    pub fn settle(&self, used: u64) {
        if self.0.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        let back = i64::try_from(self.0.tokens).unwrap_or(i64::MAX) - i64::try_from(used).unwrap_or(i64::MAX);
        spawn_give_back(self.0.limits.clone(), self.0.taken.clone(), back);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.settled.swap(true, Ordering::AcqRel) {
            let tokens = i64::try_from(self.tokens).unwrap_or(i64::MAX);
            spawn_give_back(self.limits.clone(), std::mem::take(&mut self.taken), tokens);
        }
    }
}

/// Gives tokens back on the runtime (a shared count is a Redis call), or at once on
/// this replica's counts when there is no runtime.
fn spawn_give_back(limits: Arc<Limits>, taken: Vec<Limit>, tokens: i64) {
    if tokens == 0 {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if limits.shared.is_some() => {
            runtime.spawn(async move { limits.give_back(&taken, tokens).await });
        }
        _ => limits.give_back_local(&taken, tokens, unix_ms(SystemTime::now())),
    }
}

/// The limits `call` is held to at `now`: its tenant's, then the route's.
fn applying(call: &Call<'_>, now: i64) -> Vec<Limit> {
    let mut limits = Vec::new();
    let secs = now.div_euclid(1000);
    let day = super::quota::day_start(secs);
    let periods = [
        (day, day + 86_400),
        (super::quota::month_start(secs), super::quota::next_month_start(secs)),
    ];
    let tenant = escaped(call.tenant);
    let scopes: [(String, &str, Option<&TokenAllowance>); 2] = [
        (
            format!("t:{tenant}"),
            match call.rules.tenants.contains_key(call.tenant) {
                true => "tenants.NAME",
                false => "default",
            },
            call.rules.of(call.tenant),
        ),
        ("route".to_owned(), "route", call.rules.route.as_ref()),
    ];
    for (scope, table, allowance) in scopes {
        let Some(a) = allowance else { continue };
        let knob = |key: &str| match table {
            "tenants.NAME" => format!("tokens.tenants.{}.{key}", call.tenant),
            table => format!("tokens.{table}.{key}"),
        };
        let counts = [
            (
                a.tokens_per_minute,
                "tokens_per_minute",
                Unit::Tokens,
                Window::Minute,
                "tpm",
            ),
            (
                a.requests_per_minute,
                "requests_per_minute",
                Unit::Requests,
                Window::Minute,
                "rpm",
            ),
            (
                a.daily_tokens,
                "daily_tokens",
                Unit::Tokens,
                Window::Period(periods[0].0 * 1000, periods[0].1 * 1000),
                "day",
            ),
            (
                a.monthly_tokens,
                "monthly_tokens",
                Unit::Tokens,
                Window::Period(periods[1].0 * 1000, periods[1].1 * 1000),
                "month",
            ),
        ];
        for (limit, key, unit, window, short) in counts {
            let Some(limit) = limit else { continue };
            let period = match window {
                Window::Minute => String::new(),
                Window::Period(start, _) => format!(":{}", start / 1000),
            };
            limits.push(Limit {
                key: format!("{}:{scope}:{short}{period}", escaped(call.route)),
                knob: knob(key),
                limit,
                window,
                unit,
            });
        }
    }
    limits
}

/// What a call takes of a limit of `unit`: its tokens, or one request.
fn amount(unit: Unit, tokens: u64) -> u64 {
    match unit {
        Unit::Tokens => tokens,
        Unit::Requests => 1,
    }
}

/// `limit`'s level at `now` from its `count`, whether `asked` fits, and if not how
/// long until it does.
fn check(limit: &Limit, count: Option<Count>, asked: f64, now: i64) -> (f64, bool, Duration) {
    let cap = limit.limit as f64;
    match limit.window {
        Window::Minute => {
            let level = count.map_or(cap, |c| refilled(cap, c, now));
            let fits = asked <= level;
            let wait = ((asked - level).max(0.0) * MINUTE_MS as f64 / cap).ceil();
            (level, fits, Duration::from_millis(wait as u64))
        }
        Window::Period(_, end) => {
            let used = count.filter(|c| c.at == end).map_or(0.0, |c| c.level);
            let fits = used + asked <= cap;
            (used, fits, Duration::from_millis((end - now).max(0) as u64))
        }
    }
}

/// A bucket's level at `now`: what it had, refilled evenly over a minute, at most
/// whole.
fn refilled(cap: f64, count: Count, now: i64) -> f64 {
    let elapsed = (now - count.at).max(0) as f64;
    (count.level + elapsed * cap / MINUTE_MS as f64).min(cap)
}

/// The count after `asked` is taken from `level` at `now`.
fn take(limit: &Limit, level: f64, asked: f64, now: i64) -> Count {
    match limit.window {
        Window::Minute => Count {
            level: level - asked,
            at: now,
        },
        Window::Period(_, end) => Count {
            level: level + asked,
            at: end,
        },
    }
}

/// The count after `tokens` are given back (taken, when negative) at `now`.
fn given_back(limit: &Limit, count: Count, tokens: f64, now: i64) -> Count {
    let cap = limit.limit as f64;
    match limit.window {
        Window::Minute => Count {
            level: (refilled(cap, count, now) + tokens).min(cap),
            at: now,
        },
        Window::Period(_, end) if count.at == end => Count {
            level: (count.level - tokens).max(0.0),
            at: end,
        },
        Window::Period(..) => count,
    }
}

/// What `limit` has left at `level` (a bucket's, or a period's use) at `now`.
fn left(limit: &Limit, level: f64, now: i64) -> Left {
    let cap = limit.limit as f64;
    match limit.window {
        Window::Minute => Left {
            limit: limit.limit,
            remaining: level.max(0.0).floor() as u64,
            reset: Duration::from_millis(((cap - level).max(0.0) * MINUTE_MS as f64 / cap).ceil() as u64),
        },
        Window::Period(_, end) => Left {
            limit: limit.limit,
            remaining: (cap - level).max(0.0).floor() as u64,
            reset: Duration::from_millis((end - now).max(0) as u64),
        },
    }
}

/// The first per-minute limit of tokens and of requests in `limits` (the tenant's
/// before the route's), with what they had left.
fn headroom(limits: &[Limit], lefts: &[Left]) -> Headroom {
    let mut headroom = Headroom::default();
    for (limit, left) in limits.iter().zip(lefts) {
        let slot = match (limit.window, limit.unit) {
            (Window::Minute, Unit::Tokens) => &mut headroom.tokens,
            (Window::Minute, Unit::Requests) => &mut headroom.requests,
            _ => continue,
        };
        slot.get_or_insert(*left);
    }
    headroom
}

/// `name` safe in a key: `%` and `:` escaped.
fn escaped(name: &str) -> String {
    name.replace('%', "%25").replace(':', "%3A")
}

/// Unix milliseconds of `t`.
fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
