//! The batch pool's admission window for LLM calls (`[routes.NAME.micro_batch.window]`,
//! [`crate::policy::window`]): chat, completions and Responses calls, which are never
//! merged, wait in the pool's order (band, tenant share, earliest deadline) and are
//! released one at a time while the pool's sequences in flight stay under
//! `max_sequences` per endpoint and the tokens they may hold (each call's prompt
//! estimate and `max_tokens`) under `max_tokens_in_flight` (see
//! [`crate::tiers::batcher::window::Gate`]). A call holds its place until its answer is
//! complete: a whole answer when it comes, a stream at its last event. Offline work
//! drains through the same window, onto sequences no caller is waiting for.
//!
//! Where the window names `signals`, it reads every endpoint's `/metrics` each
//! `signal_interval` and adapts: halved when an engine preempts, queues calls of its
//! own, or fills its KV cache (vLLM: `vllm:num_preemptions_total` rising,
//! `vllm:num_requests_waiting` above 0, `vllm:kv_cache_usage_perc` at 0.95 or more;
//! llama-server: `llamacpp:requests_deferred` above 0), widened by a sixteenth of its
//! limits while every engine has room, up to them (on a pool shared with interactive
//! streams, by a 256th: a sequence at a time for a window of 256). With the limits at
//! or below what the engines hold, an engine never has to preempt a sequence: the
//! gateway keeps the KV cache from overflowing rather than the engine recovering from
//! it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::super::batcher::window::{Gate, Held};
use super::super::batcher::{self, Class, Entry, Queue, Settings};
use super::Call;
use crate::backend::Pool;
use crate::error::Error;
use crate::metrics;
use crate::policy::window::Signals;
use crate::policy::BatchSpec;
use crate::protocol::Reply;
use crate::tiers::realtime::{Realtime, Sharing};

/// Largest `/metrics` answer read from an engine.
const METRICS_BYTES: usize = 1 << 20;

/// A window widens by this share of its ceilings a reading (`1/ENGINE_PARTS`)...
const ENGINE_PARTS: u64 = 16;
/// ...or, on a pool shared with interactive streams, by this one (one sequence of 256).
const SHARED_PARTS: u64 = 256;

/// KV cache use at which an engine counts as full.
const KV_FULL: f64 = 0.95;

/// A batch pool's window: its queue, the lane its calls go out on, and its gate.
#[derive(Debug)]
pub(super) struct Window {
    queue: Queue<Lane, Released, Reply>,
    lane: Arc<Lane>,
    gate: Arc<Gate>,
    /// What a call that names no `max_tokens` (on a route that sets no default) is
    /// held to per choice: the token budget's share of one sequence.
    fallback_max_tokens: u64,
}

/// What a window's calls need to be sent and charged.
#[derive(Debug)]
pub(super) struct Lane {
    pool: Arc<Pool>,
    usage: Arc<crate::usage::RouteUsage>,
    shares: Arc<crate::usage::Shares>,
}

/// A call waiting in a window, and the tokens it holds once released.
#[derive(Debug)]
pub(super) struct Released {
    call: Box<Call>,
    tokens: u64,
}

/// The window's sequences and tokens, in flight and allowed now (for the admin API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    /// Sequences in flight, and the limit now.
    pub sequences: (u64, u64),
    /// Tokens held in flight, and the limit now (`None`: no token limit).
    pub tokens: (u64, Option<u64>),
}

impl Window {
    /// The window of `route`'s batch pool `pool` under `spec` (which names one), its
    /// worker and its signal reader started; they stop at `shutdown` or when the window
    /// is dropped.
    pub(super) fn start(
        route: &str,
        spec: &BatchSpec,
        (pool, usage, shares): (Arc<Pool>, Arc<crate::usage::RouteUsage>, Arc<crate::usage::Shares>),
        (interactive, shutdown): (Option<&Realtime>, &CancellationToken),
    ) -> Option<Window> {
        let window = spec.window.as_ref()?;
        let endpoints = spec.pool.endpoints.len().max(1) as u64;
        let max_sequences = u64::from(window.max_sequences.get()).saturating_mul(endpoints);
        let gate = Gate::new(max_sequences, window.max_tokens_in_flight, window.signals.is_some());
        let settings = Settings {
            max_batch: 1,
            max_bytes: u64::MAX,
            slots: 1,
            capacity: u64::from(spec.queue_capacity.get()),
            shed_at: u64::from(spec.scheduling.shed_at),
        };
        let (queue, worker) = batcher::pair(settings);
        tokio::spawn(worker.run_window(gate.clone(), |r: &Released| r.tokens, send, shutdown.clone()));
        let holdback = interactive.map(|realtime| Holdback {
            realtime: realtime.clone(),
            route: route.to_owned(),
            endpoints: spec.pool.endpoints.clone(),
            target: window.interactive_ttft,
            last: (0, 0),
            quiet: 0,
        });
        tokio::spawn(adapt(
            (Arc::downgrade(&gate), Arc::downgrade(&pool)),
            (route.to_owned(), holdback),
            (window.signals, window.signal_interval),
            shutdown.clone(),
        ));
        let fallback_max_tokens = window
            .max_tokens_in_flight
            .map_or(crate::policy::tokens::DEFAULT_MAX_TOKENS, |t| {
                (t / max_sequences).max(1)
            });
        Some(Window {
            queue,
            lane: Arc::new(Lane { pool, usage, shares }),
            gate,
            fallback_max_tokens,
        })
    }

