//! The simulator's LLMs: a continuous-batching engine per model ([`Engine`]), as vLLM,
//! TGI and llama.cpp run one, under a cost model ([`LlmProfile`]): a decode step costs
//! `a + b·(generations it computes a token of)` and gives every running generation past
//! its prompt one token; prompts cost `prefill` a token, computed in the steps after a
//! generation is let in, at most `max_batched_tokens` tokens a step with the decodes
//! (vLLM V1's chunked prefill), prompts in the order they were let in (or, past
//! `long_prefill_tokens`, a long one at a time beside the shorter ones), the first
//! token coming in the step its prompt is done; at most `max_sequences` run at once.
//! Admission is vLLM's: first come first served, a generation is let in while the KV
//! cache holds its prompt beside what the running ones hold now (their prompts and the
//! tokens they have generated), not what they may grow to. When a step's new tokens
//! would overflow the cache, the generation let in last is *preempted* (recompute, as
//! vLLM does): its cache is freed, it goes back to the head of the line, and when let
//! in again it pays prefill for its prompt and the tokens it had generated, which its
//! client does not see again ([`LlmStats::preemptions`]). A generation whose client
//! went away is dropped at the next step and counted ([`LlmStats::cancelled`]).
//! Generated text is a deterministic function of the prompt, one word a token, and
//! every count exact.
//!
//! `openai` serves OpenAI's chat, completions, Responses and models paths over it,
//! and Triton's generate and generate_stream; `decoupled` serves it as Triton's
//! decoupled model over gRPC.

pub(crate) mod decoupled;
pub(crate) mod openai;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What an LLM costs on its GPU (see [`LlmProfile::named`] for where each comes from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmProfile {
    /// A decode step's fixed cost.
    pub a: Duration,
    /// A step's cost per generation it computes a token of (a decode or a prefill chunk).
    pub b: Duration,
    /// Prefill per prompt token.
    pub prefill: Duration,
    /// Generations running at once, at most.
    pub max_sequences: usize,
    /// The KV cache, in tokens: what the running generations' prompts and generated
    /// tokens may fill together.
    pub kv_tokens: u64,
    /// Tokens one step computes at most (vLLM's `max_num_batched_tokens`): a decode
    /// each for the generations past their prompt, and the rest for prompts, in chunks
    /// (chunked prefill); `u64::MAX`: a prompt's whole prefill in the step it joins.
    pub max_batched_tokens: u64,
    /// A prompt longer than this is a long one: one long prompt at a time is prefilled,
    /// at most this many tokens a step, so shorter prompts let in after it are
    /// prefilled beside it rather than behind it (vLLM's `long_prefill_token_threshold`
    /// with `max_long_partial_prefills` 1); `u64::MAX`: every prompt in the order let in.
    pub long_prefill_tokens: u64,
}

impl LlmProfile {
    /// The names [`LlmProfile::named`] knows (given as `llm-NAME` to `tiergate sim`).
    pub const NAMES: &'static [&'static str] = &["llm-8b-a100", "llm-tiny", "llm-relay"];

    /// A profile by name:
    ///
    /// - `llm-8b-a100`: Llama-3-8B in FP16 under vLLM on one A100 80 GB, from published
    ///   figures: a decode step reads the 16 GB of weights at the A100's 2,039 GB/s
    ///   (about 8 ms) and the KV cache of each sequence it computes a token of besides
    ///   (0.05 ms each on average); prefill at about 12,000 tokens/s; vLLM's default
    ///   `max_num_seqs` (256);
    ///   the KV cache is what 90% of the memory (`gpu_memory_utilization`) leaves after
    ///   the weights, at 128 KiB a token (32 layers × 8 KV heads × 128 dims × 2 × 2 bytes):
    ///   440,000 tokens; chunked prefill of at most 2,048 tokens a step (vLLM V1's
    ///   scheduler with `max_num_batched_tokens` 2048).
    /// - `llm-tiny`: a small, fast model for tests: 2 ms + 0.05 ms a generation a step,
    ///   10 µs a prompt token, 4 sequences, 4,096 tokens of KV.
    /// - `llm-relay`: not a GPU: a token every 100 ms to every stream however many run
    ///   (no prefill, no limits), so a relay's benchmark measures the relay.
    pub fn named(name: &str) -> Option<LlmProfile> {
        let ms = |n: f64| Duration::from_secs_f64(n / 1e3);
        match name {
            "llm-8b-a100" => Some(LlmProfile {
                a: ms(8.0),
                b: ms(0.05),
                prefill: ms(0.083),
                max_sequences: 256,
                kv_tokens: 440_000,
                max_batched_tokens: 2048,
                long_prefill_tokens: u64::MAX,
            }),
            "llm-tiny" => Some(LlmProfile {
                a: ms(2.0),
                b: ms(0.05),
                prefill: ms(0.01),
                max_sequences: 4,
                kv_tokens: 4_096,
                max_batched_tokens: u64::MAX,
                long_prefill_tokens: u64::MAX,
            }),
            "llm-relay" => Some(LlmProfile {
                a: ms(100.0),
                b: Duration::ZERO,
                prefill: Duration::ZERO,
                max_sequences: 1_000_000,
                kv_tokens: u64::MAX / 4,
                max_batched_tokens: u64::MAX,
                long_prefill_tokens: u64::MAX,
            }),
            _ => None,
        }
    }

    /// The same profile with every cost multiplied by `factor`.
    pub fn scaled(self, factor: f64) -> LlmProfile {
        LlmProfile {
            a: self.a.mul_f64(factor),
            b: self.b.mul_f64(factor),
            prefill: self.prefill.mul_f64(factor),
            ..self
        }
    }
}

