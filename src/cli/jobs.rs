//! `tiergate jobs`: the Batch API from the command line, against a running gateway.
//!
//! `submit FILE.jsonl --endpoint PATH` uploads the file, creates a batch and shows its
//! progress until it ends (or returns at once with `--detach`); `status ID`,
//! `results ID -o FILE` and `cancel ID` take a batch id (`batch_...`) or, for status and
//! cancel, a single async job id (`job_...`). Exit code 0 when done; 2 when the batch
//! completed but some of its requests failed; 1 when it ended without completing
//! (failed validation, expired, cancelled) or the gateway refused or could not be
//! reached, with a message saying which; 130 when interrupted while following (the
//! batch goes on, and the message says how to follow or cancel it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// `tiergate jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Upload a JSONL file of requests and run it as a batch, showing progress.
    Submit(SubmitArgs),
    /// Show a batch (or an async job): a summary, or the gateway's JSON with --json.
    Status {
        /// `batch_...` or `job_...`.
        id: String,
        /// Print the gateway's JSON answer as it is.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        gateway: Gateway,
    },
    /// Download a batch's results (its errors, and a shadow batch's comparison, next to them).
    Results {
        /// `batch_...`.
        id: String,
        /// Where to write the output JSONL; errors go to the same name with `.errors.jsonl`,
        /// a shadow batch's comparison with `.comparison.jsonl`.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        gateway: Gateway,
    },
    /// Cancel a batch (keeping what finished) or an async job.
    Cancel {
        /// `batch_...` or `job_...`.
        id: String,
        #[command(flatten)]
        gateway: Gateway,
    },
}

/// Where the gateway is.
#[derive(Debug, Args)]
pub struct Gateway {
    /// The gateway's HTTP door, `host:port` or a URL (its API key, when it needs one,
    /// from TIERGATE_API_KEY).
    #[arg(long, alias = "url", default_value = "http://127.0.0.1:8000", env = "TIERGATE_URL")]
    gateway: String,
}

/// `tiergate jobs submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The JSONL file: one `{custom_id, method, url, body}` per line.
    file: PathBuf,
    /// The endpoint the batch is for (e.g. /v2/models/resnet50/infer or /v1/embeddings).
    #[arg(long)]
    endpoint: String,
    /// How long the batch may take before unfinished requests expire.
    #[arg(long, default_value = "24h")]
    completion_window: String,
    /// Return once the batch is created instead of following it.
    #[arg(long)]
    detach: bool,
    /// Score every line with the route's shadow candidate too: a comparison file and a
    /// summary beside the output (the route needs a `[shadow]` table, its flag on).
    #[arg(long)]
    shadow: bool,
    /// Keep every answer in the route's cache for TTL (e.g. 24h; at most 7d), so the
    /// same questions asked later are answered from it (the route needs a `[cache]`
    /// table, its flag on).
    #[arg(long, value_name = "TTL")]
    precompute: Option<String>,
    #[command(flatten)]
    gateway: Gateway,
}

