//! The offline workers: for every route with runnable jobs, lease its oldest jobs, run
//! them through the micro-batch tier's batching as filler on spare capacity (callers
//! always first), and record how each attempt ended (one commit per group).
//!
//! A 2xx answer succeeds and is kept; another 4xx is the client's mistake and is kept as
//! a failure; a failure that may pass (backend unreachable, 5xx, 429, shed, deadline) is
//! retried with exponential backoff and jitter until `max_attempts`, after which the job
//! fails with its last error. A sweep every second expires jobs whose completion window
//! passed and deletes finished ones past their retention.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, Request};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config;
use crate::decision::{Door, Tier};
use crate::error::Error;
use crate::error::Kind;
use crate::policy::Store;
use crate::protocol::Reply;
use crate::queue::scored::Scored;
use crate::queue::{self, Answer, Finish, Job, JobStore, Queue};
use crate::shadow::{Primary, Shadow};
use crate::tiers::{Call, MicroBatch, Realtime};

/// What the offline workers drain: jobs of `store`, routes from `policy`, batches
/// through `micro` (and `realtime`, when a route lets offline work borrow it); `wake`
/// says a job was accepted.
#[derive(Debug, Clone)]
pub struct Workers {
    /// The queue.
    pub store: Queue,
    /// The running policy.
    pub policy: Arc<Store>,
    /// The micro-batch tier, whose batches carry the jobs as filler.
    pub micro: MicroBatch,
    /// The real-time tier, borrowed while idle when a route allows it.
    pub realtime: Realtime,
    /// The offline tier's settings.
    pub settings: config::Offline,
    /// Notified on every accepted submission.
    pub wake: Arc<Notify>,
    /// Scores the lines of shadow batches with their route's candidate.
    pub shadow: Option<Shadow>,
    /// The routes' prediction caches, which precomputing batches write their answers into.
    pub cache: crate::cache::Cache,
    /// The usage ledger, whose tenants' quotas hold jobs back.
    pub usage: Arc<crate::usage::Ledger>,
}

/// How long a job whose tenant's quota is spent waits before it is looked at again
/// (sooner when the quota resets first): a raised quota lets it run within this. Each
/// look leases and queues back the tenant's waiting jobs (no attempt counted).
const QUOTA_RECHECK: Duration = Duration::from_secs(15);
/// The longest a job waiting for its tenant's tokens waits before it is looked at
/// again: the calls in flight give back what they reserved and did not use when they
/// end, which the refill's wait does not know of.
const TOKENS_RECHECK: Duration = Duration::from_secs(1);

/// How long a route's worker waits after the queue failed before it tries again (the
/// queue logs the cause once; readiness reports it).
const STORE_BACKOFF: Duration = Duration::from_secs(1);