/// An LLM's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LlmStats {
    /// Generations asked for.
    pub generations: u64,
    /// Generations that ran to their last token.
    pub completed: u64,
    /// Generations dropped because their client went away.
    pub cancelled: u64,
    /// Tokens generated.
    pub tokens: u64,
    /// Prompt tokens of the generations let in.
    pub prompt_tokens: u64,
    /// Generations running now, and the most at once.
    pub running: u64,
    /// The most generations running at once.
    pub max_running: u64,
    /// Tokens in the KV cache now: the running generations' prompts and the tokens
    /// they have generated.
    pub reserved: u64,
    /// The most tokens in the KV cache at once.
    pub max_reserved: u64,
    /// Generations waiting for room now.
    pub waiting: u64,
    /// Running generations preempted to make room in the KV cache (each later
    /// recomputed: its prompt and what it had generated prefilled again).
    pub preemptions: u64,
}

/// A stream's misbehaviour, set from outside (`/sim/faults`): after this many tokens
/// each new generation stalls (sends nothing more), or sends one malformed event and
/// ends (0: never).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StreamFaults {
    /// Tokens after which a generation stalls.
    pub stall_after: u64,
    /// Tokens after which a generation sends a malformed event and ends.
    pub malformed_after: u64,
}

/// What a generation hears from its engine.
#[derive(Debug)]
pub(crate) enum Out {
    /// One more token.
    Token(&'static str),
    /// The generation is complete.
    Done,
    /// An injected fault: a malformed event, then the end.
    Malformed,
}

/// A generation asked of an engine.
struct Ask {
    prompt: u64,
    max_tokens: u64,
    seed: u64,
    tx: mpsc::UnboundedSender<Out>,
    faults: StreamFaults,
}

/// One model's engine: where generations are asked, and its counters.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    asks: mpsc::UnboundedSender<Ask>,
    stats: Arc<watch::Sender<LlmStats>>,
    profile: LlmProfile,
}

/// The words generated text is made of (a token each).
const WORDS: [&str; 16] = [
    "the ", "gateway ", "serves ", "every ", "token ", "as ", "it ", "comes ", "and ", "batch ", "work ", "waits ",
    "for ", "spare ", "room ", "here ",
];

impl Engine {
    /// An engine under `profile`, running on a thread of its own.
    pub(crate) fn start(profile: LlmProfile) -> Engine {
        let (asks, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(watch::Sender::new(LlmStats::default()));
        let counters = stats.clone();
        std::thread::Builder::new()
            .name("sim-llm".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build();
                if let Ok(runtime) = runtime {
                    runtime.block_on(run(profile, rx, counters));
                }
            })
            .expect("a thread for the simulated LLM");
        Engine { asks, stats, profile }
    }

    /// Asks for `max_tokens` tokens after a prompt of `prompt` tokens (text chosen by
    /// `seed`), with `faults`; the tokens come on the receiver, which the caller drops
    /// to cancel.
    pub(crate) fn generate(
        &self,
        (prompt, max_tokens, seed): (u64, u64, u64),
        faults: StreamFaults,
    ) -> mpsc::UnboundedReceiver<Out> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.stats.send_modify(|s| s.generations += 1);
        let _ = self.asks.send(Ask {
            prompt,
            max_tokens,
            seed,
            tx,
            faults,
        });
        rx
    }

    /// What it costs and holds.
    pub(crate) fn profile(&self) -> LlmProfile {
        self.profile
    }

    /// The counters now.
    pub(crate) fn stats(&self) -> LlmStats {
        self.stats.borrow().clone()
    }
}

