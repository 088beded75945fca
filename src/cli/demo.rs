//! The demo: a gateway, two simulated pools and `policies/demo.toml`, in one process.
//!
//! Composition only, beside `tiergate::app`. [`Demo::start`] runs a simulated model
//! server for the real-time pool (127.0.0.1:9100 unless `--realtime-pool` moves it) and
//! one for the batch pool (127.0.0.1:9101, `--batch-pool`), and a gateway serving the
//! demo policy pointed at them. [`examples`] are the requests the demo prints as `curl`
//! lines (and one `tiergate infer` line over gRPC); [`Demo::self_check`] sends them and
//! checks every tier decision, which is how the test suite proves the demo works.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use tiergate::app::Gateway;
use tiergate::config::Config;
use tiergate::policy::Policy;
use tiergate::sim::{LlmProfile, ModelSpec, Profile, Simulator};

/// The demo policy, built into the binary so the demo runs from any directory.
pub const POLICY: &str = include_str!("../../policies/demo.toml");
/// Where `policies/demo.toml` points the real-time pool (the demo rewrites it to where
/// its simulated pool listens).
const REALTIME_POOL: &str = "127.0.0.1:9100";
/// Where `policies/demo.toml` points the batch pool.
const BATCH_POOL: &str = "127.0.0.1:9101";

/// `tiergate demo`'s flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Send the example requests, check every decision, print the results and exit
    /// (non-zero on any mismatch) instead of serving until Ctrl-C.
    #[arg(long)]
    self_check: bool,
    /// Address of the gateway's HTTP door.
    #[arg(long, default_value = "127.0.0.1:8000")]
    http: SocketAddr,
    /// Address of the gateway's gRPC door.
    #[arg(long, default_value = "127.0.0.1:8001")]
    grpc: SocketAddr,
    /// Address of the gateway's metrics endpoint.
    #[arg(long, default_value = "127.0.0.1:8002")]
    metrics: SocketAddr,
    /// Address of the gateway's admin API and console (its token printed at start).
    #[arg(long, default_value = "127.0.0.1:8003")]
    admin: SocketAddr,
    /// Address of the simulated real-time pool (port 0: any free port).
    #[arg(long, default_value = REALTIME_POOL)]
    realtime_pool: SocketAddr,
    /// Address of the simulated batch pool (port 0: any free port).
    #[arg(long, default_value = BATCH_POOL)]
    batch_pool: SocketAddr,
}

/// A running demo.
#[derive(Debug)]
pub struct Demo {
    gateway: Gateway,
    sims: CancellationToken,
    pools: [SocketAddr; 2],
    requests: PathBuf,
    /// The admin API's token, made for this run.
    token: String,
    _data_dir: DataDir,
}

/// The demo's offline store directory, removed when the demo ends.
#[derive(Debug)]
struct DataDir(PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One example request and what the gateway should do with it.
#[derive(Debug, Clone)]
pub struct Example {
    /// What it shows.
    pub title: &'static str,
    /// Request headers beyond content-type.
    pub headers: Vec<(&'static str, &'static str)>,
    /// Model in the path (`None` for a metadata GET on `resnet50`).
    pub model: &'static str,
    /// POST an infer request (else GET the model metadata).
    pub infer: bool,
    /// The status the gateway answers with today.
    pub status: u16,
    /// The `x-tiergate-tier` it answers with, if any.
    pub tier: Option<&'static str>,
    /// The `x-tiergate-reason` it answers with, if any.
    pub reason: Option<&'static str>,
}

/// The batch sizes the demo warms its batch pool with, one call each (see
/// [`Demo::warm_up`]).
const WARM_UP: [usize; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];

/// Requests in the demo's Batch API file.
pub const REQUESTS: usize = 50;

/// Chat lines in the demo's LLM Batch API file.
pub const CHATS: usize = 20;

/// A Batch API file of `n` requests of `body` on `url`.
fn batch_file(n: usize, url: &str, body: &str) -> String {
    (0..n)
        .map(|i| format!(r#"{{"custom_id":"r{i}","method":"POST","url":"{url}","body":{body}}}"#) + "\n")
        .collect()
}

/// A KServe v2 request with two rows of four FP32 values.
pub const BODY: &str = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,4],"data":[1,2,3,4,5,6,7,8]}]}"#;