    /// The window's state now.
    pub(super) fn state(&self) -> WindowState {
        let (sequences, tokens) = self.gate.in_flight();
        let (max_sequences, max_tokens) = self.gate.limits();
        WindowState {
            sequences: (sequences, max_sequences),
            tokens: (tokens, (max_tokens != u64::MAX).then_some(max_tokens)),
        }
    }

    /// Queues `call` (of `class`; offline filler when `filler`) to be released through
    /// the window; where its answer will come.
    pub(super) fn submit(
        &self,
        call: Call,
        class: Class,
        filler: bool,
    ) -> Result<oneshot::Receiver<Result<Reply, Error>>, Error> {
        let tokens = self.tokens(&call);
        let deadline = call.deadline;
        let bytes = call.request.body().len() as u64;
        let released = Released {
            call: Box::new(call),
            tokens,
        };
        match filler {
            true => self.queue.submit_filler(&self.lane, released, (1, bytes), deadline),
            false => self
                .queue
                .submit_sized(&self.lane, released, (1, bytes, deadline), class),
        }
    }

    /// The tokens `call` holds: its prompt's estimate and its `max_tokens` (else its
    /// route's default, else the window's share of a sequence) for each choice.
    fn tokens(&self, call: &Call) -> u64 {
        let rules = call.route.tokens.as_deref();
        let Ok(asked) = crate::llm::tokens::Asked::of(call.request.body()) else {
            return self.fallback_max_tokens; // the backend will refuse it: one sequence's share
        };
        let each = asked
            .max_tokens
            .map(|(_, n)| n)
            .or(rules.map(|r| r.default_max_tokens))
            .unwrap_or(self.fallback_max_tokens);
        let per_token = rules.map_or(4, |r| r.prompt_bytes_per_token);
        asked.reserve(per_token, each, asked.n.unwrap_or(1))
    }
}

/// Sends a released call on its lane's pool, holding its place in the window until its
/// answer is complete (a stream's last event), and answers its caller.
async fn send(lane: Arc<Lane>, entry: Entry<Released, Reply>, held: Held) {
    let waited = entry.queued_at.elapsed();
    let source = match entry.filler {
        true => crate::usage::Source::Offline,
        false => crate::usage::Source::MicroBatch,
    };
    let call = *entry.payload.call;
    let forward = super::forward_charged((&lane.pool, &lane.shares, &lane.usage), call, source);
    let (answer, took) = Box::pin(forward).await;
    let answer = answer.map(|mut reply| {
        // A whole answer is complete: its hold ends here.
        let _ = crate::backend::stream::hold_until_done(&mut reply, held);
        super::waited_for_slot(reply, waited, took)
    });
    let _ = entry.reply.send(answer);
}

