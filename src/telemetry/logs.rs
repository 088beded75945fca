//! Log set-up for the `tiergate` command: one subscriber for the process, its lines on
//! stderr in the configured format, and the span exporter beside them when one is set.
//!
//! Called once at start, before any request; nothing here is on the request path.

use tracing_subscriber::filter::{filter_fn, FilterExt as _};
use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

use super::Exporter;
use crate::config::{Config, LogFormat};

/// A layer of the process's subscriber.
type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Installs the process's subscriber: logs to stderr in `config.log.format` at
/// `config.log.level` (or `RUST_LOG`); a request's `served` line carries its
/// `request_id` and `trace_id` as fields. With `trace.otlp_endpoint` set, spans are also
/// exported: keep the returned exporter alive while serving. Must be called inside the
/// tokio runtime the exporter's connection will live on; an error says which setting is
/// wrong.
pub fn init(config: &Config) -> Result<Option<Exporter>, String> {
    // Each layer has its own filter, so a span no layer wants is never made: with no
    // exporter, a request's spans cost nothing.
    let level = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level))
    };
    let logged = || level().and(filter_fn(super::logged));
    let mut layers: Vec<Boxed> = Vec::new();
    layers.push(match config.log.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(logged())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(logged())
            .boxed(),
    });
    let exporter = match super::layer(&config.trace)? {
        Some((layer, exporter)) => {
            layers.push(layer.with_filter(level()).boxed());
            Some(exporter)
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("logs are already set up: {e}"))?;
    Ok(exporter)
}
