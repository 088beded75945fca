//! The usage ledger read back as the table a finance or platform review wants: per
//! route, tier and/or tenant, what the backends were used for, what the same answers
//! would have cost served one by one, what was saved and by what, each group's share,
//! and the money when the pools name a `cost_per_hour`. `GET /admin/usage` serves it
//! as JSON or CSV; `tiergate usage` prints it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::store::Row;
use super::{Field, Figures, Source};
use crate::policy::prices::TokenPrices;
use crate::policy::usage::Price;
use crate::policy::Policy;

/// What the table's rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum By {
    /// The route.
    Route,
    /// The tier (or `cache`).
    Tier,
    /// The tenant.
    Tenant,
}

impl By {
    /// The groupings named in `list` (`route,tier`), in table order; an error names a
    /// word that is none.
    pub fn parse_list(list: &str) -> Result<Vec<By>, String> {
        let mut by = Vec::new();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let one = match word {
                "route" => By::Route,
                "tier" => By::Tier,
                "tenant" => By::Tenant,
                other => return Err(format!("by: {other:?} is not route, tier or tenant")),
            };
            if !by.contains(&one) {
                by.push(one);
            }
        }
        if by.is_empty() {
            return Err("by: name route, tier or tenant (or several, comma-separated)".into());
        }
        by.sort();
        Ok(by)
    }
}

/// The name the anonymous tenant has in a report.
pub const ANONYMOUS: &str = "(anonymous)";

/// The table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The start of the time it covers, unix seconds (whole minutes or hours kept).
    pub since: i64,
    /// When it was read, unix seconds.
    pub until: i64,
    /// Its rows, biggest use first.
    pub rows: Vec<Line>,
    /// Every row added up.
    pub total: Line,
}

/// One group's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Line {
    /// Its route, when grouped by route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Its tier (or `cache`), when grouped by tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Its tenant, when grouped by tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Requests that reached a tier or the cache.
    pub requests: u64,
    /// Of them, refused without a backend call.
    pub refused: u64,
    /// Rows answered.
    pub rows: u64,
    /// Backend calls made for them (a batch's call shared by its rows).
    pub backend_calls: f64,
    /// Backend seconds used.
    pub used_seconds: f64,
    /// What the same answers would have cost served one by one, no cache: the rows
    /// sent at `t(1)` each, and the rows saved at what they would have cost.
    pub would_have_seconds: f64,
    /// Saved by batching: the rows sent at `t(1)` each, less the seconds used.
    pub saved_batching_seconds: f64,
    /// Saved by kept answers.
    pub saved_cache_seconds: f64,
    /// Saved by precomputed answers.
    pub saved_precomputed_seconds: f64,
    /// Saved by dedupe (coalesced followers, rows sent once for their batch-mates).
    pub saved_dedupe_seconds: f64,
    /// Everything saved: would-have less used.
    pub saved_seconds: f64,
    /// Rows whose pool has not learned its cost yet: counted at what they used, so
    /// nothing is claimed saved on them (rows sent before it had are priced at its
    /// `t(1)` once it has).
    pub unpriced_rows: u64,
    /// LLM prompt tokens the backends read.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// LLM tokens the backends generated.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Of them, counted from streams' content events (their backends sent no `usage`).
    #[serde(default)]
    pub estimated_tokens: u64,
    /// Its share of all the backend seconds used in the table.
    pub share: f64,
    /// Answered requests per backend call (the cache's and batching's gain in calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_call: Option<f64>,
    /// Money, when every pool it used names a price in one currency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// Its LLM tokens as money, when each tier that served them names a token price and
    /// the real-time tier does too (in one currency): what they cost at their tiers'
    /// prices (`used`), what the same tokens cost at the real-time price
    /// (`would_have`), and the difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_cost: Option<Cost>,
}

/// A line's seconds as money.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// The currency, as the pools name it.
    pub currency: String,
    /// What was used.
    pub used: f64,
    /// What the same answers would have cost.
    pub would_have: f64,
    /// The difference.
    pub saved: f64,
}

/// What a line is the group of: its route, tier and tenant, as far as grouped by them.
type Group = (Option<String>, Option<String>, Option<String>);

/// A line's tokens as money so far.
#[derive(Debug, Default, Clone)]
enum TokenMoney {
    /// No tokens met yet.
    #[default]
    None,
    /// Currency, at their tiers' prices, at the real-time price.
    Priced(String, f64, f64),
    /// Tokens met with no price (or another currency): no money said.
    Unpriced,
}