/// Adapts the window each `interval` (and exports its state) to its engines' signals
/// and, on a pool shared with the route's real-time pool, to the interactive streams'
/// time to first token, until `shutdown` or the window or its pool is gone.
async fn adapt(
    (gate, pool): (Weak<Gate>, Weak<Pool>),
    (route, mut holdback): (String, Option<Holdback>),
    (signals, interval): (Option<Signals>, Duration),
    shutdown: CancellationToken,
) {
    let gauge =
        |name: &'static str, kind: &'static str| ::metrics::gauge!(name, "route" => route.clone(), "kind" => kind);
    let in_flight = [
        gauge(metrics::WINDOW_IN_FLIGHT, "sequences"),
        gauge(metrics::WINDOW_IN_FLIGHT, "tokens"),
    ];
    let limits = [
        gauge(metrics::WINDOW_LIMIT, "sequences"),
        gauge(metrics::WINDOW_LIMIT, "tokens"),
    ];
    let [narrowed, held_back, widened] = ["narrowed", "held_back", "widened"].map(|direction| {
        let counter = ::metrics::counter!(metrics::WINDOW_ADAPTED, "route" => route.clone(), "direction" => direction);
        counter.absolute(0);
        counter
    });
    let mut preempted: Vec<Option<f64>> = Vec::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (Some(gate), Some(pool)) = (gate.upgrade(), pool.upgrade()) else {
            return;
        };
        let mut engines = None;
        if let Some(signals) = signals {
            let bodies = pool
                .get_each("/metrics", METRICS_BYTES, interval.min(Duration::from_secs(2)))
                .await;
            preempted.resize(bodies.len(), None);
            let read: Vec<Option<Pressure>> = bodies
                .iter()
                .zip(preempted.iter_mut())
                .map(|(body, before)| body.as_ref().map(|b| pressure(signals, b, before)))
                .collect();
            engines = verdict(&read);
        }
        let interactive = holdback.as_mut().and_then(Holdback::read);
        match (engines, interactive) {
            (_, Some(Pressure::Full)) => {
                gate.narrow(0);
                held_back.increment(1);
            }
            (Some(Pressure::Full), _) => {
                gate.narrow(1);
                narrowed.increment(1);
            }
            (None, None) => {}
            (engines, interactive) => {
                let room = [engines, interactive].iter().flatten().all(|p| *p == Pressure::Room);
                if room {
                    if gate.limits() != gate.ceilings() {
                        widened.increment(1);
                    }
                    // Beside interactive streams (or before the real-time pool's first
                    // call says whether it is beside them), a sequence at a time: each
                    // one let in prefills its prompt in the steps the streams' first
                    // tokens wait for.
                    gate.widen(match holdback.as_ref().is_some_and(Holdback::may_share) {
                        true => SHARED_PARTS,
                        false => ENGINE_PARTS,
                    });
                }
            }
        }
        let (sequences, tokens) = gate.in_flight();
        let (max_sequences, max_tokens) = gate.limits();
        in_flight[0].set(sequences as f64);
        in_flight[1].set(tokens as f64);
        limits[0].set(max_sequences as f64);
        limits[1].set(if max_tokens == u64::MAX {
            f64::INFINITY
        } else {
            max_tokens as f64
        });
    }
}

/// A window on a pool its route's real-time tier may share: what it reads of the
/// interactive streams there.
struct Holdback {
    realtime: Realtime,
    route: String,
    /// The batch pool's endpoints: the real-time pool shares the pool when it has the same.
    endpoints: Vec<http::Uri>,
    /// The interactive streams' mean time to first token held to.
    target: Duration,
    /// First tokens counted, and their summed microseconds, at the last reading.
    last: (u64, u64),
    /// Readings in a row that saw no interactive first token.
    quiet: u32,
}

/// Readings in a row without an interactive stream after which the pool counts as
/// having room: one quiet reading between two streams says nothing.
const QUIET_READINGS: u32 = 10;

impl Holdback {
    /// Whether the real-time pool is on the same endpoints, or may be: before its first
    /// call, nothing says it is not.
    fn may_share(&self) -> bool {
        self.realtime.first_tokens_on(&self.route, &self.endpoints) != Sharing::Separate
    }

    /// The interactive streams' pressure since the last reading: full when their mean
    /// time to first token was above the target, room when below four fifths of it (or
    /// none came for [`QUIET_READINGS`] readings), else steady; `None` while the
    /// real-time pool is not on the same endpoints.
    fn read(&mut self) -> Option<Pressure> {
        let Sharing::Shared(now) = self.realtime.first_tokens_on(&self.route, &self.endpoints) else {
            return None;
        };
        let (count, micros) = (now.0.saturating_sub(self.last.0), now.1.saturating_sub(self.last.1));
        self.last = now;
        if count == 0 {
            self.quiet = self.quiet.saturating_add(1);
            return Some(match self.quiet >= QUIET_READINGS {
                true => Pressure::Room,
                false => Pressure::Steady,
            });
        }
        self.quiet = 0;
        let mean = Duration::from_micros(micros / count);
        Some(if mean > self.target {
            Pressure::Full
        } else if mean * 5 < self.target * 4 {
            Pressure::Room
        } else {
            Pressure::Steady
        })
    }
}