/// A generation running, or waiting to run (again, when `sent` > 0: it was preempted).
struct Running {
    ask: Ask,
    sent: u64,
    /// Tokens of its prompt (and, recomputed, of what it had generated) still to be
    /// put in the cache: it decodes once there are none.
    prefill_left: u64,
}

impl Running {
    /// Tokens it holds in the KV cache while it runs.
    fn kv(&self) -> u64 {
        self.ask.prompt + self.sent
    }
}

/// The engine's loop: lets generations in while there is room, steps the running ones,
/// and preempts the last let in when a step would overflow the KV cache.
async fn run(profile: LlmProfile, mut asks: mpsc::UnboundedReceiver<Ask>, stats: Arc<watch::Sender<LlmStats>>) {
    let mut waiting: VecDeque<Running> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    loop {
        if running.is_empty() && waiting.is_empty() {
            match asks.recv().await {
                Some(ask) => waiting.push_back(Running {
                    ask,
                    sent: 0,
                    prefill_left: 0,
                }),
                None => return,
            }
        }
        while let Ok(ask) = asks.try_recv() {
            waiting.push_back(Running {
                ask,
                sent: 0,
                prefill_left: 0,
            });
        }
        // Let in, first come first served, while a sequence and the cache have room
        // for what each holds now (one alone is always let in).
        let mut held: u64 = running.iter().map(Running::kv).sum();
        while let Some(next) = waiting.front() {
            let need = next.kv();
            let grown = held + need + running.len() as u64 + 1; // after this step's tokens
            let fits = running.len() < profile.max_sequences && (grown <= profile.kv_tokens || running.is_empty());
            if !fits {
                break;
            }
            let mut next = waiting.pop_front().expect("front");
            next.prefill_left = need;
            if next.ask.tx.is_closed() {
                stats.send_modify(|s| s.cancelled += 1);
                continue;
            }
            held += need;
            if next.sent == 0 {
                stats.send_modify(|s| s.prompt_tokens += next.ask.prompt);
            }
            running.push(next);
        }
        // Each running generation grows by a token this step: the last let in give
        // their room back until the rest fit.
        while running.len() > 1 && held + running.len() as u64 > profile.kv_tokens {
            let last = running.pop().expect("more than one");
            held -= last.kv();
            stats.send_modify(|s| s.preemptions += 1);
            waiting.push_front(last);
        }
        // This step's tokens: a decode for each generation past its prompt, the rest of
        // the budget for prompts, in the order they were let in.
        let decoding = running.iter().filter(|r| r.prefill_left == 0).count() as u64;
        let mut budget = profile.max_batched_tokens.saturating_sub(decoding);
        let mut prefill = 0u64;
        let mut prefilling = 0u32;
        let mut long = false;
        for r in running.iter_mut().filter(|r| r.prefill_left > 0) {
            let cap = match r.kv() > profile.long_prefill_tokens {
                true if long => continue, // one long prompt a step
                true => {
                    long = true;
                    profile.long_prefill_tokens
                }
                false => u64::MAX,
            };
            // The first in line always advances, so one prompt larger than the budget
            // still gets through.
            let chunk = match prefill {
                0 => r.prefill_left.min(budget.max(1)),
                _ => r.prefill_left.min(budget),
            }
            .min(cap);
            r.prefill_left -= chunk;
            prefill += chunk;
            prefilling += u32::from(chunk > 0);
            budget = budget.saturating_sub(chunk);
        }
        stats.send_modify(|s| {
            s.running = running.len() as u64;
            s.max_running = s.max_running.max(s.running);
            s.reserved = held;
            s.max_reserved = s.max_reserved.max(held);
            s.waiting = waiting.len() as u64;
        });
        // A generation costs its share of the step only when the step computes a token
        // of it: one let in but waiting in line for its prefill costs nothing yet.
        let computed = u32::try_from(decoding).unwrap_or(u32::MAX).saturating_add(prefilling);
        let step = profile.a + profile.b * computed + profile.prefill * u32::try_from(prefill).unwrap_or(u32::MAX);
        let until = Instant::now() + step;
        tokio::time::sleep_until(until).await;
        // Those still prefilling say nothing yet; the rest (those whose prompt was
        // finished this step too) give their next token.
        running.retain_mut(|r| match r.prefill_left {
            0 => step_one(r, &stats),
            _ => !gone(r, &stats),
        });
    }
}