impl Workers {
    /// Runs the workers: one task per route with runnable jobs, which leases up to a
    /// batch's worth of the route's oldest jobs and queues them as filler, riding in
    /// micro-batch callers' batches within a small cost slack or in batches of their own
    /// when the pool is idle. Once `closing` fires nothing more is leased and each task
    /// finishes the group it holds; one still running when `shutdown` fires hands its
    /// jobs back to the queue (queued again, for this gateway's next start or another
    /// replica). Returns when every task has ended.
    pub async fn run(self, closing: CancellationToken, shutdown: CancellationToken) {
        let active: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut tasks = JoinSet::new();
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            match self.store.runnable_routes().await {
                Ok(routes) => {
                    for name in routes {
                        if !active.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone()) {
                            continue; // already draining
                        }
                        let worker = RouteWorker {
                            name,
                            workers: self.clone(),
                            active: active.clone(),
                            closing: closing.clone(),
                            shutdown: shutdown.clone(),
                        };
                        tasks.spawn(worker.run());
                    }
                }
                Err(e) => tracing::debug!(error = %e, "offline: cannot list runnable jobs"),
            }
            while tasks.try_join_next().is_some() {}
            // Wait for a submission, a route worker that finished, or the next sweep.
            tokio::select! {
                biased;
                _ = closing.cancelled() => break,
                _ = sweep.tick() => {
                    if let Err(e) = self.store.sweep(ms(self.settings.retention)).await {
                        tracing::debug!(error = %e, "offline sweep failed");
                    }
                    report(&self.store).await;
                }
                _ = self.wake.notified() => {
                    // Submissions can arrive thousands a second: look for runnable routes at
                    // most every LOOK, so the scan does not compete with them for the store.
                    tokio::time::sleep(LOOK).await;
                }
            }
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Shortest time between two looks for routes with runnable jobs.
const LOOK: Duration = Duration::from_millis(20);

/// Drains one route's jobs.
struct RouteWorker {
    name: String,
    workers: Workers,
    active: Arc<Mutex<HashSet<String>>>,
    closing: CancellationToken,
    shutdown: CancellationToken,
}

impl RouteWorker {
    async fn run(self) {
        let w = &self.workers;
        let mut store_failed = false;
        while !self.closing.is_cancelled() {
            let Some(route) = w.policy.load().route(&self.name).cloned() else {
                self.fail_all("the route no longer exists").await;
                break;
            };
            let Some(spec) = route.micro_batch.clone() else {
                self.fail_all("the route has no batch pool").await;
                break;
            };
            // One batch's worth at a time, so a job is leased only when it can be sent
            // soon (cancel and expiry still reach the rest).
            let group = usize::try_from(spec.max_batch.get()).unwrap_or(usize::MAX).max(1);
            let jobs = match w.store.lease_route(&self.name, group).await {
                Ok(jobs) if jobs.is_empty() => break,
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::debug!(route = %self.name, error = %e, "offline: cannot lease jobs");
                    store_failed = true;
                    tokio::select! {
                        _ = tokio::time::sleep(STORE_BACKOFF) => {}
                        () = self.closing.cancelled() => {}
                    }
                    break;
                }
            };
            let jobs = match &route.quotas {
                Some(quotas) => self.past_quota(&route.name, quotas, jobs).await,
                None => jobs,
            };
            let (jobs, held) = match &route.tokens {
                Some(rules) if rules.limits_anything() || rules.max_tokens.is_some() || rules.max_n.is_some() => {
                    self.past_tokens(&route.name, rules, jobs).await
                }
                _ => (jobs.into_iter().map(|job| (job, None)).collect(), Vec::new()),
            };
            if jobs.is_empty() {
                continue;
            }
            let (jobs, bodies): (Vec<Job>, Vec<Option<bytes::Bytes>>) = jobs.into_iter().unzip();
            let calls = jobs
                .iter()
                .zip(bodies)
                .map(|(job, body)| {
                    let mut call = call(&route, job, &w.settings);
                    if let Some(body) = body {
                        *call.request.body_mut() = sent(&route, &job.request.path, body);
                    }
                    call
                })
                .collect();
            let attempt = async {
                let started = Instant::now();
                let answers = self.serve(&route, calls).await;
                self.precomputed(&route, &jobs, &answers);
                let ends = jobs
                    .iter()
                    .zip(answers)
                    .map(|(job, answer)| (job.id.clone(), job.attempts, outcome(job, answer, &w.settings)))
                    .collect::<Vec<_>>();
                self.count_ended(&route.name, &jobs, &ends, &held);
                self.scored(&route, &jobs, ends, started.elapsed()).await
            };
            let ends = tokio::select! {
                ends = attempt => ends,
                () = self.shutdown.cancelled() => {
                    self.hand_back(&jobs).await;
                    break;
                }
            };
            for (_, _, end) in &ends {
                count_attempt(&self.name, end);
            }
            if let Err(e) = w.store.finish_all(ends).await {
                tracing::warn!(error = %e, "could not record a batch of results; those jobs run again after restart");
            }
            if let Err(e) = w.store.finalize().await {
                tracing::debug!(error = %e, "could not finalize finished batches; the next sweep retries");
            }
        }
        self.active.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.name);
        if !store_failed {
            w.wake.notify_one(); // jobs may have arrived since the last lease came back empty
        }
    }

    /// `jobs` whose tenant's quota on `route` is not spent; the others queued again to
    /// wait (their attempt not counted) until the quota resets, looked at again every
    /// [`QUOTA_RECHECK`] in case it was raised.
    async fn past_quota(&self, route: &str, quotas: &crate::policy::usage::RouteQuotas, jobs: Vec<Job>) -> Vec<Job> {
        let now_ms = queue::now_ms();
        let now = now_ms.div_euclid(1000);
        let mut waiting = Vec::new();
        let mut runnable = Vec::with_capacity(jobs.len());
        for job in jobs {
            match self.workers.usage.quotas.spent(route, &job.request.tenant, quotas, now) {
                None => runnable.push(job),
                Some(spent) => {
                    let recheck = now_ms.saturating_add(ms(QUOTA_RECHECK));
                    let not_before = recheck.min(spent.resets_at.saturating_mul(1000)).max(now_ms + 1000);
                    let reason = format!("waiting: {}", spent.message);
                    waiting.push((job.id.clone(), job.attempts, Finish::Wait { reason, not_before }));
                }
            }
        }
        self.set_aside(route, waiting, "wait for their tenants' quotas").await;
        runnable
    }

    /// `jobs` fitted to `route`'s token `rules`, each with the body to send when it
    /// differs and, in `held` order, its reservation of the route's token limits (`None`
    /// for a job that is no OpenAI call). A job whose tenant's tokens are spent is queued
    /// again to wait until enough are back (its attempt not counted); one that does not
    /// fit the rules, or asks for more than a limit ever allows, fails alone.
    async fn past_tokens(
        &self,
        route: &str,
        rules: &crate::policy::tokens::TokenRules,
        jobs: Vec<Job>,
    ) -> (
        Vec<(Job, Option<bytes::Bytes>)>,
        Vec<Option<crate::usage::limits::Reservation>>,
    ) {
        use crate::usage::limits::{Call, Refused};
        let now_ms = queue::now_ms();
        let mut ended = Vec::new();
        let (mut runnable, mut held) = (Vec::with_capacity(jobs.len()), Vec::with_capacity(jobs.len()));
        for job in jobs {
            if !crate::llm::openai::is_path(&job.request.path) {
                runnable.push((job, None));
                held.push(None);
                continue;
            }
            let fitted = match crate::usage::limits::fit(rules, route, &job.request.path, job.request.body.clone()) {
                Ok(fitted) => fitted,
                Err(unfit) => {
                    ended.push((job.id.clone(), job.attempts, Finish::Failed { error: unfit.message }));
                    continue;
                }
            };
            let call = Call {
                route,
                tenant: &job.request.tenant,
                rules,
                tokens: fitted.tokens,
            };
            match self.workers.usage.limits.reserve(call).await {
                Ok((reservation, _)) => {
                    let body = (fitted.body != job.request.body).then_some(fitted.body);
                    runnable.push((job, body));
                    held.push(reservation);
                }
                Err(Refused::TooLarge { asked, limit }) => {
                    let error = format!(
                        "this call reserves {asked} tokens, more than {} = {} ever allows: lower max_tokens or n",
                        limit.knob, limit.limit
                    );
                    ended.push((job.id.clone(), job.attempts, Finish::Failed { error }));
                }
                Err(Refused::Spent {
                    limit,
                    left,
                    retry_after,
                    ..
                }) => {
                    let reason = format!(
                        "waiting: {} = {} has {left} left, this call reserves {}",
                        limit.knob, limit.limit, fitted.tokens
                    );
                    let not_before =
                        now_ms.saturating_add(ms(retry_after.clamp(Duration::from_millis(100), TOKENS_RECHECK)));
                    ended.push((job.id.clone(), job.attempts, Finish::Wait { reason, not_before }));
                }
            }
        }
        self.set_aside(route, ended, "wait for (or do not fit) their tenants' tokens")
            .await;
        (runnable, held)
    }

    /// Records the `ends` of jobs on `route` that were not sent (they `what`): each
    /// counted as an attempt's end, queued back to wait or failed alone.
    async fn set_aside(&self, route: &str, ends: Vec<(queue::JobId, u32, Finish)>, what: &str) {
        if ends.is_empty() {
            return;
        }
        tracing::debug!(route, jobs = ends.len(), "offline jobs {what}");
        for (_, _, end) in &ends {
            count_attempt(route, end);
        }
        if let Err(e) = self.workers.store.finish_all(ends).await {
            tracing::warn!(error = %e, "could not record offline jobs that {what}; they run again after restart");
        }
    }

    /// Queues `jobs` again (the gateway is stopping before their attempt ended), so this
    /// gateway's next start or another replica runs them.
    async fn hand_back(&self, jobs: &[Job]) {
        let now = queue::now_ms();
        let ends = jobs
            .iter()
            .map(|job| {
                let error = "handed back: the gateway stopped before this attempt ended".to_owned();
                (job.id.clone(), job.attempts, Finish::Retry { error, not_before: now })
            })
            .collect();
        match self.workers.store.finish_all(ends).await {
            Ok(_) => tracing::info!(route = %self.name, jobs = jobs.len(), "offline jobs handed back to the queue"),
            Err(e) => {
                tracing::warn!(route = %self.name, error = %e, "could not hand jobs back; they run again after restart")
            }
        }
    }

    /// Counts each of `jobs` that ended (answered, or failed for good) as a request of
    /// its tenant's, and the tokens an LLM answer says it used (its `usage`), settling
    /// the job's reservation `held` of its route's token limits with them: an offline
    /// request, a Batch API line or one sent with `Prefer: respond-async`, counts once,
    /// when it ends (its rows and time are charged as the batch pool serves it).
    fn count_ended(
        &self,
        route: &str,
        jobs: &[Job],
        ends: &[(queue::JobId, u32, Finish)],
        held: &[Option<crate::usage::limits::Reservation>],
    ) {
        use crate::usage::{Field, Figures, Source, TokenMeter};
        let usage = self.workers.usage.route(route);
        let one = Figures::default().with(Field::Requests, 1);
        for (i, (job, (_, _, end))) in jobs.iter().zip(ends).enumerate() {
            let held = held.get(i).cloned().flatten();
            let tenant = &job.request.tenant;
            match end {
                Finish::Answered(answer) => {
                    usage.add(Source::Offline, tenant, &one);
                    let used = (200..300)
                        .contains(&answer.status)
                        .then(|| crate::llm::openai::Usage::of(&answer.body))
                        .flatten();
                    if let Some(used) = used {
                        TokenMeter::new(route, Tier::Offline, usage.clone(), tenant)
                            .holding(held)
                            .count(used);
                    }
                }
                Finish::Failed { .. } => usage.add(Source::Offline, tenant, &one),
                Finish::Retry { .. } | Finish::Wait { .. } => {}
            }
        }
    }

    /// Writes the answers of the lines of precomputing batches into the route's cache,
    /// for the TTL each batch gave (when the route's cache is still on).
    fn precomputed(&self, route: &Arc<crate::policy::Route>, jobs: &[Job], answers: &[Result<Reply, Error>]) {
        let Some(spec) = route.cache.as_ref().filter(|_| route.flags.cache) else {
            return;
        };
        for (job, answer) in jobs.iter().zip(answers) {
            let (Some(ttl), Ok(reply)) = (job.request.precompute(), answer) else {
                continue;
            };
            let request = call(route, job, &self.workers.settings).request;
            if let Some(asked) = crate::cache::asked(route, spec, &request) {
                self.workers.cache.precompute(route, asked, reply, ttl);
            }
        }
    }

    /// Serves `calls` as micro-batch filler; first, when the route allows it, one at a
    /// time on the real-time pool while that pool has nothing else in flight.
    async fn serve(&self, route: &crate::policy::Route, calls: Vec<Call>) -> Vec<Result<Reply, Error>> {
        if calls.iter().any(streams) {
            return Box::pin(self.serve_but_streams(route, calls)).await;
        }
        let mut answers = Vec::with_capacity(calls.len());
        let mut calls = calls.into_iter().peekable();
        let realtime = &self.workers.realtime;
        while route.borrow.offline_on_realtime && calls.peek().is_some() && realtime.idle(route) {
            let Some(call) = calls.next() else { break };
            ::metrics::counter!(crate::metrics::BORROWED, "route" => route.name.clone(), "from" => "realtime", "to" => "offline")
                .increment(1);
            answers.push(realtime.serve(call).await);
        }
        answers.extend(self.workers.micro.serve_filler(calls.collect()).await);
        answers
    }

    /// [`Self::serve`] of calls some of which ask for a stream: those fail alone (an
    /// offline answer is written whole), the others are served.
    async fn serve_but_streams(&self, route: &crate::policy::Route, calls: Vec<Call>) -> Vec<Result<Reply, Error>> {
        let streaming: Vec<bool> = calls.iter().map(streams).collect();
        let others = calls.into_iter().filter(|c| !streams(c)).collect();
        let mut served = self.serve(route, others).await.into_iter();
        let why = "stream is not supported offline: the answer is written whole; send the request without \"stream\"";
        streaming
            .into_iter()
            .map(|stream| match stream {
                true => Err(Error::new(Kind::BadRequest, why)),
                false => served
                    .next()
                    .unwrap_or_else(|| Err(Error::new(Kind::Backend, "the batch pool gave no answer"))),
            })
            .collect()
    }

    /// `ends` with each answered line of a shadow batch scored by the route's candidate
    /// (all at once, each waiting for a slot of the candidate's pool within the shadow
    /// budget); `took` is how long the primary took for the group.
    async fn scored(
        &self,
        route: &Arc<crate::policy::Route>,
        jobs: &[Job],
        mut ends: Vec<(queue::JobId, u32, Finish)>,
        took: Duration,
    ) -> Vec<(queue::JobId, u32, Finish)> {
        let (Some(shadow), Some(batch)) = (&self.workers.shadow, &route.micro_batch) else {
            return ends;
        };
        let mut lines = JoinSet::new();
        for (i, (job, (_, _, end))) in jobs.iter().zip(&mut ends).enumerate() {
            let Finish::Answered(answer) = end else { continue };
            if !job.request.shadow {
                continue;
            }
            // Until its scoring ends (should it panic, the line says so).
            answer.comparison = Some(Scored::not_compared("error").to_text());
            let request = call(route, job, &self.workers.settings).request;
            let (primary, pool) = (reply(answer), batch.pool.clone());
            let line = format!("batch_req_{}", job.id.trim_start_matches("job_"));
            let (shadow, route) = (shadow.clone(), route.clone());
            lines.spawn(async move {
                let primary = Primary {
                    answer: &primary,
                    took,
                    pool: &pool,
                };
                (i, shadow.score_line(&route, request, primary, &line).await)
            });
        }
        while let Some(scored) = lines.join_next().await {
            let Ok((i, scored)) = scored else { continue };
            if let Some((_, _, Finish::Answered(answer))) = ends.get_mut(i) {
                answer.comparison = Some(scored.to_text());
            }
        }
        ends
    }

    /// Fails every runnable job of the route (it cannot be served any more).
    async fn fail_all(&self, why: &str) {
        loop {
            let jobs = match self.workers.store.lease_route(&self.name, 1024).await {
                Ok(jobs) if !jobs.is_empty() => jobs,
                _ => return,
            };
            let error = format!("route {}: {why}", self.name);
            let ends = jobs
                .iter()
                .map(|job| (job.id.clone(), job.attempts, Finish::Failed { error: error.clone() }))
                .collect();
            if self.workers.store.finish_all(ends).await.is_err() {
                return;
            }
        }
    }
}

