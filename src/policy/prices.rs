//! Token prices (`[usage.prices]` for every route, `[routes.NAME.prices]` for one): a
//! price per million prompt and completion tokens for each tier, in one currency, next
//! to the pools' `cost_per_hour`. The usage ledger's table prices each tier's tokens
//! with them, and what they would have cost at the real-time price.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::file::{PerMillionFile, PricesFile};
use super::problems::{Check, Problem};

/// A price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerMillion {
    /// Per million prompt tokens.
    pub prompt: f64,
    /// Per million completion tokens.
    pub completion: f64,
}

impl PerMillion {
    /// What `prompt` and `completion` tokens cost.
    pub fn of(&self, prompt: u64, completion: u64) -> f64 {
        (prompt as f64 * self.prompt + completion as f64 * self.completion) / 1e6
    }
}

/// Token prices for each tier, in one currency.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenPrices {
    /// The currency.
    pub currency: String,
    /// The real-time tier's.
    pub realtime: Option<PerMillion>,
    /// The micro-batch tier's.
    pub micro_batch: Option<PerMillion>,
    /// The offline tier's.
    pub offline: Option<PerMillion>,
}

/// The prices `file` at `at` sets.
pub(super) fn prices(check: &mut Check<'_>, at: &str, file: &PricesFile) -> TokenPrices {
    let currency = file.currency.clone().unwrap_or_else(|| "USD".to_owned());
    if !super::usage::currency_fits(&currency) {
        check.fail(
            format!("{at}.currency"),
            format!("must be a short name (letters and digits, at most 16), got {currency:?}"),
        );
    }
    let mut tier = |key: &str, price: Option<&PerMillionFile>| {
        let price = price?;
        for (what, value) in [("prompt", price.prompt), ("completion", price.completion)] {
            if !(value.is_finite() && value >= 0.0) {
                check.fail(
                    format!("{at}.{key}.{what}"),
                    format!("must be a price of 0 or more, got {value}"),
                );
            }
        }
        Some(PerMillion {
            prompt: price.prompt,
            completion: price.completion,
        })
    };
    let prices = TokenPrices {
        currency,
        realtime: tier("realtime", file.realtime.as_ref()),
        micro_batch: tier("micro_batch", file.micro_batch.as_ref()),
        offline: tier("offline", file.offline.as_ref()),
    };
    if prices.realtime.is_none() && prices.micro_batch.is_none() && prices.offline.is_none() {
        check.fail(at.to_owned(), "sets no price: name realtime, micro_batch or offline");
    }
    prices
}

/// The `[usage.prices]` table for every route, from the `files` that set one, and a
/// problem for every file past the first.
pub(super) fn overall<'a>(
    files: impl Iterator<Item = (&'a PathBuf, &'a PricesFile)>,
    problems: &mut Vec<Problem>,
) -> Option<Arc<TokenPrices>> {
    let mut found: Option<(&Path, TokenPrices)> = None;
    for (file, p) in files {
        match &found {
            None => {
                let mut check = Check { file, problems };
                found = Some((file, prices(&mut check, "usage.prices", p)));
            }
            Some((first, _)) => problems.push(Problem {
                file: file.clone(),
                path: "usage.prices".into(),
                message: format!("already set in {}; keep one [usage.prices] table", first.display()),
            }),
        }
    }
    found.map(|(_, p)| Arc::new(p))
}
