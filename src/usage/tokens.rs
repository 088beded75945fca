//! An LLM call's tokens, counted where they are known (a whole answer's `usage`, a
//! stream's last usage chunk or its content events): `tiergate_tokens_total` of its
//! route and tier, and the ledger's token fields of its route, tier and tenant.

use std::sync::Arc;

use super::{Field, Figures, RouteUsage, Source};
use crate::decision::Tier;
use crate::llm::openai::Usage;
use crate::metrics;

/// Where an LLM call's tokens are counted: `tiergate_tokens_total` of its route and
/// tier, and the usage ledger's counters of its route, tier and tenant.
pub struct TokenMeter {
    labels: [(&'static str, String); 2],
    usage: Arc<RouteUsage>,
    source: Source,
    tenant: String,
}

impl TokenMeter {
    /// The meter of `tenant`'s call on `route`'s `tier`, charging `usage` (the
    /// route's).
    pub fn new(route: &str, tier: Tier, usage: Arc<RouteUsage>, tenant: &str) -> Self {
        TokenMeter {
            labels: [("route", route.to_owned()), ("tier", tier.as_str().to_owned())],
            usage,
            source: Source::of(tier),
            tenant: tenant.to_owned(),
        }
    }

    /// Its route's and tier's labels, for the series of the call beside its tokens.
    pub fn labels(&self) -> &[(&'static str, String); 2] {
        &self.labels
    }

    /// Counts `used`.
    pub fn count(&self, used: Usage) {
        let completion = match used.estimated {
            true => "completion_estimated",
            false => "completion",
        };
        for (kind, n) in [("prompt", used.prompt), (completion, used.completion)] {
            if n > 0 {
                let labels = [
                    self.labels[0].clone(),
                    self.labels[1].clone(),
                    ("kind", kind.to_owned()),
                ];
                ::metrics::counter!(metrics::TOKENS, &labels).increment(n);
            }
        }
        let figures = Figures::default()
            .with(Field::PromptTokens, used.prompt)
            .with(Field::CompletionTokens, used.completion)
            .with(Field::EstimatedTokens, if used.estimated { used.completion } else { 0 });
        if !figures.is_zero() {
            self.usage.add(self.source, &self.tenant, &figures);
        }
    }
}
