//! The simulated model server (`tiergate sim`): a real KServe v2 HTTP server
//! (HTTP/1.1 and h2c) whose models cost `t(B) = max(floor, a + b·B)` per batch on `k`
//! instances, with optional jitter and faults. It stands in for the backends at the
//! bottom of the request path, for the tests, the demo and the load tests. Its outputs
//! are a deterministic function of each input row (see [`Simulator`]), so a caller can
//! check it got its own rows back however a gateway batched them, and its [`Stats`]
//! let a test see what reached the backend.
//!
//! # Layout
//!
//! `profile` (cost model, faults, model specs) · `instance` (instance threads, FIFO
//! queue, hold gate) · `server` (accept loop, routes) · `infer` (the infer handler and
//! the outputs) · `json` (TF-Serving predict and OpenAI-style embeddings, for JSON routes).
//!
//! A BYTES element (or a JSON row) equal to `poison` is refused with 400, as a model
//! refuses input it cannot read: the micro-batch tier's poison isolation is tested with it.

mod answer;
mod grpc;
mod infer;
mod instance;
mod json;
mod llm;
mod profile;
mod server;

#[cfg(test)]
mod scheduling_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use llm::{LlmProfile, LlmStats, StreamFaults};
pub use profile::{Faults, ModelSpec, Profile};

use instance::{Gate, Job};

/// A handle on the simulated server: cheap to clone, shared by every connection.
///
/// Each infer request is one batch of `B` rows (`B` = `shape[0]` of the inputs, which
/// must agree). `OUTPUT0` is an exact copy of the first input; `OUTPUT1` is FP64 of
/// shape `[B]` whose element `r` sums the elements of the first input's row `r` (BOOL:
/// count of true; BYTES: sum of element lengths), times the first input's own `scale`
/// parameter when it has one (as a backend that reads per-input parameters answers). A
/// combined model answers both per head instead ([`ModelSpec::heads`]).
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

/// How many request ids [`Stats::ids`] keeps.
pub const IDS_KEPT: usize = 1024;

/// A snapshot of one model's counters.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Infer requests received with a readable body; counted once the request is
    /// queued for an instance (or refused), so a test that saw `requests == n` knows
    /// the first `n` are queued in order.
    pub requests: u64,
    /// Infer requests inside the handler now.
    pub in_flight: u64,
    /// Highest `in_flight` seen.
    pub max_in_flight: u64,
    /// Batches executed to the end (injected errors are not batches).
    pub batches: u64,
    /// Rows over all executed batches.
    pub rows: u64,
    /// Executed batches by size in rows.
    pub batch_sizes: BTreeMap<u64, u64>,
    /// Handlers dropped before answering (the client went away). A queued batch whose
    /// client left is then skipped, and not counted again.
    pub cancelled: u64,
    /// Injected error faults.
    pub errors: u64,
    /// The raw body of the most recent infer request, for byte-exact pass-through checks.
    pub last_request: Bytes,
    /// The ids of the last [`IDS_KEPT`] infer requests that had one, in the order they
    /// were queued (the order a stateful model would apply them in).
    pub ids: Vec<String>,
    /// The `traceparent` of the most recent infer request that had one (HTTP header or
    /// gRPC metadata), as a traced backend would record it.
    pub last_traceparent: Option<String>,
}

struct Inner {
    models: HashMap<String, Model>,
    /// The LLMs' engines, by model.
    llms: HashMap<String, llm::Engine>,
    gate: Arc<Gate>,
}

/// One model's queue and counters.
struct Model {
    jobs: std::sync::mpsc::Sender<Job>,
    stats: Arc<watch::Sender<Stats>>,
    /// What `OUTPUT1` of rows with a negative sum is off by: (drift, noise).
    off: (f64, f64),
    /// A combined model's heads (see [`ModelSpec::heads`]).
    heads: Vec<String>,
}

impl Simulator {
    /// Starts the instance threads of every model (a later spec with the same name
    /// replaces an earlier one). The threads end when the last handle is dropped.
    pub fn new(models: Vec<ModelSpec>) -> Self {
        let gate = Arc::new(Gate::default());
        let llms = models
            .iter()
            .filter_map(|spec| Some((spec.name.clone(), llm::Engine::start(spec.llm?))))
            .collect();
        let models = models
            .into_iter()
            .map(|spec| {
                let stats = Arc::new(watch::Sender::new(Stats::default()));
                let jobs = instance::spawn(&spec, &gate, &stats);
                let off = (spec.drift, spec.noise);
                let heads = spec.heads;
                (
                    spec.name,
                    Model {
                        jobs,
                        stats,
                        off,
                        heads,
                    },
                )
            })
            .collect();
        Simulator {
            inner: Arc::new(Inner { models, llms, gate }),
        }
    }