/// Runs a `jobs` subcommand.
pub async fn run(command: JobsCommand) -> anyhow::Result<ExitCode> {
    match command {
        JobsCommand::Submit(args) => submit(args).await,
        JobsCommand::Status { id, json, gateway } => {
            let path = item_path(&id)?;
            let (status, body) = call(&gateway.gateway, "GET", &path, None, Bytes::new()).await?;
            if status >= 400 {
                return Ok(refused(&id, status, &body));
            }
            match json {
                true => print_json(&body),
                false => println!("{}", summary(&id, &body)),
            }
            Ok(ExitCode::SUCCESS)
        }
        JobsCommand::Results { id, output, gateway } => results(&gateway.gateway, &id, &output).await,
        JobsCommand::Cancel { id, gateway } => {
            let (method, path) = match id.starts_with("job_") {
                true => ("DELETE", format!("/v1/jobs/{id}")),
                false => ("POST", format!("{}/cancel", item_path(&id)?)),
            };
            let (status, body) = call(&gateway.gateway, method, &path, None, Bytes::new()).await?;
            if status >= 400 {
                return Ok(refused(&id, status, &body));
            }
            let state = body["status"].as_str().unwrap_or_default();
            match state {
                "completed" | "failed" | "expired" | "cancelled" | "succeeded" => {
                    println!("{id} had already ended ({state}): nothing was cancelled")
                }
                _ => println!("{id}: {state} (what finished is kept)"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let url = &args.gateway.gateway;
    let content = std::fs::read(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
    let name = args
        .file
        .file_name()
        .map_or("input.jsonl".into(), |n| n.to_string_lossy().into_owned());
    let (content_type, form) = upload_form(&name, &content);
    let (status, file) = call(url, "POST", "/v1/files", Some(&content_type), form).await?;
    if status >= 400 {
        bail!("upload refused ({status}): {}", error_text(&file));
    }
    let mut create = json!({
        "input_file_id": file["id"],
        "endpoint": args.endpoint,
        "completion_window": args.completion_window,
        "shadow": args.shadow,
    });
    if let Some(ttl) = &args.precompute {
        create["precompute"] = json!({"ttl": ttl});
    }
    let (status, batch) = call(
        url,
        "POST",
        "/v1/batches",
        Some("application/json"),
        create.to_string().into(),
    )
    .await?;
    if status >= 400 {
        bail!("batch refused ({status}): {}", error_text(&batch));
    }
    let id = batch["id"].as_str().unwrap_or_default().to_owned();
    if batch["status"] == "failed" {
        eprintln!("batch {id} failed validation:");
        for e in batch["errors"]["data"].as_array().into_iter().flatten() {
            eprintln!(
                "  line {}: {} ({})",
                e["line"],
                e["message"].as_str().unwrap_or(""),
                e["code"].as_str().unwrap_or("")
            );
        }
        return Ok(ExitCode::from(1));
    }
    println!("{id}");
    if args.detach {
        return Ok(ExitCode::SUCCESS);
    }
    let follow = follow(url, &id);
    tokio::select! {
        ended = follow => ended,
        _ = tokio::signal::ctrl_c() => {
            eprintln!(
                "\ninterrupted: batch {id} goes on running on the gateway; follow it with `tiergate jobs status {id}`, \
                 get its results with `tiergate jobs results {id} -o FILE`, or stop it with `tiergate jobs cancel {id}`"
            );
            Ok(ExitCode::from(INTERRUPTED))
        }
    }
}

/// Exit code of `submit` when the batch completed but some of its requests failed.
pub const SOME_FAILED: u8 = 2;
/// Exit code of `submit` interrupted (Ctrl-C) while following: the batch goes on.
pub const INTERRUPTED: u8 = 130;

/// Follows batch `id` until it ends: a bar with rate and ETA on a terminal, a line each
/// time the counts change (at most every 5 s) otherwise. 0 when every request
/// succeeded, [`SOME_FAILED`] when the batch completed with failures, 1 otherwise.
async fn follow(url: &str, id: &str) -> anyhow::Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(0);
    let terminal = !bar.is_hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template("[{bar:30}] {pos}/{len} (ETA {eta}) {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("#>-"),
    );
    let started = tokio::time::Instant::now();
    let rate = |n: u64| {
        format!(
            "{}/s",
            thousands((n as f64 / started.elapsed().as_secs_f64().max(0.001)) as u64)
        )
    };
    let (mut said, mut last_line) = (None, tokio::time::Instant::now());
    loop {
        let (_, batch) = call(url, "GET", &format!("/v1/batches/{id}"), None, Bytes::new()).await?;
        let counts = &batch["request_counts"];
        let (total, done, failed) = (num(&counts["total"]), num(&counts["completed"]), num(&counts["failed"]));
        let status = batch["status"].as_str().unwrap_or("unknown").to_owned();
        let ended = matches!(status.as_str(), "completed" | "failed" | "expired" | "cancelled");
        bar.set_length(total);
        bar.set_position(done + failed);
        bar.set_message(format!("{}, {failed} failed, {status}", rate(done + failed)));
        let now = (done, failed, status.clone());
        if !terminal && said.as_ref() != Some(&now) && (ended || last_line.elapsed() >= Duration::from_secs(5)) {
            eprintln!("{id}: {}/{total} done, {failed} failed ({status})", done + failed);
            (said, last_line) = (Some(now), tokio::time::Instant::now());
        }
        if ended {
            bar.finish();
            let took = started.elapsed();
            eprintln!(
                "{id}: {status} in {:.1} s, {} of {} requests done ({}), {} failed",
                took.as_secs_f64(),
                thousands(done + failed),
                thousands(total),
                rate(done + failed),
                thousands(failed)
            );
            if let Some(ttl) = batch.pointer("/precompute/ttl").and_then(Value::as_str) {
                eprintln!("precompute: its {done} answers are kept in the route's cache for {ttl}");
            }
            if let Some(summary) = batch.pointer("/shadow/summary").filter(|s| s.is_object()) {
                eprintln!(
                    "shadow: {} of {} lines compared, {} rows of {} within tolerance (agreement {}); \
                     `tiergate jobs results {id} -o FILE` writes the comparison",
                    summary["compared"],
                    summary["lines"],
                    summary["rows_within"],
                    summary["rows"],
                    summary["agreement"]
                );
            }
            return Ok(match (status.as_str(), failed) {
                ("completed", 0) => ExitCode::SUCCESS,
                ("completed", _) => {
                    eprintln!(
                        "{failed} of {total} requests failed: `tiergate jobs results {id} -o FILE` writes their errors"
                    );
                    ExitCode::from(SOME_FAILED)
                }
                _ => ExitCode::from(1),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn results(url: &str, id: &str, output: &Path) -> anyhow::Result<ExitCode> {
    let (status, batch) = call(url, "GET", &item_path(id)?, None, Bytes::new()).await?;
    if status >= 400 {
        bail!("{id}: {}", error_text(&batch));
    }
    let mut wrote = 0;
    for (key, path) in [
        ("/output_file_id", output.to_path_buf()),
        ("/error_file_id", output.with_extension("errors.jsonl")),
        ("/shadow/comparison_file_id", output.with_extension("comparison.jsonl")),
    ] {
        let Some(file) = batch.pointer(key).and_then(Value::as_str) else {
            continue;
        };
        let bytes = fetch(url, &format!("/v1/files/{file}/content")).await?;
        std::fs::write(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!(
            "{}: {} lines",
            path.display(),
            bytes.iter().filter(|b| **b == b'\n').count()
        );
        wrote += 1;
    }
    if wrote == 0 {
        eprintln!("batch {id} has no results yet (status {})", batch["status"]);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `POST /v1/files` form uploading `content` as the Batch API file `name`: its
/// content type and body.
pub(crate) fn upload_form(name: &str, content: &[u8]) -> (String, Bytes) {
    let boundary = format!("tiergate-{:016x}", rand::random::<u64>());
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(content);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), form.into())
}

fn item_path(id: &str) -> anyhow::Result<String> {
    match id.split_once('_').map(|(kind, _)| kind) {
        Some("batch") => Ok(format!("/v1/batches/{id}")),
        Some("job") => Ok(format!("/v1/jobs/{id}")),
        _ => bail!("{id:?} is neither a batch id (batch_...) nor a job id (job_...)"),
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Says on stderr that the gateway refused a request about `id`, and exits 1.
fn refused(id: &str, status: u16, body: &Value) -> ExitCode {
    eprintln!("tiergate jobs: {id}: {status} {}", error_text(body));
    ExitCode::from(1)
}

/// An error answer's message (OpenAI's error object on the Batch API, KServe's string
/// on the jobs endpoint), else the whole answer.
fn error_text(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .or_else(|| v["error"].as_str())
        .map_or_else(|| v.to_string(), str::to_owned)
}

/// A batch's or a job's state, for a person.
fn summary(id: &str, v: &Value) -> String {
    let status = v["status"].as_str().unwrap_or("unknown");
    let counts = &v["request_counts"];
    if counts.is_object() {
        let (total, done, failed) = (num(&counts["total"]), num(&counts["completed"]), num(&counts["failed"]));
        let mut out = format!(
            "{id}: {status}, {} of {} requests done, {} failed; endpoint {}",
            thousands(done + failed),
            thousands(total),
            thousands(failed),
            v["endpoint"].as_str().unwrap_or("-")
        );
        for (what, key) in [("output", "output_file_id"), ("errors", "error_file_id")] {
            if let Some(file) = v[key].as_str() {
                out += &format!("; {what} {file}");
            }
        }
        return out;
    }
    match v["answer"]["status"].as_u64().or_else(|| v["status_code"].as_u64()) {
        Some(code) => format!("{id}: {status}, answered {code}"),
        None => format!("{id}: {status}"),
    }
}

/// A count with thousands separators: `2,341`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// One request to the gateway; its status and JSON body (the text as a string otherwise).
pub(crate) async fn call(
    base: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Bytes,
) -> anyhow::Result<(u16, Value)> {
    let bytes_and_status = request(base, method, path, content_type, body).await?;
    let (status, bytes) = bytes_and_status;
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok((status, value))
}

async fn fetch(base: &str, path: &str) -> anyhow::Result<Bytes> {
    let (status, bytes) = request(base, "GET", path, None, Bytes::new()).await?;
    if status >= 400 {
        bail!("GET {path}: {status} {}", String::from_utf8_lossy(&bytes));
    }
    Ok(bytes)
}

async fn request(
    base: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Bytes,
) -> anyhow::Result<(u16, Bytes)> {
    let mut headers: Vec<(&str, &str)> = content_type.map(|ct| ("content-type", ct)).into_iter().collect();
    // The data plane's API key, when the gateway authenticates (never a flag: it would
    // show in the process list).
    let bearer = std::env::var("TIERGATE_API_KEY")
        .ok()
        .map(|key| format!("Bearer {key}"));
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    let (status, _, bytes) = crate::cli::client::request(base, method, path, &headers, body)
        .await
        .with_context(|| format!("cannot reach the gateway at {base}"))?;
    Ok((status, bytes))
}