/// An OpenAI chat request to the demo's LLM, streamed.
pub const CHAT: &str = r#"{"model":"llama","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"What does tiergate do?"}]}"#;

/// The same, answered whole (a Batch API line's body).
const CHAT_WHOLE: &str =
    r#"{"model":"llama","max_tokens":16,"messages":[{"role":"user","content":"Summarise the day's tickets."}]}"#;

impl Demo {
    /// Starts both simulated pools on `pools` (real-time, batch) and a gateway on
    /// `config`'s listeners serving the demo policy pointed at them, with its offline
    /// store in a fresh temporary directory (removed when the demo ends).
    pub async fn start(config: &Config, pools: [SocketAddr; 2]) -> anyhow::Result<Demo> {
        let sims = CancellationToken::new();
        let mut bound = pools;
        for (i, (name, flag)) in [("real-time pool", "realtime"), ("batch pool", "batch")]
            .into_iter()
            .enumerate()
        {
            let addr = pools[i];
            let listener = TcpListener::bind(addr).await.map_err(|e| {
                anyhow::anyhow!(
                    "cannot start the simulated {name} on {addr}: {e} (move it with --{flag}-pool 127.0.0.1:0, \
                     any free port)"
                )
            })?;
            bound[i] = listener.local_addr()?;
            let llm = LlmProfile::named("llm-8b-a100").expect("built-in LLM profile");
            let sim = Simulator::new(vec![
                model("resnet50", "resnet50-trt"),
                model("bert", "bert-base-trt"),
                ModelSpec::llm("llama", llm),
            ]);
            tokio::spawn(sim.listen(listener, sims.clone()));
        }
        // The demo policy, its pools where the simulated ones listen.
        let text = POLICY
            .replace(
                &format!("\"http://{REALTIME_POOL}\""),
                &format!("\"http://{}\"", bound[0]),
            )
            .replace(&format!("\"http://{BATCH_POOL}\""), &format!("\"http://{}\"", bound[1]));
        let mut config = config.clone();
        config.data_dir = std::env::temp_dir().join(format!("tiergate-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&config.data_dir);
        // The admin API edits a copy of the policy, never the repository's file. Both
        // directories are private, as the gateway keeps its own.
        config.policy_dir = config.data_dir.join("policies");
        tiergate::files::private_dir(&config.data_dir)?;
        tiergate::files::private_dir(&config.policy_dir)?;
        let file = config.policy_dir.join("demo.toml");
        std::fs::write(&file, &text)?;
        // A token of this run's own, printed with the lines that use it.
        let token = format!("demo-{:032x}", rand::random::<u128>());
        config.admin.token = Some(tiergate::config::Secret(token.clone()));
        let config = &config;
        let policy = Policy::from_texts(vec![(file, text)])
            .map_err(|p| anyhow::anyhow!("the built-in demo policy is invalid:\n{p}"))?;
        // The Batch API files the demo's `jobs submit` lines name.
        let requests = config.data_dir.join("requests.jsonl");
        std::fs::write(&requests, batch_file(REQUESTS, "/v2/models/resnet50/infer", BODY))?;
        std::fs::write(
            config.data_dir.join("chats.jsonl"),
            batch_file(CHATS, "/v1/chat/completions", CHAT_WHOLE),
        )?;
        let mut gateway = Gateway::start(config, policy).await?;
        if let Err(e) = gateway.watch_policy(&config.policy_dir) {
            tracing::warn!(error = %e, "the demo's policy copy is not watched");
        }
        let demo = Demo {
            gateway,
            sims,
            pools: bound,
            requests,
            token,
            _data_dir: DataDir(config.data_dir.clone()),
        };
        demo.warm_up().await?;
        Ok(demo)
    }

    /// Sends the batch pool one micro-batch call of each of [`WARM_UP`]'s sizes, one
    /// after another, so it has learned its cost (`t(n) = a + b·n`, and `t(1)` that the
    /// usage ledger prices a row alone with) before a newcomer's first request: a pool
    /// learns it from the batches it sends, and needs several of different sizes.
    async fn warm_up(&self) -> anyhow::Result<()> {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        for rows in WARM_UP {
            let data: Vec<String> = (0..rows * 4).map(|i| (i % 10).to_string()).collect();
            let body = format!(
                r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[{rows},4],"data":[{}]}}]}}"#,
                data.join(",")
            );
            let request = http::Request::post(format!("http://{}/v2/models/resnet50/infer", self.http_addr()))
                .header("content-type", "application/json")
                .header("x-tiergate-budget-ms", "2000")
                .header("x-api-key", "demo-warm-up")
                .body(Full::new(Bytes::from(body)))?;
            let response = client.request(request).await?;
            let status = response.status();
            let answer = response.into_body().collect().await?.to_bytes();
            if status != 200 {
                anyhow::bail!(
                    "the batch pool's warm-up: a batch of {rows} rows got {status}: {}",
                    String::from_utf8_lossy(&answer)
                );
            }
        }
        Ok(())
    }

    /// The gateway's HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.gateway.http_addr()
    }

    /// The gateway's gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.gateway.grpc_addr()
    }

    /// The gateway's admin API address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.gateway.admin_addr()
    }

    /// The Batch API input file the demo wrote (resnet50 requests, one per line).
    pub fn requests_file(&self) -> &std::path::Path {
        &self.requests
    }

    /// The Batch API input file of chat lines the demo wrote beside it.
    pub fn chats_file(&self) -> PathBuf {
        self.requests.with_file_name("chats.jsonl")
    }

    /// The gateway's metrics address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.gateway.metrics_addr()
    }

    /// Sends every example and checks status, tier and reason; returns one line per
    /// example, or the first mismatch.
    pub async fn self_check(&self) -> anyhow::Result<Vec<String>> {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let mut lines = Vec::new();
        for ex in examples() {
            let response = client.request(request(self.http_addr(), &ex)?).await?;
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let (tier, reason) = (header("x-tiergate-tier"), header("x-tiergate-reason"));
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            let got = (status, tier.as_deref(), reason.as_deref());
            if got != (ex.status, ex.tier, ex.reason) {
                anyhow::bail!(
                    "{}: expected {:?}, got {got:?}: {}",
                    ex.title,
                    (ex.status, ex.tier, ex.reason),
                    String::from_utf8_lossy(&body)
                );
            }
            lines.push(format!(
                "ok  {:<52} {status} {}",
                ex.title,
                tier.unwrap_or_else(|| "-".into())
            ));
        }
        let grpc = super::infer::infer(self.grpc_addr(), "resnet50", Some(2000), BODY).await?;
        if grpc.tier.as_deref() != Some("micro_batch") || !grpc.json.contains("OUTPUT0") {
            anyhow::bail!("the gRPC example: expected a micro_batch answer, got {grpc:?}");
        }
        lines.push(format!("ok  {:<52} OK  micro_batch", "the same 2 s budget over gRPC"));
        lines.push(self.stream_check(&client).await?);
        lines.push(
            self.batch_check(&self.requests, "/v2/models/resnet50/infer", REQUESTS)
                .await?,
        );
        lines.push(
            self.batch_check(&self.chats_file(), "/v1/chat/completions", CHATS)
                .await?,
        );
        if let Some(admin) = self.admin_addr() {
            let explain = http::Request::post(format!("http://{admin}/admin/explain"))
                .header(http::header::AUTHORIZATION, format!("Bearer {}", self.token))
                .body(Full::new(Bytes::from_static(
                    br#"{"model": "resnet50", "budget_ms": 2000}"#,
                )))?;
            let body = client.request(explain).await?.into_body().collect().await?.to_bytes();
            let answer: serde_json::Value = serde_json::from_slice(&body)?;
            let tier = answer["result"]["tier"].as_str().unwrap_or("-").to_owned();
            if tier != "micro_batch" || answer["micro_batch"]["learned_cost"].is_null() {
                anyhow::bail!("admin explain: expected micro_batch and the batch pool's learned cost, got {answer}");
            }
            lines.push(format!("ok  {:<52} 200 {tier}", "the admin API explains a 2 s budget"));
            lines.push(self.usage_check(&client, admin).await?);
            let page = http::Request::get(format!("http://{admin}/admin/ui/")).body(Full::new(Bytes::new()))?;
            let page = client.request(page).await?;
            if page.status() != 200 {
                anyhow::bail!("the console: expected its page, got {}", page.status());
            }
            lines.push(format!("ok  {:<52} 200 page", "the console at /admin/ui/"));
        }
        Ok(lines)
    }

    /// Reads the usage ledger as `tiergate usage` does: the demo's batches saved
    /// backend time, and every row is priced.
    async fn usage_check(
        &self,
        client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
        admin: SocketAddr,
    ) -> anyhow::Result<String> {
        let request = http::Request::get(format!("http://{admin}/admin/usage?since=1h&by=route"))
            .header(http::header::AUTHORIZATION, format!("Bearer {}", self.token))
            .body(Full::new(Bytes::new()))?;
        let body = client.request(request).await?.into_body().collect().await?.to_bytes();
        let report: serde_json::Value = serde_json::from_slice(&body)?;
        let resnet = report["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["route"] == "resnet50"));
        let saved = resnet.and_then(|r| r["saved_batching_seconds"].as_f64());
        match (saved, resnet.map(|r| &r["unpriced_rows"])) {
            (Some(saved), Some(unpriced)) if saved > 0.0 && unpriced == 0 => Ok(format!(
                "ok  {:<52} {:.3} s saved",
                "the usage ledger prices what batching saved", saved
            )),
            _ => anyhow::bail!(
                "the usage ledger: expected resnet50's batching to have saved time, every row priced: {report}"
            ),
        }
    }

    /// Sends the demo's streamed chat call (its `curl -N` line): a stream of tokens on
    /// the real-time pool, ended by `[DONE]`.
    async fn stream_check(
        &self,
        client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    ) -> anyhow::Result<String> {
        let request = http::Request::post(format!("http://{}/v1/chat/completions", self.http_addr()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(CHAT.as_bytes())))?;
        let response = client.request(request).await?;
        let tier = response.headers().get("x-tiergate-tier").cloned();
        let kind = response.headers().get("content-type").cloned();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body);
        let tokens = text.matches("\"content\":\"").count();
        let streamed = kind.is_some_and(|k| k == "text/event-stream") && text.trim_end().ends_with("data: [DONE]");
        if !streamed || tokens < 16 || tier.as_ref().is_none_or(|t| t != "realtime") {
            anyhow::bail!("the streamed chat call: expected 16 tokens in real time, got {tier:?}: {text}");
        }
        Ok(format!("ok  {:<52} 200 realtime", "a chat call streams token by token"))
    }

    /// Runs a Batch API file of `n` requests on `endpoint` as `tiergate jobs submit`
    /// does: upload, create, wait.
    async fn batch_check(&self, path: &std::path::Path, endpoint: &str, n: usize) -> anyhow::Result<String> {
        use crate::cli::jobs::{call, upload_form};
        let base = format!("http://{}", self.http_addr());
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (multipart, form) = upload_form(&name, &std::fs::read(path)?);
        let (_, file) = call(&base, "POST", "/v1/files", Some(&multipart), form).await?;
        let create = serde_json::json!({"input_file_id": file["id"], "endpoint": endpoint,
                                        "completion_window": "1h"});
        let json = Some("application/json");
        let (_, batch) = call(&base, "POST", "/v1/batches", json, Bytes::from(create.to_string())).await?;
        let id = batch["id"].as_str().unwrap_or_default().to_owned();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (_, batch) = call(&base, "GET", &format!("/v1/batches/{id}"), None, Bytes::new()).await?;
            let done = batch["request_counts"]["completed"].as_u64();
            match batch["status"].as_str() {
                Some("completed") if done == Some(n as u64) => {
                    return Ok(format!("ok  {:<52} {n} requests", format!("the demo's {name} runs")))
                }
                Some("in_progress" | "validating" | "finalizing") if tokio::time::Instant::now() < deadline => {}
                _ => anyhow::bail!("the demo's {name}: {batch}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Stops the gateway and both simulated pools.
    pub async fn stop(self) -> std::io::Result<()> {
        let result = self.gateway.stop().await;
        self.sims.cancel();
        result
    }
}

/// Runs `tiergate demo`: the self-check, or the demo serving until Ctrl-C with the
/// lines to try printed, each runnable as printed.
pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let mut config = Config::default();
    config.listen.http = args.http;
    config.listen.grpc = args.grpc;
    config.listen.metrics = args.metrics;
    config.listen.admin = args.admin;
    tiergate::telemetry::logs::init(&config).map_err(anyhow::Error::msg)?;
    super::runtime(0)?.block_on(serve(config, [args.realtime_pool, args.batch_pool], args.self_check))
}

async fn serve(config: Config, pools: [SocketAddr; 2], self_check: bool) -> anyhow::Result<ExitCode> {
    let running = Demo::start(&config, pools).await?;
    if self_check {
        let result = running.self_check().await;
        running.stop().await?;
        for line in result? {
            println!("{line}");
        }
        println!("demo self-check passed");
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", running.guide());
    println!("Ctrl-C to stop.");
    super::stopped().await;
    running.stop().await?;
    Ok(ExitCode::SUCCESS)
}

impl Demo {
    /// What the demo prints for a newcomer: where everything listens, then each example
    /// as a command to paste.
    pub fn guide(&self) -> String {
        let (http, grpc, metrics) = (self.http_addr(), self.grpc_addr(), self.metrics_addr());
        // This binary by its path: a newcomer who ran `cargo run` has no `tiergate` on the PATH.
        let exe =
            std::env::current_exe().map_or_else(|_| "tiergate".to_owned(), |p| shell_word(&p.display().to_string()));
        let mut out = format!(
            "tiergate demo: gateway on http://{http}, gRPC on {grpc} (metrics on http://{metrics}/metrics)\n\
             simulated pools: real-time {} and batch {}; policy: policies/demo.toml\n\
             the batch pool has learned its cost from {} warm-up batches of 1 to 64 rows (tenant demo-warm-up)\n\n",
            self.pools[0],
            self.pools[1],
            WARM_UP.len()
        );
        for ex in examples() {
            out += &format!("# {} (expect {})\n{}\n\n", ex.title, ex.status, curl(http, &ex));
        }
        out += &format!(
            "# the same over gRPC (KServe v2's GRPCInferenceService, as Triton's clients speak it)\n\
             {exe} infer --grpc {grpc} --model resnet50 --budget-ms 2000 '{BODY}'\n\n\
             # an offline job's answer: the respond-async example above printed `Location: /v1/jobs/ID`\n\
             curl -si http://{http}/v1/jobs/ID\n\n"
        );
        out += &format!(
            "# the Batch API file the demo wrote ({REQUESTS} requests, one {{custom_id, method, url, body}} per line), \
             with a progress bar\n\
             {exe} jobs submit {} --endpoint /v2/models/resnet50/infer --gateway http://{http}\n\n",
            shell_word(&self.requests_file().display().to_string()),
        );
        out += &format!(
            "# a chat call to the LLM, streamed: its tokens print as they come (OpenAI's API, routed by \"model\")\n\
             curl -N http://{http}/v1/chat/completions -H 'content-type: application/json' -d '{CHAT}'\n\n\
             # a Batch API file of {CHATS} chat lines, run offline on the batch pool; each answer carries its usage\n\
             {exe} jobs submit {} --endpoint /v1/chat/completions --gateway http://{http}\n\n",
            shell_word(&self.chats_file().display().to_string()),
        );
        if let Some(admin) = self.admin_addr() {
            out += &format!(
                "# the console: open http://{admin}/admin/ui/ in a browser and log in with the token {token}\n\n\
                 # the admin API from the command line, with the same token: switch a flag, see why, roll back\n\
                 TIERGATE_ADMIN_TOKEN={token} {exe} flags set resnet50 micro_batch off --admin http://{admin}\n\
                 TIERGATE_ADMIN_TOKEN={token} {exe} explain --model resnet50 --budget-ms 2000 --admin http://{admin}\n\
                 TIERGATE_ADMIN_TOKEN={token} {exe} policy history --admin http://{admin}\n\n\
                 # what the backends did for whom, and what batching and the cache saved\n\
                 TIERGATE_ADMIN_TOKEN={token} {exe} usage --by route,tier,tenant --admin http://{admin}\n\n",
                token = self.token
            );
        }
        out += &format!(
            "# the metrics those requests produced\ncurl -s http://{metrics}/metrics | grep tiergate_requests_total\n\n"
        );
        out
    }
}

/// `word` as one shell word: quoted when it holds anything a shell would split or expand.
fn shell_word(word: &str) -> String {
    match word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@".contains(c))
    {
        true => word.to_owned(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
}

fn model(name: &str, profile: &str) -> ModelSpec {
    ModelSpec::new(name, Profile::named(profile).expect("built-in profile name"))
}

/// The demo's example requests.
pub fn examples() -> Vec<Example> {
    let ex = |title, headers, model, infer, status, tier, reason| Example {
        title,
        headers,
        model,
        infer,
        status,
        tier,
        reason,
    };
    vec![
        ex(
            "a 100 ms budget is served in real time",
            vec![("x-tiergate-budget-ms", "100")],
            "resnet50",
            true,
            200,
            Some("realtime"),
            Some("budget_realtime"),
        ),
        ex(
            "no budget: the route default (150 ms) applies",
            vec![],
            "resnet50",
            true,
            200,
            Some("realtime"),
            Some("budget_realtime"),
        ),
        ex(
            "a 2 s budget calls for the micro-batch tier",
            vec![("x-tiergate-budget-ms", "2000")],
            "resnet50",
            true,
            200,
            Some("micro_batch"),
            Some("budget_micro_batch"),
        ),
        ex(
            "Prefer: respond-async calls for the offline tier",
            vec![("prefer", "respond-async")],
            "resnet50",
            true,
            202,
            Some("offline"),
            Some("prefer_async"),
        ),
        ex(
            "micro_batch flagged off on bert: real time serves",
            vec![("x-tiergate-budget-ms", "2000")],
            "bert",
            true,
            200,
            Some("realtime"),
            Some("micro_batch_off"),
        ),
        ex("an unknown model is a 404", vec![], "nope", true, 404, None, None),
        ex(
            "model metadata comes from the route's backend",
            vec![],
            "resnet50",
            false,
            200,
            None,
            None,
        ),
    ]
}

/// The `curl` line for `ex` against a gateway on `http`.
pub fn curl(http: SocketAddr, ex: &Example) -> String {
    let mut line = String::from("curl -si");
    for (k, v) in &ex.headers {
        line.push_str(&format!(" -H '{k}: {v}'"));
    }
    if ex.infer {
        line.push_str(&format!(
            " -H 'content-type: application/json' -d '{BODY}' http://{http}/v2/models/{}/infer",
            ex.model
        ));
    } else {
        line.push_str(&format!(" http://{http}/v2/models/{}", ex.model));
    }
    line
}

fn request(http: SocketAddr, ex: &Example) -> anyhow::Result<http::Request<Full<Bytes>>> {
    let (method, path, body) = if ex.infer {
        (
            "POST",
            format!("/v2/models/{}/infer", ex.model),
            Bytes::from_static(BODY.as_bytes()),
        )
    } else {
        ("GET", format!("/v2/models/{}", ex.model), Bytes::new())
    };
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("http://{http}{path}"))
        .header("content-type", "application/json");
    for (k, v) in &ex.headers {
        builder = builder.header(*k, *v);
    }
    Ok(builder.body(Full::new(body))?)
}
