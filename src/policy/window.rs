//! A batch pool's admission window for LLM calls (`[routes.NAME.micro_batch.window]`):
//! chat, completions and Responses calls cannot be merged into one backend call, so
//! their micro-batch tier releases them onto the pool while its sequences in flight and
//! the tokens they may hold in the engines' KV caches stay under its limits, and reads
//! the engines' own signals to narrow or widen it. Run by
//! `crate::tiers::micro_batch::window`.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::problems::Check;

/// `[routes.NAME.micro_batch.window]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowFile {
    /// Sequences (calls generating) in flight per endpoint: at most the engine's own
    /// (vLLM's `max_num_seqs`, llama-server's `--parallel`).
    pub max_sequences: Option<i64>,
    /// Tokens the calls in flight may hold in the pool's KV caches together (each call
    /// counted at its prompt's estimate and its `max_tokens`): the pool's KV budget.
    pub max_tokens_in_flight: Option<i64>,
    /// Whose metrics the window reads to adapt: `vllm` or `llama_server` (none: fixed).
    pub signals: Option<String>,
    /// How often the endpoints' metrics are read (default 1s).
    #[serde(default, with = "humantime_serde")]
    pub signal_interval: Option<Duration>,
    /// On a pool shared with the route's real-time pool: the interactive streams' mean
    /// time to first token above which the window holds batch work back (default: the
    /// route's `realtime_below`).
    #[serde(default, with = "humantime_serde")]
    pub interactive_ttft: Option<Duration>,
}

/// Whose metrics a window reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signals {
    /// vLLM's `/metrics`: `vllm:kv_cache_usage_perc`, `vllm:num_requests_waiting`,
    /// `vllm:num_preemptions_total`.
    Vllm,
    /// llama-server's `/metrics` (run with `--metrics`): `llamacpp:requests_deferred`.
    LlamaServer,
}

/// A batch pool's admission window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Sequences in flight per endpoint, at most.
    pub max_sequences: NonZeroU32,
    /// Tokens the calls in flight may hold together, at most (`None`: only sequences
    /// bound the window).
    pub max_tokens_in_flight: Option<u64>,
    /// Whose metrics it adapts from (`None`: it stays at its limits).
    pub signals: Option<Signals>,
    /// How often they are read.
    pub signal_interval: Duration,
    /// On a pool shared with the route's real-time pool: the interactive streams' mean
    /// time to first token above which batch work is held back.
    pub interactive_ttft: Duration,
}

/// The most sequences per endpoint a window may name.
const MAX_SEQUENCES: i64 = 65_536;

/// The window `file` at `at` sets, on a route whose `realtime_below` is given.
pub(super) fn window(check: &mut Check<'_>, at: &str, file: &WindowFile, realtime_below: Duration) -> Window {
    let max_sequences = match file.max_sequences {
        None => {
            check.fail(
                format!("{at}.max_sequences"),
                "must be set: the sequences each endpoint runs at once (vLLM's max_num_seqs, llama-server's --parallel)",
            );
            1
        }
        Some(n) if (1..=MAX_SEQUENCES).contains(&n) => n,
        Some(n) => {
            check.fail(
                format!("{at}.max_sequences"),
                format!("must be 1 to {MAX_SEQUENCES}, got {n}"),
            );
            1
        }
    };
    let max_tokens_in_flight = check.count(|| format!("{at}.max_tokens_in_flight"), file.max_tokens_in_flight);
    let signals = match file.signals.as_deref() {
        None => None,
        Some("vllm") => Some(Signals::Vllm),
        Some("llama_server") => Some(Signals::LlamaServer),
        Some(other) => {
            check.fail(
                format!("{at}.signals"),
                format!("must be \"vllm\" or \"llama_server\", got {other:?}"),
            );
            None
        }
    };
    let signal_interval = file.signal_interval.unwrap_or(Duration::from_secs(1));
    if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&signal_interval) {
        check.fail(format!("{at}.signal_interval"), "must be 100ms to 60s");
    }
    let interactive_ttft = file.interactive_ttft.unwrap_or(realtime_below);
    if interactive_ttft.is_zero() {
        check.fail(format!("{at}.interactive_ttft"), "must be more than 0ms");
    }
    Window {
        interactive_ttft,
        max_sequences: NonZeroU32::new(u32::try_from(max_sequences).unwrap_or(1)).unwrap_or(NonZeroU32::MIN),
        max_tokens_in_flight,
        signals,
        signal_interval,
    }
}
