//! A route's token rules (`[routes.NAME.tokens]`): the tokens an LLM call may ask for
//! (ceilings on `max_tokens` and `n`, refused or clamped), the `max_tokens` sent when a
//! call names none, and the tokens and requests per minute, day and month the route as
//! a whole and each tenant may use. Checked by [`crate::usage::limits`] before a call
//! is sent, against what the call reserves.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::problems::Check;

/// `[routes.NAME.tokens]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    /// `max_tokens` sent (and reserved) when a call names none (default 1024, or
    /// `max_tokens` when that is lower).
    pub default_max_tokens: Option<i64>,
    /// The most `max_tokens` a call may ask for.
    pub max_tokens: Option<i64>,
    /// The most choices (`n`) a call may ask for.
    pub max_n: Option<i64>,
    /// A call past a ceiling is sent at the ceiling instead of refused (default false).
    #[serde(default)]
    pub clamp: bool,
    /// Prompt bytes counted as one token in a call's reservation (default 4; 1 makes
    /// the estimate an upper bound for any byte-level tokenizer).
    pub prompt_bytes_per_token: Option<i64>,
    /// The route's limits, every tenant's calls together.
    pub route: Option<TokenAllowanceFile>,
    /// Every tenant's limits on the route, unless it has its own.
    pub default: Option<TokenAllowanceFile>,
    /// Named tenants' own limits on the route.
    #[serde(default)]
    pub tenants: BTreeMap<String, TokenAllowanceFile>,
}

/// One scope's token limits as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenAllowanceFile {
    /// Tokens (prompt and completion) per minute.
    pub tokens_per_minute: Option<i64>,
    /// Requests per minute.
    pub requests_per_minute: Option<i64>,
    /// Tokens per UTC day.
    pub daily_tokens: Option<i64>,
    /// Tokens per calendar month (UTC).
    pub monthly_tokens: Option<i64>,
}

/// One scope's token limits (each `None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAllowance {
    /// Tokens (prompt and completion) per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Tokens per UTC day.
    pub daily_tokens: Option<u64>,
    /// Tokens per calendar month (UTC).
    pub monthly_tokens: Option<u64>,
}

/// A route's token rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRules {
    /// `max_tokens` sent when a call names none.
    pub default_max_tokens: u64,
    /// The most `max_tokens` a call may ask for.
    pub max_tokens: Option<u64>,
    /// The most choices a call may ask for.
    pub max_n: Option<u64>,
    /// Clamp a call past a ceiling instead of refusing it.
    pub clamp: bool,
    /// Prompt bytes counted as one token.
    pub prompt_bytes_per_token: u64,
    /// The route's limits, every tenant together.
    pub route: Option<TokenAllowance>,
    /// Every tenant's limits unless it has its own.
    pub default: Option<TokenAllowance>,
    /// Named tenants' limits.
    pub tenants: BTreeMap<String, TokenAllowance>,
}

impl TokenRules {
    /// `tenant`'s limits on the route: its own, else the default.
    pub fn of(&self, tenant: &str) -> Option<&TokenAllowance> {
        self.tenants.get(tenant).or(self.default.as_ref())
    }

    /// Whether any limit is set (else a call is only held to the ceilings).
    pub fn limits_anything(&self) -> bool {
        self.route.is_some() || self.default.is_some() || !self.tenants.is_empty()
    }
}

/// The `max_tokens` sent when a call names none, unless the route says.
pub const DEFAULT_MAX_TOKENS: u64 = 1024;

/// The rules `file` at `at` sets.
pub(super) fn rules(check: &mut Check<'_>, at: &str, file: &TokensFile) -> TokenRules {
    let max_tokens = check.count(|| format!("{at}.max_tokens"), file.max_tokens);
    let default_max_tokens = check
        .count(|| format!("{at}.default_max_tokens"), file.default_max_tokens)
        .unwrap_or_else(|| max_tokens.map_or(DEFAULT_MAX_TOKENS, |c| c.min(DEFAULT_MAX_TOKENS)));
    let max_n = check.count(|| format!("{at}.max_n"), file.max_n);
    let prompt_bytes_per_token = check
        .count(|| format!("{at}.prompt_bytes_per_token"), file.prompt_bytes_per_token)
        .unwrap_or(4);
    if let Some(ceiling) = max_tokens.filter(|c| *c < default_max_tokens) {
        check.fail(
            format!("{at}.default_max_tokens"),
            format!("{default_max_tokens} is above the route's ceiling max_tokens = {ceiling}: lower it"),
        );
    }
    let mut allowance = |at: String, file: &TokenAllowanceFile| {
        let allowance = TokenAllowance {
            tokens_per_minute: check.count(|| format!("{at}.tokens_per_minute"), file.tokens_per_minute),
            requests_per_minute: check.count(|| format!("{at}.requests_per_minute"), file.requests_per_minute),
            daily_tokens: check.count(|| format!("{at}.daily_tokens"), file.daily_tokens),
            monthly_tokens: check.count(|| format!("{at}.monthly_tokens"), file.monthly_tokens),
        };
        if allowance == TokenAllowance::default() {
            check.fail(
                at,
                "sets no limit: name tokens_per_minute, requests_per_minute, daily_tokens or monthly_tokens",
            );
        }
        allowance
    };
    let route = file.route.as_ref().map(|a| allowance(format!("{at}.route"), a));
    let default = file.default.as_ref().map(|a| allowance(format!("{at}.default"), a));
    let tenants = file
        .tenants
        .iter()
        .map(|(name, a)| (name.clone(), allowance(format!("{at}.tenants.{name}"), a)))
        .collect();
    for name in file.tenants.keys().filter(|n| n.is_empty() || n.len() > 256) {
        check.fail(
            format!("{at}.tenants"),
            format!("a tenant's name is 1 to 256 characters, got {name:?}"),
        );
    }
    TokenRules {
        default_max_tokens,
        max_tokens,
        max_n,
        clamp: file.clamp,
        prompt_bytes_per_token,
        route,
        default,
        tenants,
    }
}
