//! `tiergate health`: a gateway's readiness (or liveness) as an exit code, for container
//! health checks (`HEALTHCHECK`, compose) in an image that has no curl.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;

/// Arguments of `tiergate health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The gateway's HTTP door (`host:port` or a URL).
    #[arg(
        long = "gateway",
        alias = "url",
        default_value = "http://127.0.0.1:8000",
        env = "TIERGATE_URL"
    )]
    url: String,
    /// Ask for liveness (`/v2/health/live`) instead of readiness (`/v2/health/ready`).
    #[arg(long)]
    live: bool,
    /// How long to wait for the answer.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Exits 0 when the gateway answers 200; otherwise prints why and exits 1.
pub async fn run(args: HealthArgs) -> anyhow::Result<ExitCode> {
    let path = if args.live {
        "/v2/health/live"
    } else {
        "/v2/health/ready"
    };
    let exchange = crate::cli::client::request(&args.url, "GET", path, &[], Bytes::new());
    match tokio::time::timeout(args.timeout, exchange).await {
        Ok(Ok((200, _, _))) => {
            let what = if args.live { "live" } else { "ready" };
            println!("ok: {} is {what}", args.url);
            Ok(ExitCode::SUCCESS)
        }
        Ok(Ok((status, _, body))) => {
            eprintln!("{}{path}: {status} {}", args.url, String::from_utf8_lossy(&body).trim());
            Ok(ExitCode::FAILURE)
        }
        Ok(Err(e)) => {
            eprintln!("{}{path}: {e:#}", args.url);
            Ok(ExitCode::FAILURE)
        }
        Err(_) => {
            eprintln!("{}{path}: no answer within {:?}", args.url, args.timeout);
            Ok(ExitCode::FAILURE)
        }
    }
}