fn call(route: &Arc<crate::policy::Route>, job: &Job, settings: &config::Offline) -> Call {
    let mut request = Request::new(sent(route, &job.request.path, job.request.body.clone()));
    *request.method_mut() = Method::from_bytes(job.request.method.as_bytes()).unwrap_or(Method::POST);
    if let Ok(uri) = job.request.path.parse() {
        *request.uri_mut() = uri;
    }
    // Only the headers that frame the body (a job's other entries, such as
    // queue::PRECOMPUTE, are not header names).
    for (k, v) in &job.request.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
            request.headers_mut().insert(k, v);
        }
    }
    // The job's tenant goes with it: its work reads and writes only that tenant's cache.
    if !job.request.tenant.is_empty() {
        request
            .extensions_mut()
            .insert(crate::tenant::Tenant::named(&job.request.tenant));
    }
    Call {
        route: route.clone(),
        tier: Tier::Offline,
        door: Door::Http, // offline jobs come in over HTTP only
        deadline: Instant::now() + settings.attempt_timeout,
        request,
        stream: false, // a line asking for a stream fails alone (`streams`)
    }
}

/// The `body` of a job to `path` on `route` as it is sent: an OpenAI call on a route
/// with `backend_priority` carries the lowest band (offline work) as vLLM's `priority`.
fn sent(route: &crate::policy::Route, path: &str, body: bytes::Bytes) -> bytes::Bytes {
    if !(route.backend_priority && crate::llm::openai::is_path(path)) {
        return body;
    }
    let sheddable = crate::policy::model::Priority::Sheddable.vllm();
    crate::llm::openai::with_priority(&body, sheddable).unwrap_or(body)
}

