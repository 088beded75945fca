//! What the usage ledger counts: where an answer came from ([`Source`]), the figures
//! kept for each route, source and tenant ([`Field`], [`Figures`]), why a row cost
//! nothing ([`Saved`]), and whose a request is ([`Whose`]).

use std::time::Duration;

use crate::decision::Tier;
use crate::tenant::Tenant;

/// Where a request's answer came from, as the ledger counts it: a tier, or the cache
/// (a kept answer, or a coalesced follower's, served with no tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The real-time tier (its fallback pool's calls too).
    Realtime,
    /// The micro-batch tier.
    MicroBatch,
    /// The offline tier: a job's acceptance, and its rows when they run.
    Offline,
    /// No tier: the route's cache answered.
    Cache,
}

impl Source {
    /// Every source, by [`Source::index`].
    pub const ALL: [Source; 4] = [Source::Realtime, Source::MicroBatch, Source::Offline, Source::Cache];

    /// The source of a tier's answers.
    pub fn of(tier: Tier) -> Source {
        match tier {
            Tier::Realtime => Source::Realtime,
            Tier::MicroBatch => Source::MicroBatch,
            Tier::Offline => Source::Offline,
        }
    }

    /// Its position in [`Source::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in the ledger, the metrics and the reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Realtime => "realtime",
            Source::MicroBatch => "micro_batch",
            Source::Offline => "offline",
            Source::Cache => "cache",
        }
    }

    /// The source called `name`.
    pub fn parse(name: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What the ledger counts, by position in [`Figures`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Field {
    /// Requests that reached the tier (or the cache).
    Requests,
    /// Of them, refused without a backend call (shed, queue full, deadline, budget).
    Refused,
    /// Rows answered (a real-time call counts as one: its body is not decoded).
    Rows,
    /// Backend calls, in millionths (a batch's call shared by its callers' rows).
    CallsMicro,
    /// Backend time charged, nanoseconds.
    UsedNs,
    /// What the rows sent would have cost served one by one, nanoseconds.
    AloneNs,
    /// Rows sent (or saved) whose pool had not learned its cost yet (a sent one's
    /// equivalent is its use until a report can price it).
    UnpricedRows,
    /// Rows answered from a kept answer ...
    CacheRows,
    /// ... and what they would have cost, nanoseconds.
    CacheNs,
    /// Rows answered from a precomputed answer ...
    PrecomputedRows,
    /// ... and what they would have cost, nanoseconds.
    PrecomputedNs,
    /// Rows answered by a call made for another (a coalesced follower, a row sent once
    /// for its batch-mates) ...
    DedupeRows,
    /// ... and what they would have cost, nanoseconds.
    DedupeNs,
    /// LLM tokens of the prompts the backends read (their `usage`).
    PromptTokens,
    /// LLM tokens the backends generated ...
    CompletionTokens,
    /// ... of them, counted from a stream's content events (its backend sent no
    /// `usage`): an estimate.
    EstimatedTokens,
    /// Backend time charged to the unpriced rows sent, nanoseconds: what a report takes
    /// back out of [`Field::AloneNs`] when it prices them at the pool's `t(1)` now.
    UnpricedNs,
}

impl Field {
    /// Every field, in order.
    pub const ALL: [Field; FIELDS] = [
        Field::Requests,
        Field::Refused,
        Field::Rows,
        Field::CallsMicro,
        Field::UsedNs,
        Field::AloneNs,
        Field::UnpricedRows,
        Field::CacheRows,
        Field::CacheNs,
        Field::PrecomputedRows,
        Field::PrecomputedNs,
        Field::DedupeRows,
        Field::DedupeNs,
        Field::PromptTokens,
        Field::CompletionTokens,
        Field::EstimatedTokens,
        Field::UnpricedNs,
    ];

    /// Its column in the store.
    pub fn column(self) -> &'static str {
        match self {
            Field::Requests => "requests",
            Field::Refused => "refused",
            Field::Rows => "rows",
            Field::CallsMicro => "calls_micro",
            Field::UsedNs => "used_ns",
            Field::AloneNs => "alone_ns",
            Field::UnpricedRows => "unpriced_rows",
            Field::CacheRows => "cache_rows",
            Field::CacheNs => "cache_ns",
            Field::PrecomputedRows => "precomputed_rows",
            Field::PrecomputedNs => "precomputed_ns",
            Field::DedupeRows => "dedupe_rows",
            Field::DedupeNs => "dedupe_ns",
            Field::PromptTokens => "prompt_tokens",
            Field::CompletionTokens => "completion_tokens",
            Field::EstimatedTokens => "estimated_tokens",
            Field::UnpricedNs => "unpriced_ns",
        }
    }
}

/// How many fields the ledger counts.
pub const FIELDS: usize = 17;

/// The ledger's figures for one route, source and tenant over some time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures(pub [u64; FIELDS]);

impl Figures {
    /// One field.
    pub fn get(&self, field: Field) -> u64 {
        self.0[field as usize]
    }

    /// `self` with `value` added to `field`.
    pub fn with(mut self, field: Field, value: u64) -> Self {
        self.0[field as usize] = self.0[field as usize].saturating_add(value);
        self
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Figures) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = mine.saturating_add(theirs);
        }
    }

    /// Whether every figure is zero.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|v| *v == 0)
    }

    /// A field that is a time, in seconds.
    pub fn seconds(&self, field: Field) -> f64 {
        self.get(field) as f64 / 1e9
    }
}