impl TokenMoney {
    /// Adds `figures`' tokens, served by `source` on a route priced `prices`.
    fn add(&mut self, figures: &Figures, source: Source, prices: Option<&TokenPrices>) {
        let (prompt, completion) = (figures.get(Field::PromptTokens), figures.get(Field::CompletionTokens));
        if prompt == 0 && completion == 0 {
            return;
        }
        let priced = prices.and_then(|p| {
            let tier = match source {
                Source::Realtime => p.realtime,
                Source::MicroBatch => p.micro_batch,
                Source::Offline => p.offline,
                Source::Cache => None,
            };
            Some((
                p.currency.as_str(),
                tier?.of(prompt, completion),
                p.realtime?.of(prompt, completion),
            ))
        });
        *self = match (std::mem::take(self), priced) {
            (TokenMoney::None, Some((c, used, would))) => TokenMoney::Priced(c.to_owned(), used, would),
            (TokenMoney::Priced(c, u, w), Some((currency, used, would))) if c == currency => {
                TokenMoney::Priced(c, u + used, w + would)
            }
            _ => TokenMoney::Unpriced,
        };
    }

    fn cost(&self) -> Option<Cost> {
        match self {
            TokenMoney::Priced(currency, used, would) => Some(Cost {
                currency: currency.clone(),
                used: *used,
                would_have: *would,
                saved: would - used,
            }),
            TokenMoney::None | TokenMoney::Unpriced => None,
        }
    }
}

/// A line's sums, before the seconds are worked out.
#[derive(Debug, Default, Clone)]
struct Sums {
    figures: Figures,
    /// Its tokens as money.
    tokens: TokenMoney,
    /// Used and would-have seconds times the price per second, in one currency; `None`
    /// once a row with no price, or another currency, is met.
    money: Option<(String, f64, f64)>,
    /// Whether any row has been added.
    any: bool,
}

impl Sums {
    fn add(&mut self, figures: &Figures, price: Option<&Price>) {
        let first = !self.any;
        self.any = true;
        self.figures.add(figures);
        let (used, would) = (used(figures), would_have(figures));
        self.money = match (first, self.money.take(), price) {
            (true, _, Some(p)) => Some((
                p.currency.clone(),
                used * p.per_hour / 3600.0,
                would * p.per_hour / 3600.0,
            )),
            (false, Some((c, u, w)), Some(p)) if c == p.currency => {
                Some((c, u + used * p.per_hour / 3600.0, w + would * p.per_hour / 3600.0))
            }
            _ => None,
        };
    }
}

fn used(f: &Figures) -> f64 {
    f.seconds(Field::UsedNs)
}

fn would_have(f: &Figures) -> f64 {
    f.seconds(Field::AloneNs) + f.seconds(Field::CacheNs) + f.seconds(Field::PrecomputedNs) + f.seconds(Field::DedupeNs)
}

/// The price of `source`'s pool on `route`, as `policy` has it now: the real-time
/// pool's for real-time calls, the batch pool's for micro-batch and offline rows, for
/// the cache's the real-time pool's if it names one, else the batch pool's.
fn price<'p>(policy: &'p Policy, route: &str, source: Source) -> Option<&'p Price> {
    let usage = &policy.route(route)?.usage;
    match source {
        Source::Realtime => usage.realtime.price.as_ref(),
        Source::MicroBatch | Source::Offline => usage.micro_batch.price.as_ref(),
        Source::Cache => usage.realtime.price.as_ref().or(usage.micro_batch.price.as_ref()),
    }
}

/// `figures` with its unpriced rows priced at `one`, their pool's `t(1)` now, if it can
/// tell it: the time their sent rows were charged taken back out of what they would
/// have cost alone, and `t(1)` each put in (the rows a pool sent, or saved, before it had
/// learned its cost are priced once it has).
fn priced(figures: &Figures, one: Option<std::time::Duration>) -> Figures {
    let rows = figures.get(Field::UnpricedRows);
    let Some(one) = one.filter(|_| rows > 0) else {
        return *figures;
    };
    let alone = figures
        .get(Field::AloneNs)
        .saturating_sub(figures.get(Field::UnpricedNs))
        .saturating_add(super::ns(one).saturating_mul(rows));
    let mut out = *figures;
    out.0[Field::AloneNs as usize] = alone;
    out.0[Field::UnpricedRows as usize] = 0;
    out.0[Field::UnpricedNs as usize] = 0;
    out
}