    /// Serves KServe v2 over gRPC (`inference.GRPCInferenceService`) on `listener` until
    /// `shutdown` fires: the same models, instances and statistics as [`Self::listen`].
    pub async fn listen_grpc(self, listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
        grpc::listen(self, listener, shutdown).await
    }

    /// Serves KServe v2 over HTTP/1.1 and h2c on `listener` until `shutdown` fires;
    /// then stops accepting and returns, while each open connection, told by the same
    /// token, finishes its in-flight requests and closes gracefully.
    pub async fn listen(self, listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
        server::listen(self, listener, shutdown).await
    }

    /// A snapshot of `model`'s counters; `None` for an unknown model.
    pub fn stats(&self, model: &str) -> Option<Stats> {
        self.model(model).map(|m| m.stats.borrow().clone())
    }

    /// A snapshot of LLM `model`'s counters; `None` for a model that is not an LLM.
    pub fn llm_stats(&self, model: &str) -> Option<LlmStats> {
        self.inner.llms.get(model).map(llm::Engine::stats)
    }

    /// Test hook: from now on each new stream stalls, or sends a malformed event and
    /// ends, after the tokens `faults` says (0: never).
    pub fn faulty_streams(&self, faults: StreamFaults) {
        self.inner.gate.set_stream_faults(faults);
    }

    fn llm(&self, model: &str) -> Option<&llm::Engine> {
        self.inner.llms.get(model)
    }

    fn llm_models(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner.llms.keys().cloned().collect();
        names.sort();
        names
    }

    fn stream_faults(&self) -> StreamFaults {
        self.inner.gate.stream_faults()
    }

    /// Test hook: from now on instances start no batch (requests wait in the queue)
    /// until [`release`](Self::release). Batches already running finish.
    pub fn hold(&self) {
        self.inner.gate.set_held(true);
    }

    /// Test hook: from now on every batch fails at once with 500 `injected fault`
    /// (`true`), or runs as its model says again (`false`).
    pub fn fail(&self, failing: bool) {
        self.inner.gate.set_failing(failing);
    }

    /// Test hook: from now on every inference request is answered 503 at once, as by
    /// a server shutting down (`true`), or served again (`false`).
    pub fn unavailable(&self, unavailable: bool) {
        self.inner.gate.set_unavailable(unavailable);
    }

    /// Test hook: from now on every batch takes `factor` times its cost (1: as its
    /// model says).
    pub fn slow(&self, factor: u32) {
        self.inner.gate.set_slow(factor);
    }

    /// Test hook: from now on an inference request whose body is over `bytes` is
    /// refused with 413 (0: the simulator's own limit again), as Triton started with a
    /// smaller `--http-max-input-size` refuses it.
    pub fn limit_body(&self, bytes: u64) {
        self.inner.gate.set_max_body(bytes);
    }

    /// Inference requests refused so far for a body over [`Simulator::limit_body`].
    pub fn refused_too_large(&self) -> u64 {
        self.inner.gate.refused_too_large()
    }

    /// Lets instances start batches again, in queue order.
    pub fn release(&self) {
        self.inner.gate.set_held(false);
    }

    /// Resolves once `pred` holds for `model`'s counters; re-checked on every change,
    /// never by polling. An unknown model never resolves (wrap the call in a timeout).
    pub async fn wait_for(&self, model: &str, pred: impl Fn(&Stats) -> bool) {
        let Some(m) = self.model(model) else {
            tracing::warn!(model, "wait_for on a model the simulator does not serve");
            return std::future::pending().await;
        };
        let mut changes = m.stats.subscribe();
        // Fails only if the sender is dropped, and `self` keeps it alive.
        let _ = changes.wait_for(|s| pred(s)).await;
    }

    fn model(&self, name: &str) -> Option<&Model> {
        self.inner.models.get(name)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Wake held instances so their threads can end.
        self.gate.close();
    }
}
