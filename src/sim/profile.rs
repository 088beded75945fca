//! What a simulated model costs and how it misbehaves: [`Profile`] (the cost model
//! `t(B) = max(floor, a + b·B)`), [`Faults`] and [`ModelSpec`].

use std::time::Duration;

/// The cost of one batch of `B` rows on one instance: `max(floor, a + b·B)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Profile {
    /// Fixed cost per batch.
    pub a: Duration,
    /// Cost per row.
    pub b: Duration,
    /// Least time any batch takes.
    pub floor: Duration,
}

/// Injected misbehaviour; the default injects nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Probability that a batch fails with 500 `{"error":"injected fault"}` at once.
    pub error_rate: f64,
    /// Probability that a batch takes `stall` instead of its cost.
    pub stall_rate: f64,
    /// How long a stalled batch takes.
    pub stall: Duration,
}

/// One simulated model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The name clients use in `/v2/models/{name}`.
    pub name: String,
    /// Batch cost.
    pub profile: Profile,
    /// Instances (threads), each running one batch at a time; 0 counts as 1.
    pub instances: usize,
    /// Each batch's cost is scaled by a uniform factor in `1 ± jitter` (clamped to 0..=1).
    pub jitter: f64,
    /// Injected faults.
    pub faults: Faults,
    /// Added to `OUTPUT1` of every row whose sum is negative: a model that is wrong on
    /// some rows (a shadow candidate to compare); 0 for none.
    pub drift: f64,
    /// Added to `OUTPUT1` of every row whose sum is negative: a random amount in
    /// `[0, noise)`, drawn afresh for every answer (a model that does not give the same
    /// answer twice); 0 for none.
    pub noise: f64,
    /// A combined model's heads (a multi-head model, or a Triton ensemble of models
    /// taking the same inputs): head `h` at position `i` answers `h_OUTPUT0` (the first
    /// input) and `h_OUTPUT1` (each row's sum plus `i + 1`) instead of `OUTPUT0` and
    /// `OUTPUT1`, so a caller can tell whose head it got; empty for a plain model.
    pub heads: Vec<String>,
    /// An LLM's cost model, when the model is one: it serves OpenAI's API and Triton's
    /// generate extension (see `sim::llm`).
    pub llm: Option<super::LlmProfile>,
}

const fn us(micros: u64) -> Duration {
    Duration::from_micros(micros)
}

impl Profile {
    /// The names [`Profile::named`] knows.
    pub const NAMES: &'static [&'static str] = &["resnet50-trt", "resnet50-eager", "bert-base-trt", "instant"];

    /// A profile from published GPU measurements (see DESIGN.md), or `instant`
    /// (free, for tests).
    pub fn named(name: &str) -> Option<Profile> {
        let (a, b, floor) = match name {
            "resnet50-trt" => (us(710), us(56), us(0)),
            "resnet50-eager" => (us(7_500), us(85), us(0)),
            "bert-base-trt" => (us(200), us(124), us(670)),
            "instant" => (us(0), us(0), us(0)),
            _ => return None,
        };
        Some(Profile { a, b, floor })
    }

    /// The time a batch of `rows` rows takes, saturating at about 584 years.
    pub fn cost(&self, rows: u64) -> Duration {
        let variable = self.b.as_nanos().saturating_mul(u128::from(rows));
        let nanos = self.a.as_nanos().saturating_add(variable);
        let cost = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        cost.max(self.floor)
    }

    /// The same profile with every cost multiplied by `factor`.
    pub fn scaled(self, factor: f64) -> Profile {
        Profile {
            a: self.a.mul_f64(factor),
            b: self.b.mul_f64(factor),
            floor: self.floor.mul_f64(factor),
        }
    }
}

impl ModelSpec {
    /// One instance, no jitter, no faults.
    pub fn new(name: &str, profile: Profile) -> Self {
        ModelSpec {
            name: name.to_owned(),
            profile,
            instances: 1,
            jitter: 0.0,
            faults: Faults::default(),
            drift: 0.0,
            noise: 0.0,
            heads: Vec::new(),
            llm: None,
        }
    }

    /// An LLM under `profile` (one instance, no faults).
    pub fn llm(name: &str, profile: super::LlmProfile) -> Self {
        ModelSpec {
            llm: Some(profile),
            ..ModelSpec::new(name, Profile::default())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn named_profiles_cost_what_the_design_says() {
        let table = [
            ("resnet50-trt", 1, us(766)),
            ("resnet50-trt", 32, us(710 + 32 * 56)),
            ("resnet50-eager", 0, us(7_500)),
            ("resnet50-eager", 10, us(8_350)),
            ("bert-base-trt", 1, us(670)),
            ("bert-base-trt", 8, us(200 + 8 * 124)),
            ("instant", 1_000, us(0)),
        ];
        for (name, rows, want) in table {
            assert_eq!(Profile::named(name).unwrap().cost(rows), want, "{name} × {rows}");
        }
    }

    #[test]
    fn every_listed_name_resolves_and_others_do_not() {
        assert!(Profile::NAMES.iter().all(|n| Profile::named(n).is_some()));
        assert_eq!(Profile::named("resnet50"), None);
    }

    #[test]
    fn cost_saturates() {
        let p = Profile {
            a: Duration::MAX,
            b: Duration::MAX,
            floor: us(0),
        };
        assert_eq!(p.cost(u64::MAX), Duration::from_nanos(u64::MAX));
    }
}