/// Whether `r`'s client went away (counted when it did).
fn gone(r: &Running, stats: &watch::Sender<LlmStats>) -> bool {
    let closed = r.ask.tx.is_closed();
    if closed {
        stats.send_modify(|s| s.cancelled += 1);
    }
    closed
}

/// Gives `r` its next token (or its fault, or its end); whether it still runs.
fn step_one(r: &mut Running, stats: &watch::Sender<LlmStats>) -> bool {
    if gone(r, stats) {
        return false;
    }
    let faults = r.ask.faults;
    if faults.stall_after > 0 && r.sent >= faults.stall_after {
        return true; // stalled: holds its sequence until its client leaves
    }
    if faults.malformed_after > 0 && r.sent >= faults.malformed_after {
        let _ = r.ask.tx.send(Out::Malformed);
        return false;
    }
    let word = WORDS[((r.ask.seed + r.sent) % WORDS.len() as u64) as usize];
    if r.ask.tx.send(Out::Token(word)).is_err() {
        stats.send_modify(|s| s.cancelled += 1);
        return false;
    }
    r.sent += 1;
    stats.send_modify(|s| s.tokens += 1);
    if r.sent >= r.ask.max_tokens {
        // Counted before it is said: whoever reads the end reads the count with it.
        stats.send_modify(|s| s.completed += 1);
        let _ = r.ask.tx.send(Out::Done);
        return false;
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    async fn collect(mut rx: mpsc::UnboundedReceiver<Out>) -> (Vec<&'static str>, bool) {
        let mut words = Vec::new();
        while let Some(out) = rx.recv().await {
            match out {
                Out::Token(w) => words.push(w),
                Out::Done => return (words, true),
                Out::Malformed => return (words, false),
            }
        }
        (words, false)
    }

    #[tokio::test]
    async fn generations_run_together_up_to_the_sequences_and_the_kv_budget() {
        let engine = Engine::start(LlmProfile {
            a: Duration::from_millis(1),
            b: Duration::ZERO,
            prefill: Duration::ZERO,
            max_sequences: 2,
            kv_tokens: 100,
            max_batched_tokens: u64::MAX,
            long_prefill_tokens: u64::MAX,
        });
        let asks: Vec<_> = (0..4)
            .map(|i| engine.generate((10, 20, i), StreamFaults::default()))
            .collect();
        for (i, rx) in asks.into_iter().enumerate() {
            let (words, done) = collect(rx).await;
            assert!(done && words.len() == 20, "generation {i}: {}", words.len());
            assert_eq!(words[0], WORDS[i % WORDS.len()], "the text follows the seed");
        }
        let stats = engine.stats();
        assert_eq!((stats.generations, stats.completed, stats.tokens), (4, 4, 80));
        assert_eq!(stats.max_running, 2, "two sequences at most");
        assert_eq!(stats.prompt_tokens, 40);
    }

    #[tokio::test]
    async fn generations_that_outgrow_the_cache_are_preempted_and_recomputed() {
        // Room for two prompts of 10 but not for both to grow by 20: vLLM's admission
        // lets both in, and the one let in last is preempted as they grow.
        let engine = Engine::start(LlmProfile {
            a: Duration::from_millis(1),
            b: Duration::ZERO,
            prefill: Duration::ZERO,
            max_sequences: 4,
            kv_tokens: 50,
            max_batched_tokens: u64::MAX,
            long_prefill_tokens: u64::MAX,
        });
        let asks: Vec<_> = (0..2)
            .map(|i| engine.generate((10, 20, i), StreamFaults::default()))
            .collect();
        for rx in asks {
            let (words, done) = collect(rx).await;
            assert!(done && words.len() == 20, "every token once: {}", words.len());
        }
        let stats = engine.stats();
        assert!(stats.preemptions >= 1, "{stats:?}");
        assert!(stats.max_reserved <= 50, "the cache never overflows: {stats:?}");
        assert_eq!((stats.completed, stats.tokens, stats.prompt_tokens), (2, 40, 20));
    }

    #[tokio::test]
    async fn a_long_prompt_is_prefilled_in_chunks_while_others_decode() {
        // Ten tokens a step, 1 ms each: a generation decoding when a 200-token prompt
        // arrives keeps a token every step (about 10 ms) rather than waiting 200 ms
        // for the whole prompt, which gets its first token after some twenty steps.
        let profile = LlmProfile {
            a: Duration::ZERO,
            b: Duration::ZERO,
            prefill: Duration::from_millis(1),
            max_sequences: 4,
            kv_tokens: 10_000,
            max_batched_tokens: 10,
            long_prefill_tokens: u64::MAX,
        };
        let engine = Engine::start(profile);
        let mut short = engine.generate((1, 40, 1), StreamFaults::default());
        assert!(
            matches!(short.recv().await, Some(Out::Token(_))),
            "the short one decodes"
        );
        let started = Instant::now();
        let mut long = engine.generate((200, 1, 0), StreamFaults::default());
        let mut gaps = Vec::new();
        let mut last = Instant::now();
        while let Some(Out::Token(_)) = short.recv().await {
            gaps.push(last.elapsed());
            last = Instant::now();
        }
        assert!(matches!(long.recv().await, Some(Out::Token(_))));
        let first_token = started.elapsed();
        assert!(first_token >= Duration::from_millis(150), "{first_token:?}");
        let widest = gaps.iter().max().copied().unwrap_or_default();
        assert!(
            widest < Duration::from_millis(60),
            "a gap of {widest:?} between two tokens"
        );
        assert_eq!(engine.stats().prompt_tokens, 201);
    }

    #[tokio::test]
    async fn generations_waiting_in_line_for_their_prefill_cost_a_step_nothing() {
        // 2 ms a generation computed, eleven tokens a step: twenty 1,000-token prompts
        // let in behind a decoding generation are prefilled one chunk a step, so each
        // step computes two generations (4 ms), not the 21 let in (42 ms).
        let engine = Engine::start(LlmProfile {
            a: Duration::ZERO,
            b: Duration::from_millis(2),
            prefill: Duration::ZERO,
            max_sequences: 32,
            kv_tokens: 100_000,
            max_batched_tokens: 11,
            long_prefill_tokens: u64::MAX,
        });
        let mut short = engine.generate((1, 21, 0), StreamFaults::default());
        assert!(matches!(short.recv().await, Some(Out::Token(_))));
        let _long: Vec<_> = (1..=20)
            .map(|i| engine.generate((1000, 1, i), StreamFaults::default()))
            .collect();
        let started = Instant::now();
        let (words, done) = collect(short).await;
        assert!(done && words.len() == 20);
        let took = started.elapsed();
        assert!(took < Duration::from_millis(400), "20 tokens in {took:?}, 80 ms due");
    }

    #[tokio::test]
    async fn a_short_prompt_is_prefilled_beside_a_long_one_when_long_prompts_are_limited() {
        let profile = |long_prefill_tokens| LlmProfile {
            a: Duration::ZERO,
            b: Duration::ZERO,
            prefill: Duration::from_millis(1),
            max_sequences: 4,
            kv_tokens: 10_000,
            max_batched_tokens: 100,
            long_prefill_tokens,
        };
        // A 200-token prompt let in first, a 5-token one after it: in the order let in,
        // the short one waits for the long one's prefill; with long prompts held to 20
        // tokens a step, it is prefilled beside it and has its first token first.
        for (limit, short_first) in [(20, true), (u64::MAX, false)] {
            let engine = Engine::start(profile(limit));
            let mut long = engine.generate((200, 1, 0), StreamFaults::default());
            let mut short = engine.generate((5, 1, 1), StreamFaults::default());
            let first = tokio::select! {
                biased;
                Some(Out::Token(_)) = short.recv() => "short",
                Some(Out::Token(_)) = long.recv() => "long",
            };
            assert_eq!(
                first == "short",
                short_first,
                "long prompts held to {limit} tokens a step"
            );
        }
    }

    #[tokio::test]
    async fn a_generation_whose_client_left_is_dropped_and_counted() {
        let engine = Engine::start(LlmProfile::named("llm-tiny").unwrap());
        let mut rx = engine.generate((5, 1000, 0), StreamFaults::default());
        assert!(matches!(rx.recv().await, Some(Out::Token(_))));
        drop(rx);
        let mut stats = engine.stats.subscribe();
        stats.wait_for(|s| s.cancelled == 1).await.expect("counted");
        assert!(engine.stats().tokens < 1000);
        let (words, done) = collect(engine.generate(
            (1, 3, 0),
            StreamFaults {
                malformed_after: 2,
                stall_after: 0,
            },
        ))
        .await;
        assert_eq!((words.len(), done), (2, false), "two tokens, then the malformed event");
    }
}
