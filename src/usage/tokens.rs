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
    /// The call's hold on its route's token limits, settled with what it counts.
    held: Option<super::limits::Reservation>,
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
            held: None,
        }
    }

    /// The same meter, settling `held` (the call's reservation of its route's token
    /// limits) with the tokens it counts.
    pub fn holding(mut self, held: Option<super::limits::Reservation>) -> Self {
        self.held = held;
        self
    }

    /// Its route's and tier's labels, for the series of the call beside its tokens.
    pub fn labels(&self) -> &[(&'static str, String); 2] {
        &self.labels
    }

    /// Counts `used` (and settles the call's reservation with it).
    pub fn count(&self, used: Usage) {
        if let Some(held) = &self.held {
            held.settle(used.prompt.saturating_add(used.completion));
        }
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