/// How an attempt ended, from the tier's answer.
fn outcome(job: &Job, answer: Result<Reply, crate::error::Error>, settings: &config::Offline) -> Finish {
    let retry = |error: String| {
        if job.attempts >= settings.max_attempts {
            return Finish::Failed {
                error: format!(
                    "{error} (attempt {} of {}; giving up)",
                    job.attempts, settings.max_attempts
                ),
            };
        }
        let backoff = settings
            .retry_backoff
            .saturating_mul(1 << job.attempts.saturating_sub(1).min(16));
        let jitter = backoff.mul_f64(rand::random::<f64>() * 0.2);
        Finish::Retry {
            error: format!("{error} (attempt {} of {})", job.attempts, settings.max_attempts),
            not_before: queue::after(backoff + jitter),
        }
    };
    match answer {
        Ok(reply) => {
            let status = reply.status().as_u16();
            let answer = kept(reply);
            match status {
                429 | 500..=599 if job.attempts < settings.max_attempts => {
                    retry(format!("the backend answered {status}"))
                }
                _ => Finish::Answered(answer),
            }
        }
        Err(e) => match e.kind {
            Kind::Shed
            | Kind::QueueFull
            | Kind::DeadlineUnmeetable
            | Kind::Deadline
            | Kind::Backend
            | Kind::Unavailable => retry(e.message),
            _ => Finish::Failed { error: e.message },
        },
    }
}

