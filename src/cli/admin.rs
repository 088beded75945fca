//! `tiergate flags`, `tiergate policy diff|apply|history|rollback` and `tiergate
//! explain`: the admin API from the command line.
//!
//! Every command talks to a running gateway's admin API (`--admin`, default
//! `http://127.0.0.1:8003`, or `TIERGATE_ADMIN_URL`) with a bearer token from
//! `--token-file` / `TIERGATE_ADMIN_TOKEN_FILE` or `TIERGATE_ADMIN_TOKEN`, and sends
//! `$USER` as the actor the audit log records beside the token's name.
//!
//! Exit codes: 0 done; 1 the gateway refused (invalid policy, stale version, no such
//! route or version); 2 bad command line; 3 authentication failed; 4 the admin API
//! could not be reached or failed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Exit code: the gateway refused the request.
const REFUSED: u8 = 1;
/// Exit code: the token was missing or wrong.
const UNAUTHENTICATED: u8 = 3;
/// Exit code: the admin API could not be reached or failed.
pub const UNREACHABLE: u8 = 4;

/// The admin API could not be reached (exit code [`UNREACHABLE`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(String);

/// Where the admin API is and how to authenticate.
#[derive(Debug, Args)]
pub struct Admin {
    /// The admin API's address (`host:port` or a URL).
    #[arg(long = "admin", default_value = "http://127.0.0.1:8003", env = "TIERGATE_ADMIN_URL")]
    url: String,
    /// A file holding the bearer token (its first line); else TIERGATE_ADMIN_TOKEN_FILE
    /// names one, else TIERGATE_ADMIN_TOKEN holds the token itself.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// Options of commands that change the policy.
#[derive(Debug, Args)]
pub struct Write {
    /// Apply nothing: show the diff and which requests would be served differently.
    #[arg(long)]
    dry_run: bool,
    /// Only if the route (or policy) still has this ETag (as printed by `flags get`).
    #[arg(long)]
    if_match: Option<String>,
}

impl Write {
    /// Whether nothing is to be applied.
    pub(crate) fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The same options with the dry run already in the path (for a path that carries
    /// other query parameters).
    pub(crate) fn applied(&self) -> Write {
        Write {
            dry_run: false,
            if_match: self.if_match.clone(),
        }
    }
}

/// `tiergate flags` subcommands.
#[derive(Debug, Subcommand)]
pub enum FlagsCommand {
    /// Show a route's flags, or every route's when none is named.
    Get {
        /// The route.
        route: Option<String>,
        #[command(flatten)]
        admin: Admin,
    },
    /// Set one flag: realtime, micro_batch, offline, shadow or cache to on/off, or micro_batch_percent to 0-100.
    Set {
        /// The route.
        route: String,
        /// realtime, micro_batch, offline, shadow, cache or micro_batch_percent.
        flag: String,
        /// on, off, true, false, or a percent.
        value: String,
        #[command(flatten)]
        write: Write,
        #[command(flatten)]
        admin: Admin,
    },
}

/// `tiergate policy` subcommands that talk to the admin API.
#[derive(Debug, Subcommand)]
pub enum PolicyOps {
    /// Show what applying FILE would change (the diff and the decisions), without applying it.
    Diff {
        /// A policy file; it replaces (or adds) the file of the same name.
        file: PathBuf,
        #[command(flatten)]
        admin: Admin,
    },
    /// Apply FILE to the running policy: validated whole, written back, versioned, audited.
    Apply {
        /// A policy file; it replaces (or adds) the file of the same name.
        file: PathBuf,
        #[command(flatten)]
        write: Write,
        #[command(flatten)]
        admin: Admin,
    },
    /// List the kept policy versions: when, who, what (or, with --diff, what one changed).
    History {
        /// Show what this version changed: its diff against the version before it.
        #[arg(long, value_name = "VERSION")]
        diff: Option<u64>,
        #[command(flatten)]
        admin: Admin,
    },
    /// Restore an earlier version's files (as a new version).
    Rollback {
        /// The version to restore.
        #[arg(value_name = "VERSION")]
        to: u64,
        #[command(flatten)]
        write: Write,
        #[command(flatten)]
        admin: Admin,
    },
}

/// `tiergate explain`: the decision for a described request, nothing sent.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The KServe model the request calls.
    #[arg(long, group = "target")]
    model: Option<String>,
    /// The JSON path the request calls.
    #[arg(long, group = "target")]
    path: Option<String>,
    /// The route, by name.
    #[arg(long, group = "target")]
    route: Option<String>,
    /// The budget in milliseconds (x-tiergate-budget-ms).
    #[arg(long)]
    budget_ms: Option<u64>,
    /// A request header as NAME:VALUE (repeatable), e.g. `prefer:respond-async`.
    #[arg(long = "header")]
    headers: Vec<String>,
    /// The request id (a rollout key when the rollout header is absent).
    #[arg(long)]
    id: Option<String>,
    /// The request's body (a JSON file), to say whether the route's cache holds its answer.
    #[arg(long)]
    body: Option<std::path::PathBuf>,
    /// Print the admin API's JSON answer as it is.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    admin: Admin,
}

/// Runs `tiergate flags ...`.
pub async fn flags(command: FlagsCommand) -> anyhow::Result<ExitCode> {
    match command {
        FlagsCommand::Get { route: None, admin } => {
            let (status, body) = call(&admin, "GET", "/admin/routes", None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            println!("policy version {}", body["version"]);
            for r in body["routes"].as_array().into_iter().flatten() {
                println!("{:<24} {}", text(&r["name"]), flag_line(&r["flags"]));
            }
            Ok(ExitCode::SUCCESS)
        }
        FlagsCommand::Get {
            route: Some(name),
            admin,
        } => {
            let (status, body) = call(&admin, "GET", &format!("/admin/routes/{name}"), None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            println!(
                "route {} (file {}, policy version {})",
                name,
                text(&body["file"]),
                body["policy_version"]
            );
            for (flag, value) in body["effective"]["flags"].as_object().into_iter().flatten() {
                println!("  {flag} = {value}");
            }
            println!("etag {}", text(&body["etag"]));
            Ok(ExitCode::SUCCESS)
        }
        FlagsCommand::Set {
            route,
            flag,
            value,
            write,
            admin,
        } => {
            let value = match (flag.as_str(), value.to_ascii_lowercase().as_str()) {
                ("micro_batch_percent", v) => match v.trim_end_matches('%').parse::<u8>() {
                    Ok(n) if n <= 100 => json!(n),
                    _ => return Ok(usage(&format!("micro_batch_percent is 0 to 100, not {value:?}"))),
                },
                (_, "on" | "true") => json!(true),
                (_, "off" | "false") => json!(false),
                _ => return Ok(usage(&format!("{flag} is on or off (true or false), not {value:?}"))),
            };
            let path = format!("/admin/routes/{route}/flags/{flag}");
            change(&admin, &write, "PUT", &path, value.to_string().into()).await
        }
    }
}

/// Runs the admin side of `tiergate policy ...`.
pub async fn policy(command: PolicyOps) -> anyhow::Result<ExitCode> {
    match command {
        PolicyOps::Diff { file, admin } => {
            let write = Write {
                dry_run: true,
                if_match: None,
            };
            apply(&admin, &write, &file).await
        }
        PolicyOps::Apply { file, write, admin } => apply(&admin, &write, &file).await,
        PolicyOps::History {
            diff: Some(version),
            admin,
        } => {
            let path = format!("/admin/policy/history/{version}/diff");
            let (status, body) = call(&admin, "GET", &path, None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            match body["before"].as_u64() {
                Some(before) => println!("version {version}, against version {before}:"),
                None => println!("version {version}, the first kept:"),
            }
            print!("{}", text(&body["diff"]));
            Ok(ExitCode::SUCCESS)
        }
        PolicyOps::History { diff: None, admin } => {
            let (status, body) = call(&admin, "GET", "/admin/policy/history", None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            let current = body["current"].as_u64();
            for v in body["versions"].as_array().into_iter().flatten() {
                let mark = if v["version"].as_u64() == current { "*" } else { " " };
                println!(
                    "{mark} {:>6}  {}  {:<28} {:<12} {} file(s)",
                    v["version"],
                    text(&v["time"]),
                    text(&v["who"]),
                    text(&v["action"]),
                    v["files"].as_array().map(|f| f.len()).unwrap_or(0)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyOps::Rollback { to, write, admin } => {
            let body = json!({ "version": to }).to_string();
            change(&admin, &write, "POST", "/admin/policy/rollback", body.into()).await
        }
    }
}

/// A command line the gateway would refuse anyway: said, exit code 2.
fn usage(why: &str) -> ExitCode {
    eprintln!("tiergate: {why}");
    ExitCode::from(2)
}

/// Runs `tiergate explain ...`.
pub async fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    if args.model.is_none() && args.path.is_none() && args.route.is_none() {
        return Ok(usage(
            "name the request to explain: --model NAME (a KServe model), --path PATH (a JSON route's) or --route NAME",
        ));
    }
    let mut headers = serde_json::Map::new();
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("--header {h:?}: write it as NAME:VALUE"))?;
        headers.insert(name.trim().to_owned(), json!(value.trim()));
    }
    let request_body = match &args.body {
        None => Value::Null,
        Some(file) => {
            let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
            serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", file.display()))?
        }
    };
    let body = json!({
        "model": args.model, "path": args.path, "route": args.route,
        "budget_ms": args.budget_ms, "headers": headers, "id": args.id, "body": request_body,
    });
    let body: serde_json::Map<String, Value> = body
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let bytes = Value::Object(body).to_string().into();
    let (status, answer) = call(&args.admin, "POST", "/admin/explain", None, bytes).await?;
    if status != 200 {
        return Ok(failed(status, &answer));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "route {} (policy version {})",
        text(&answer["route"]),
        answer["policy_version"]
    );
    println!("  {}", result_line(&answer["result"]));
    if matches!(text(&answer["result"]["reason"]).as_str(), "no_tier" | "route_disabled") {
        let off: Vec<&str> = ["realtime", "micro_batch", "offline"]
            .into_iter()
            .filter(|f| answer["flags"][*f].as_bool() == Some(false))
            .collect();
        println!(
            "  the flags that are off: {} (tiergate flags set {} FLAG on)",
            off.join(", "),
            text(&answer["route"])
        );
    }
    if !answer["outside_rollout"].is_null() {
        let percent = &answer["rollout"]["percent"];
        println!(
            "  outside the {percent}% rollout: {}",
            result_line(&answer["outside_rollout"])
        );
    }
    if let Some(batch) = answer["micro_batch"].as_object() {
        match batch.get("learned_cost").filter(|c| !c.is_null()) {
            Some(c) => println!(
                "  batch pool: {} rows queued; learned cost {:.2} ms + {:.3} ms/row ({} batches), a full batch of {} ~ {:.1} ms",
                batch["queued_rows"], num(&c["fixed_ms"]), num(&c["per_row_ms"]), c["samples"], batch["max_batch"], num(&c["full_batch_ms"])
            ),
            None => println!("  batch pool: {} rows queued; cost not learned yet", batch["queued_rows"]),
        }
        if let Some(one) = batch.get("one_row_ms").and_then(|v| v.as_f64()) {
            println!("  one row alone, as the usage ledger prices it: {one:.2} ms");
        }
        if batch["batch_limit"] != batch["max_batch"] {
            println!(
                "  batch size: at most {} of max_batch {} rows, after batches that went wrong (grows back as batches succeed)",
                batch["batch_limit"], batch["max_batch"]
            );
        }
    }
    if let Some(cache) = answer["cache"].as_object() {
        println!("  cache: would {}", text(&cache["would"]));
    }
    println!("  (nothing was sent)");
    Ok(ExitCode::SUCCESS)
}

async fn apply(admin: &Admin, write: &Write, file: &std::path::Path) -> anyhow::Result<ExitCode> {
    let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", file.display()))?;
    change(admin, write, "PUT", &format!("/admin/policy/files/{name}"), text.into()).await
}

/// Sends a change and prints its outcome: versions, diff, decisions.
pub(crate) async fn change(
    admin: &Admin,
    write: &Write,
    method: &str,
    path: &str,
    body: Bytes,
) -> anyhow::Result<ExitCode> {
    let path = if write.dry_run {
        format!("{path}?dry_run=true")
    } else {
        path.to_owned()
    };
    let (status, out) = call(admin, method, &path, write.if_match.as_deref(), body).await?;
    if status != 200 {
        return Ok(failed(status, &out));
    }
    let (before, after) = (&out["version_before"], &out["version_after"]);
    match (out["dry_run"].as_bool(), out["changed"].as_bool()) {
        (_, Some(false)) => println!("no change (policy version {before})"),
        (Some(true), _) => println!("dry run: nothing applied (policy version {before})"),
        _ => println!("applied: policy version {before} -> {after}"),
    }
    if out["gate"]["met"].as_bool() == Some(false) {
        let unmet: Vec<String> = out["gate"]["unmet"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        println!("gate not met: {}", unmet.join("; "));
    }
    print!("{}", text(&out["diff"]));
    let decisions = out["decisions"].as_array().cloned().unwrap_or_default();
    if !decisions.is_empty() {
        println!("requests served differently:");
    }
    for d in decisions {
        println!(
            "  [{}] {}: {} -> {}",
            text(&d["route"]),
            text(&d["request"]),
            text(&d["before"]),
            text(&d["after"])
        );
    }
    if !text(&out["etag"]).is_empty() {
        println!("etag {}", text(&out["etag"]));
    }
    Ok(ExitCode::SUCCESS)
}

/// One authenticated call to the admin API: status and JSON body.
pub(crate) async fn call(
    admin: &Admin,
    method: &str,
    path: &str,
    if_match: Option<&str>,
    body: Bytes,
) -> anyhow::Result<(u16, Value)> {
    let token = token(admin)?;
    let auth = format!("Bearer {token}");
    let user = std::env::var("USER").unwrap_or_default();
    let mut headers = vec![("authorization", auth.as_str()), ("content-type", "application/json")];
    if !user.is_empty() {
        headers.push(("x-tiergate-actor", user.as_str()));
    }
    if let Some(etag) = if_match {
        headers.push(("if-match", etag));
    }
    let (status, _, bytes) = crate::cli::client::request(&admin.url, method, path, &headers, body)
        .await
        .map_err(|e| Unreachable(format!("cannot reach the admin API at {}: {e:#}", admin.url)))?;
    let value: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({"error": {"message": String::from_utf8_lossy(&bytes)}}));
    // The admin API's errors are objects with a code; a data port's are KServe's plain
    // strings, and anything else is not tiergate at all.
    let not_admin = value["error"].is_string() || (status >= 400 && value["error"]["code"].as_str().is_none());
    if not_admin {
        let said = value["error"]
            .as_str()
            .or_else(|| value["error"]["message"].as_str())
            .unwrap_or_default();
        return Err(Unreachable(format!(
            "{} is not tiergate's admin API (it answered {status}: {}); the admin API listens on listen.admin, \
             by default http://127.0.0.1:8003: point --admin or TIERGATE_ADMIN_URL there",
            admin.url,
            said.trim()
        ))
        .into());
    }
    Ok((status, value))
}

fn token(admin: &Admin) -> anyhow::Result<String> {
    // An empty variable is as good as none (it is not a usage error).
    let from_env = std::env::var_os("TIERGATE_ADMIN_TOKEN_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if let Some(file) = admin.token_file.as_ref().or(from_env.as_ref()) {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read the token file {}", file.display()))?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap_or("");
        // A server-side token file line is `name:token`; the client needs the token.
        return Ok(line.rsplit_once(':').map_or(line, |(_, t)| t).trim().to_owned());
    }
    Ok(std::env::var("TIERGATE_ADMIN_TOKEN").unwrap_or_default())
}

/// Prints why the admin API refused and picks the exit code.
pub(crate) fn failed(status: u16, body: &Value) -> ExitCode {
    let error = &body["error"];
    eprintln!(
        "tiergate: {status} {}: {}",
        text(&error["code"]),
        text(&error["message"])
    );
    for p in error["problems"].as_array().into_iter().flatten() {
        eprintln!("  {}: {}: {}", text(&p["file"]), text(&p["path"]), text(&p["message"]));
    }
    if status == 401 {
        eprintln!(
            "  give the admin token: --token-file FILE, or TIERGATE_ADMIN_TOKEN_FILE=FILE, or TIERGATE_ADMIN_TOKEN=TOKEN"
        );
    }
    ExitCode::from(match status {
        401 => UNAUTHENTICATED,
        400..=499 => REFUSED,
        _ => UNREACHABLE,
    })
}

fn flag_line(flags: &Value) -> String {
    let on = |k: &str| if flags[k].as_bool() == Some(true) { "on" } else { "off" };
    format!(
        "realtime={} micro_batch={} ({}%) offline={} shadow={} cache={}",
        on("realtime"),
        on("micro_batch"),
        flags["micro_batch_percent"],
        on("offline"),
        on("shadow"),
        on("cache")
    )
}

fn result_line(result: &Value) -> String {
    match text(&result["status"]).as_str() {
        "served" => format!(
            "tier {} (reason {}), budget {} ms from {}",
            text(&result["tier"]),
            text(&result["reason"]),
            num(&result["budget_ms"]),
            text(&result["budget_source"])
        ),
        _ => format!("refused with 503 (reason {})", text(&result["reason"])),
    }
}

pub(crate) fn text(v: &Value) -> String {
    v.as_str().map_or_else(
        || if v.is_null() { String::new() } else { v.to_string() },
        str::to_owned,
    )
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}