/// A batch pool's `t(1)` now by route: `None` where it cannot tell it yet.
pub type OneRow<'a> = dyn Fn(&str) -> Option<std::time::Duration> + Sync + 'a;

/// The table of `rows` grouped `by`, priced as `policy` prices its pools now; `one`
/// is a batch pool's `t(1)` now by route (`None` where it cannot tell it), which prices
/// the rows sent before the pool had learned it.
pub fn build(rows: &[Row], by: &[By], (policy, one): (&Policy, &OneRow<'_>), (since, until): (i64, i64)) -> Report {
    let mut groups: BTreeMap<Group, Sums> = BTreeMap::new();
    let mut total = Sums::default();
    for row in rows {
        let tenant = match row.tenant.as_str() {
            "" => ANONYMOUS.to_owned(),
            name => name.to_owned(),
        };
        let key = (
            by.contains(&By::Route).then(|| row.route.clone()),
            by.contains(&By::Tier).then(|| row.source.as_str().to_owned()),
            by.contains(&By::Tenant).then_some(tenant),
        );
        let price = price(policy, &row.route, row.source);
        let figures = match row.source {
            Source::MicroBatch | Source::Offline => priced(&row.figures, one(&row.route)),
            Source::Realtime | Source::Cache => row.figures,
        };
        let prices = policy.route(&row.route).and_then(|r| r.prices.as_deref());
        let group = groups.entry(key).or_default();
        group.add(&figures, price);
        group.tokens.add(&figures, row.source, prices);
        total.add(&figures, price);
        total.tokens.add(&figures, row.source, prices);
    }
    let all_used = used(&total.figures);
    let mut lines: Vec<Line> = groups
        .into_iter()
        .map(|((route, tier, tenant), sums)| Line {
            route,
            tier,
            tenant,
            ..line(&sums, all_used)
        })
        .collect();
    lines.sort_by(|a, b| b.used_seconds.total_cmp(&a.used_seconds));
    Report {
        since,
        until,
        rows: lines,
        total: line(&total, all_used),
    }
}

fn line(sums: &Sums, all_used: f64) -> Line {
    let f = &sums.figures;
    let (used_s, would) = (used(f), would_have(f));
    let calls = f.get(Field::CallsMicro) as f64 / 1e6;
    let answered = f.get(Field::Requests).saturating_sub(f.get(Field::Refused));
    Line {
        requests: f.get(Field::Requests),
        refused: f.get(Field::Refused),
        rows: f.get(Field::Rows),
        backend_calls: calls,
        used_seconds: used_s,
        would_have_seconds: would,
        saved_batching_seconds: f.seconds(Field::AloneNs) - used_s,
        saved_cache_seconds: f.seconds(Field::CacheNs),
        saved_precomputed_seconds: f.seconds(Field::PrecomputedNs),
        saved_dedupe_seconds: f.seconds(Field::DedupeNs),
        saved_seconds: would - used_s,
        unpriced_rows: f.get(Field::UnpricedRows),
        prompt_tokens: f.get(Field::PromptTokens),
        completion_tokens: f.get(Field::CompletionTokens),
        estimated_tokens: f.get(Field::EstimatedTokens),
        share: if all_used > 0.0 { used_s / all_used } else { 0.0 },
        requests_per_call: (calls > 0.0).then(|| answered as f64 / calls),
        cost: sums.money.as_ref().map(|(currency, used, would)| Cost {
            currency: currency.clone(),
            used: *used,
            would_have: *would,
            saved: would - used,
        }),
        token_cost: sums.tokens.cost(),
        ..Line::default()
    }
}

impl Report {
    /// The table as CSV: a header, then a line per row, then the total.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "route,tier,tenant,requests,refused,rows,backend_calls,used_seconds,would_have_seconds,\
             saved_batching_seconds,saved_cache_seconds,saved_precomputed_seconds,saved_dedupe_seconds,\
             saved_seconds,unpriced_rows,prompt_tokens,completion_tokens,estimated_tokens,share,requests_per_call,currency,cost_used,cost_would_have,cost_saved,\
             token_currency,token_cost,token_cost_at_realtime,token_cost_saved\n",
        );
        for (line, total) in self.rows.iter().map(|l| (l, false)).chain([(&self.total, true)]) {
            let name = |v: &Option<String>| match (v, total) {
                (_, true) => "(total)".to_owned(),
                (Some(v), false) => quoted(v),
                (None, false) => String::new(),
            };
            let _ = write!(
                out,
                "{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{:.6},",
                name(&line.route),
                name(&line.tier),
                name(&line.tenant),
                line.requests,
                line.refused,
                line.rows,
                line.backend_calls,
                line.used_seconds,
                line.would_have_seconds,
                line.saved_batching_seconds,
                line.saved_cache_seconds,
                line.saved_precomputed_seconds,
                line.saved_dedupe_seconds,
                line.saved_seconds,
                line.unpriced_rows,
                line.prompt_tokens,
                line.completion_tokens,
                line.estimated_tokens,
                line.share,
            );
            if let Some(r) = line.requests_per_call {
                let _ = write!(out, "{r:.3}");
            }
            for cost in [&line.cost, &line.token_cost] {
                match cost {
                    Some(c) => {
                        let _ = write!(
                            out,
                            ",{},{:.6},{:.6},{:.6}",
                            quoted(&c.currency),
                            c.used,
                            c.would_have,
                            c.saved
                        );
                    }
                    None => out.push_str(",,,,"),
                }
            }
            out.push('\n');
        }
        out
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn quoted(v: &str) -> String {
    match v.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", v.replace('"', "\"\"")),
        false => v.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(route: &str, source: Source, tenant: &str, figures: Figures) -> Row {
        Row {
            span: 60,
            period: 0,
            route: route.into(),
            source,
            tenant: tenant.into(),
            figures,
        }
    }

    fn secs(s: f64) -> u64 {
        (s * 1e9) as u64
    }

    #[test]
    fn rows_sent_before_the_pool_learned_its_cost_are_priced_once_it_has() {
        // Four rows sent in one batch of 1 s before the pool could tell t(1), and two
        // priced rows after it could (0.5 s each alone, 0.4 s used).
        let early = Figures::default()
            .with(Field::Rows, 4)
            .with(Field::UsedNs, secs(1.0))
            .with(Field::AloneNs, secs(1.0))
            .with(Field::UnpricedRows, 4)
            .with(Field::UnpricedNs, secs(1.0));
        let later = Figures::default()
            .with(Field::Rows, 2)
            .with(Field::UsedNs, secs(0.4))
            .with(Field::AloneNs, secs(1.0));
        let rows = [
            row("r", Source::Offline, "", early),
            row("r", Source::MicroBatch, "", later),
            row("rt", Source::Realtime, "", early),
        ];
        let by = By::parse_list("route").expect("by");
        let policy = Policy::default();
        let still = build(&rows, &by, (&policy, &|_| None), (0, 60));
        let r = still.rows.iter().find(|l| l.route.as_deref() == Some("r")).expect("r");
        assert_eq!(r.unpriced_rows, 4);
        assert!((r.saved_batching_seconds - 0.6).abs() < 1e-9, "{r:?}");
        let half = std::time::Duration::from_millis(500);
        let now = build(&rows, &by, (&policy, &|route| (route == "r").then_some(half)), (0, 60));
        let r = now.rows.iter().find(|l| l.route.as_deref() == Some("r")).expect("r");
        assert_eq!(r.unpriced_rows, 0);
        assert!((r.would_have_seconds - 3.0).abs() < 1e-9, "{r:?}");
        assert!((r.saved_batching_seconds - 1.6).abs() < 1e-9, "{r:?}");
        // A real-time row is never repriced: its pool sends one row a call.
        let rt = now.rows.iter().find(|l| l.route.as_deref() == Some("rt")).expect("rt");
        assert_eq!(rt.unpriced_rows, 4);
    }

    #[test]
    fn tokens_are_priced_at_their_tiers_and_saved_against_real_time() {
        let text = r#"
[usage.prices]
currency = "EUR"
realtime = { prompt = 2.0, completion = 10.0 }
offline = { prompt = 1.0, completion = 5.0 }
[routes.llm]
models = ["m"]
[routes.llm.realtime]
endpoints = ["http://127.0.0.1:9"]
[routes.other]
models = ["o"]
[routes.other.realtime]
endpoints = ["http://127.0.0.1:9"]
[routes.other.prices]
realtime = { prompt = 1.0, completion = 1.0 }
"#;
        let policy = Policy::from_texts(vec![("p.toml".into(), text.into())]).expect("valid");
        let tokens = |prompt: u64, completion: u64| {
            Figures::default()
                .with(Field::PromptTokens, prompt)
                .with(Field::CompletionTokens, completion)
        };
        let rows = [
            row("llm", Source::Realtime, "", tokens(1_000_000, 500_000)),
            row("llm", Source::Offline, "", tokens(2_000_000, 1_000_000)),
            row(
                "llm",
                Source::MicroBatch,
                "",
                Figures::default().with(Field::Requests, 1),
            ),
        ];
        let by = By::parse_list("tier").expect("by");
        let report = build(&rows, &by, (&policy, &|_| None), (0, 60));
        let tier = |name: &str| {
            report
                .rows
                .iter()
                .find(|l| l.tier.as_deref() == Some(name))
                .expect("tier")
        };
        let realtime = tier("realtime").token_cost.clone().expect("priced");
        assert_eq!(realtime.currency, "EUR");
        assert!(
            (realtime.used - 7.0).abs() < 1e-9 && realtime.saved.abs() < 1e-9,
            "{realtime:?}"
        );
        let offline = tier("offline").token_cost.clone().expect("priced");
        assert!((offline.used - 7.0).abs() < 1e-9, "{offline:?}");
        assert!((offline.would_have - 14.0).abs() < 1e-9 && (offline.saved - 7.0).abs() < 1e-9);
        // A tier with no tokens says no token cost; the total adds the tiers up.
        assert!(tier("micro_batch").token_cost.is_none());
        let total = report.total.token_cost.clone().expect("priced");
        assert!(
            (total.used - 14.0).abs() < 1e-9 && (total.saved - 7.0).abs() < 1e-9,
            "{total:?}"
        );
        assert!(report
            .csv()
            .lines()
            .any(|l| l.starts_with(",offline,") && l.contains(",EUR,7.000000,14.000000,7.000000")));
        // Another currency in the same line: no money said.
        let mixed = [rows[0].clone(), row("other", Source::Realtime, "", tokens(10, 10))];
        let report = build(&mixed, &[], (&policy, &|_| None), (0, 60));
        assert!(report.total.token_cost.is_none());
    }

    #[test]
    fn groups_adds_up_and_says_what_was_saved() {
        let batch = Figures::default()
            .with(Field::Requests, 10)
            .with(Field::Rows, 10)
            .with(Field::CallsMicro, 1_000_000)
            .with(Field::UsedNs, secs(1.0))
            .with(Field::AloneNs, secs(4.0))
            .with(Field::DedupeNs, secs(0.5));
        let hits = Figures::default()
            .with(Field::Requests, 5)
            .with(Field::Rows, 5)
            .with(Field::CacheNs, secs(2.0));
        let rows = [
            row("r", Source::MicroBatch, "a", batch),
            row("r", Source::MicroBatch, "", batch),
            row("r", Source::Cache, "a", hits),
        ];
        let policy = Policy::default();
        let report = build(
            &rows,
            &By::parse_list("tenant").expect("by"),
            (&policy, &|_| None),
            (0, 60),
        );
        assert_eq!(report.rows.len(), 2);
        let a = report
            .rows
            .iter()
            .find(|l| l.tenant.as_deref() == Some("a"))
            .expect("a");
        assert_eq!(a.requests, 15);
        assert!((a.used_seconds - 1.0).abs() < 1e-9);
        assert!((a.would_have_seconds - 6.5).abs() < 1e-9);
        assert!((a.saved_batching_seconds - 3.0).abs() < 1e-9);
        assert!((a.saved_cache_seconds - 2.0).abs() < 1e-9);
        assert!((a.saved_seconds - 5.5).abs() < 1e-9);
        assert!((a.share - 0.5).abs() < 1e-9);
        assert_eq!(a.requests_per_call, Some(15.0));
        assert!(a.cost.is_none(), "no pool names a price");
        assert!(report.rows.iter().any(|l| l.tenant.as_deref() == Some(ANONYMOUS)));
        assert_eq!(report.total.requests, 25);
        let csv = report.csv();
        assert_eq!(csv.lines().count(), 4, "{csv}");
        assert!(
            csv.lines()
                .last()
                .expect("total")
                .starts_with("(total),(total),(total),25,"),
            "{csv}"
        );
    }

    #[test]
    fn by_names_only_what_it_knows() {
        assert_eq!(By::parse_list("tier, route").expect("ok"), vec![By::Route, By::Tier]);
        assert!(By::parse_list("model").is_err());
        assert!(By::parse_list("").is_err());
    }
}