/// What one engine's metrics say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pressure {
    /// It preempted, queued calls of its own, or its KV cache is full.
    Full,
    /// Its cache is filling but nothing waits.
    Steady,
    /// It has room.
    Room,
}

/// The window's move from every engine's reading: narrow if any is full; widen only if
/// every one that answered has room; `None` if none answered.
fn verdict(read: &[Option<Pressure>]) -> Option<Pressure> {
    let answered: Vec<Pressure> = read.iter().flatten().copied().collect();
    if answered.is_empty() {
        return None;
    }
    if answered.contains(&Pressure::Full) {
        Some(Pressure::Full)
    } else if answered.iter().all(|p| *p == Pressure::Room) {
        Some(Pressure::Room)
    } else {
        Some(Pressure::Steady)
    }
}

/// What `body` (an engine's `/metrics`, read as `signals` says) tells; `preempted` is the
/// engine's preemptions counted at the last reading, updated.
fn pressure(signals: Signals, body: &Bytes, preempted: &mut Option<f64>) -> Pressure {
    let text = String::from_utf8_lossy(body);
    match signals {
        Signals::Vllm => {
            let now = sum(&text, "vllm:num_preemptions_total");
            let rose = matches!((*preempted, now), (Some(before), Some(now)) if now > before);
            if now.is_some() {
                *preempted = now;
            }
            let waiting = sum(&text, "vllm:num_requests_waiting").unwrap_or(0.0);
            let kv = max(&text, "vllm:kv_cache_usage_perc")
                .or_else(|| max(&text, "vllm:gpu_cache_usage_perc"))
                .unwrap_or(0.0);
            if rose || waiting > 0.0 || kv >= KV_FULL {
                Pressure::Full
            } else if kv >= 0.9 {
                Pressure::Steady
            } else {
                Pressure::Room
            }
        }
        Signals::LlamaServer => match sum(&text, "llamacpp:requests_deferred") {
            Some(deferred) if deferred > 0.0 => Pressure::Full,
            _ => Pressure::Room,
        },
    }
}

/// The values of the samples of metric `name` in Prometheus text `text`.
fn samples<'t>(text: &'t str, name: &'t str) -> impl Iterator<Item = f64> + 't {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None; // a longer name that starts with this one
        }
        let value = match rest.rfind('}') {
            Some(end) => &rest[end + 1..],
            None => rest,
        };
        value.split_whitespace().next()?.parse().ok()
    })
}

fn sum(text: &str, name: &str) -> Option<f64> {
    samples(text, name).reduce(|a, b| a + b)
}

fn max(text: &str, name: &str) -> Option<f64> {
    samples(text, name).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_metrics_are_read_as_pressure() {
        let vllm =
            |text: &str, before: &mut Option<f64>| pressure(Signals::Vllm, &Bytes::from(text.to_owned()), before);
        let mut before = None;
        let calm = "vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 0\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\"} 0.4\nvllm:num_preemptions_total{model_name=\"m\"} 2\n";
        assert_eq!(vllm(calm, &mut before), Pressure::Room);
        assert_eq!(before, Some(2.0));
        let preempting = calm.replace(
            "num_preemptions_total{model_name=\"m\"} 2",
            "num_preemptions_total{model_name=\"m\"} 5",
        );
        assert_eq!(vllm(&preempting, &mut before), Pressure::Full, "preemptions rose");
        assert_eq!(vllm(&preempting, &mut before), Pressure::Room, "and then stayed");
        let waiting = calm.replace("waiting{model_name=\"m\"} 0", "waiting{model_name=\"m\"} 1");
        assert_eq!(vllm(&waiting, &mut before), Pressure::Full);
        let full = calm.replace("0.4", "0.97");
        assert_eq!(vllm(&full, &mut before), Pressure::Full);
        let llama = |text: &str| pressure(Signals::LlamaServer, &Bytes::from(text.to_owned()), &mut None);
        assert_eq!(
            llama("llamacpp:requests_processing 4\nllamacpp:requests_deferred 2\n"),
            Pressure::Full
        );
        assert_eq!(llama("llamacpp:requests_deferred 0\n"), Pressure::Room);
        assert_eq!(
            verdict(&[None, Some(Pressure::Room), Some(Pressure::Full)]),
            Some(Pressure::Full)
        );
        assert_eq!(verdict(&[Some(Pressure::Room), None]), Some(Pressure::Room));
        assert_eq!(verdict(&[None]), None);
    }
}