/// Why a row cost nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// A kept answer.
    Cache,
    /// A precomputed answer (kept by a batch or a Kafka source).
    Precomputed,
    /// A call made for another: a coalesced follower, a row sent once for its batch-mates.
    Dedupe,
}

impl Saved {
    /// Its rows' field and its nanoseconds' field.
    pub fn fields(self) -> (Field, Field) {
        match self {
            Saved::Cache => (Field::CacheRows, Field::CacheNs),
            Saved::Precomputed => (Field::PrecomputedRows, Field::PrecomputedNs),
            Saved::Dedupe => (Field::DedupeRows, Field::DedupeNs),
        }
    }

    /// `rows` rows saved so, each costing `each` (`None`: not learned, so unpriced).
    pub fn figures(self, rows: u64, each: Option<Duration>) -> Figures {
        let (rows_field, ns_field) = self.fields();
        let figures = Figures::default().with(rows_field, rows);
        match each {
            Some(each) => figures.with(ns_field, ns(each).saturating_mul(rows)),
            None => figures.with(Field::UnpricedRows, rows),
        }
    }
}

/// Nanoseconds of `d`, saturating.
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whose a request's usage is: its credential's tenant, else the tenant its route's
/// tenant header claims, else the anonymous one (the rule of [`Tenant::name_in`]),
/// kept while the request itself moves on.
#[derive(Debug, Clone)]
pub enum Whose {
    /// Named by a credential (or the anonymous tenant).
    Tenant(Tenant),
    /// Claimed by the route's tenant header.
    Claimed(http::HeaderValue),
}

impl Whose {
    /// Whose `request` on a route with tenant header `header` is.
    pub fn of<B>(request: &http::Request<B>, header: &http::HeaderName) -> Whose {
        let tenant = request.extensions().get::<Tenant>().cloned().unwrap_or_default();
        Whose::new(tenant, request.headers().get(header))
    }

    /// Whose the request of `tenant` (as admitted) is, its tenant header carrying
    /// `claim`: the one rule of [`Tenant::name_in`].
    pub fn new(tenant: Tenant, claim: Option<&http::HeaderValue>) -> Whose {
        match (tenant.is_authenticated(), claim) {
            (true, _) | (false, None) => Whose::Tenant(tenant),
            (false, Some(value)) => Whose::Claimed(value.clone()),
        }
    }

    /// The tenant's name ("" for the anonymous one; a claim that is not visible ASCII
    /// names no tenant).
    pub fn name(&self) -> &str {
        match self {
            Whose::Tenant(tenant) => tenant.as_str(),
            Whose::Claimed(value) => value.to_str().unwrap_or_default(),
        }
    }
}
