//! The open-loop generator: request `i` is spawned as its own task at
//! `start + schedule.offset(i)`, whether or not earlier requests have answered, and its
//! latency runs from that intended instant to the end of the response body. A server
//! that stalls therefore shows its stall in every request it delayed (no coordinated
//! omission). Outcomes flow over a channel to one recorder task.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Full};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::client::{error_kind, Client};
use crate::payload::Template;
use crate::record::{Failure, Outcome, Recording, Reply, NO_TIER, TIER_HEADER};
use crate::schedule::Schedule;

/// How the generator waits for each intended send time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pacer {
    /// A dedicated OS thread sleeps to each instant (`std::thread::sleep`, ~50-100 µs
    /// late) and spawns the request onto the runtime.
    #[default]
    Thread,
    /// `tokio::time::sleep_until` in a task: the tokio timer has 1 ms resolution and
    /// rounds deadlines up, so every latency carries 0-1 ms of generator lag.
    Tokio,
}

/// One phase of load: what to offer, for how long, and the client-side bounds.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Intended send times.
    pub schedule: Schedule,
    /// Sent but not recorded, before the measured window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Requests outstanding at most; beyond, requests count as `dropped_client_side`.
    pub max_in_flight: usize,
    /// Per request, from the moment it is sent to the end of its body.
    pub timeout: Duration,
    /// How to wait for intended send times.
    pub pacer: Pacer,
}

/// Runs one phase against one target and returns what the measured window recorded.
/// Returns once every request sent has answered or timed out.
pub async fn run(client: &Client, template: &Arc<Template>, plan: &Plan) -> anyhow::Result<Recording> {
    let start = Instant::now();
    let window_start = start + plan.warmup;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut recording = Recording::new(window_start, plan.duration);
    let recorder = tokio::spawn(async move {
        while let Some(outcome) = rx.recv().await {
            recording.record(outcome);
        }
        recording
    });
    let dispatcher = Dispatcher {
        client: client.clone(),
        template: template.clone(),
        handle: Handle::current(),
        in_flight: Arc::new(AtomicUsize::new(0)),
        max_in_flight: plan.max_in_flight,
        timeout: plan.timeout,
        outcomes: tx,
    };
    let ticks = Ticks {
        schedule: plan.schedule.clone(),
        start,
        end: window_start + plan.duration,
        next: 0,
    };
    match plan.pacer {
        Pacer::Thread => pace_on_thread(dispatcher, ticks).await?,
        Pacer::Tokio => pace_on_runtime(dispatcher, ticks).await,
    }
    recorder.await.context("recorder task failed")
}

/// Intended send instants of a phase, in order, up to (excluding) `end`.
struct Ticks {
    schedule: Schedule,
    start: Instant,
    end: Instant,
    next: u64,
}

impl Iterator for Ticks {
    type Item = Instant;

    fn next(&mut self) -> Option<Instant> {
        let at = self.start + self.schedule.offset(self.next);
        self.next += 1;
        (at < self.end).then_some(at)
    }
}

/// Everything needed to start one request; owned by the pacer.
struct Dispatcher {
    client: Client,
    template: Arc<Template>,
    handle: Handle,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    timeout: Duration,
    outcomes: mpsc::UnboundedSender<Outcome>,
}

/// Decrements the in-flight count when a request's task ends, however it ends.
struct InFlight(Arc<AtomicUsize>);

/// Tells the pacer thread to stop when the phase's future is dropped (Ctrl-C).
struct StopOnDrop(Arc<AtomicBool>);

impl Dispatcher {
    /// Spawns the request intended at `intended`, or records it as dropped.
    fn dispatch(&self, intended: Instant) {
        // Only this (single) pacer increments, so load-then-add cannot overshoot.
        if self.in_flight.load(Ordering::Acquire) >= self.max_in_flight {
            let now = Instant::now();
            let dropped = Outcome {
                intended,
                started: now,
                done: now,
                result: Err(Failure::DroppedClientSide),
            };
            let _ = self.outcomes.send(dropped);
            return;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.in_flight.clone());
        let (client, request) = (self.client.clone(), self.template.request());
        let (timeout, outcomes) = (self.timeout, self.outcomes.clone());
        self.handle.spawn(async move {
            let started = Instant::now();
            let result = match tokio::time::timeout(timeout, exchange(&client, request)).await {
                Ok(result) => result,
                Err(_) => Err(Failure::Transport("timeout".to_owned())),
            };
            let outcome = Outcome {
                intended,
                started,
                done: Instant::now(),
                result,
            };
            drop(guard);
            // The receiver lives until every sender is gone: a send cannot fail.
            let _ = outcomes.send(outcome);
        });
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Sends one request and reads its whole body.
async fn exchange(client: &Client, request: Request<Full<Bytes>>) -> Result<Reply, Failure> {
    let response = client
        .request(request)
        .await
        .map_err(|e| Failure::Transport(error_kind("request", &e)))?;
    let mut status = response.status().as_u16();
    let tier = response
        .headers()
        .get(TIER_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(NO_TIER)
        .to_owned();
    let grpc_in_headers = response.headers().get("grpc-status").cloned();
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| Failure::Transport(error_kind("body", &e)))?;
    // gRPC answers 200 at the HTTP level; the outcome is in grpc-status.
    if let Some(code) = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .or(grpc_in_headers.as_ref())
    {
        status = grpc_as_http(code.to_str().unwrap_or("2"));
    }
    Ok(Reply { status, tier })
}

/// The HTTP status that matches a gRPC status code, so reports count both alike.
fn grpc_as_http(code: &str) -> u16 {
    match code {
        "0" => 200,
        "3" | "9" | "11" => 400,
        "5" => 404,
        "8" => 429,
        "12" => 501,
        "14" => 503,
        "4" => 504,
        _ => 500,
    }
}

/// Paces on a dedicated OS thread: `std::thread::sleep` has µs resolution where the
/// tokio timer has 1 ms, and a thread cannot be held up by busy runtime workers.
async fn pace_on_thread(dispatcher: Dispatcher, ticks: Ticks) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let (done_tx, done_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("loadtest-pacer".to_owned())
        .spawn(move || {
            for intended in ticks {
                if !sleep_until(intended, &stop) {
                    break;
                }
                dispatcher.dispatch(intended);
            }
            drop(dispatcher);
            let _ = done_tx.send(());
        })?;
    done_rx.await.context("pacer thread panicked")
}

/// Paces with `tokio::time::sleep_until` on the intended instant.
async fn pace_on_runtime(dispatcher: Dispatcher, ticks: Ticks) {
    for intended in ticks {
        tokio::time::sleep_until(intended.into()).await;
        dispatcher.dispatch(intended);
    }
}

/// Sleeps until `at`, in slices short enough to notice `stop`; false if stopped.
fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(50)));
    }
}