/// The parts of a backend answer kept for the client.
fn kept(reply: Reply) -> Answer {
    let (head, body) = reply.into_parts();
    let headers = [
        http::header::CONTENT_TYPE,
        crate::protocol::HEADER_LEN,
        crate::headers::BATCH_ID,
    ]
    .iter()
    .filter_map(|k| {
        head.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(|v| (k.as_str().to_owned(), v.to_owned()))
    })
    .collect();
    Answer {
        status: head.status.as_u16(),
        headers,
        body,
        comparison: None,
    }
}

/// A kept answer as the tiers pass answers (for comparing it).
fn reply(answer: &Answer) -> Reply {
    let mut reply = http::Response::new(answer.body.clone());
    *reply.status_mut() = http::StatusCode::from_u16(answer.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    for (k, v) in &answer.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
            reply.headers_mut().insert(k, v);
        }
    }
    reply
}

/// Counts an offline attempt's end (and, when it is the job's last, the job's SLO).
fn count_attempt(route: &str, end: &Finish) {
    let result = match end {
        Finish::Answered(a) if (200..300).contains(&a.status) => "succeeded",
        Finish::Answered(_) => "answered",
        Finish::Retry { .. } => "retry",
        Finish::Wait { .. } => "waiting",
        Finish::Failed { .. } => "failed",
    };
    ::metrics::counter!(crate::metrics::OFFLINE_ATTEMPTS, "route" => route.to_owned(), "result" => result).increment(1);
    if !matches!(result, "retry" | "waiting") {
        crate::metrics::count_slo(route, Tier::Offline, result == "succeeded");
    }
}

/// Exports jobs by state.
async fn report(store: &Queue) {
    if let Ok(counts) = store.counts().await {
        for state in queue::State::ALL {
            let n = counts.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
            ::metrics::gauge!(crate::metrics::OFFLINE_JOBS, "state" => state.as_str()).set(n as f64);
        }
    }
    if let Ok(oldest) = store.oldest_queued().await {
        let age = oldest.map_or(0, |at| queue::now_ms().saturating_sub(at).max(0));
        ::metrics::gauge!(crate::metrics::OFFLINE_OLDEST_QUEUED).set(age as f64 / 1000.0);
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Whether `call` is an OpenAI call asking for a stream (`"stream": true`).
fn streams(call: &Call) -> bool {
    crate::llm::openai::is_path(call.request.uri().path())
        && crate::llm::openai::Ask::of(call.request.body()).is_ok_and(|ask| ask.stream)
}
