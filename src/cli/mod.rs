//! The command line's own modules (the binary's, not the library's): one per command,
//! and what they share.
//!
//! The gateway and its companions: `serve` (the gateway), `demo` (a gateway and two
//! simulated pools in one process), `sim` (the simulated model server). Against a
//! running gateway: `admin` (`flags`, `policy diff|apply|history|rollback`, `explain`:
//! the admin API), `policy` (`check` here, the rest through `admin`), `jobs` (the Batch
//! API: submit, status, results, cancel), `shadow` (a route's shadow candidate: report,
//! reset, promote), `cache` (a route's cache: show, invalidate), `usage` (the usage ledger's table), `top` (a live view from
//! the metrics endpoint), `health` (readiness as an exit code), `infer` (one inference
//! over gRPC). `auth` makes API keys; `client` is the one HTTP exchange they share.

pub mod admin;
pub mod auth;
pub mod cache;
pub mod client;
pub mod demo;
pub mod health;
pub mod infer;
pub mod jobs;
pub mod policy;
pub mod serve;
pub mod shadow;
pub mod sim;
pub mod top;
pub mod usage;

/// A multi-threaded runtime with `workers` threads (0: one per core).
pub fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        builder.worker_threads(workers);
    }
    Ok(builder.enable_all().build()?)
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn stopped() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
