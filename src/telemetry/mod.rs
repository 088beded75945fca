//! OTLP trace export: off unless `trace.otlp_endpoint` is set, and free when off.
//!
//! Beside the request path. When on, a `tracing-opentelemetry` layer turns the
//! gateway's spans (`request` → `classify` → `tier` → `backend`) into OpenTelemetry
//! spans, exported in batches over OTLP/gRPC by a background worker; a full export
//! queue drops spans rather than slow a request. [`adopt`] ties a request's span to
//! the client's trace; [`span_id`] reads a span's exported id for `traceparent`.
//! When off, both return `None` after one atomic load. [`logs`] sets up the process's
//! log lines and installs the exporter beside them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider};
use opentelemetry::Context;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::Trace;

pub mod logs;

/// Whether an exporting layer is installed.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The span a step runs in, to record fields on, when spans are exported; else a
/// disabled one (recording on it does nothing), without asking the subscriber which
/// span is current (about 90 instructions a time).
pub fn current_span() -> Span {
    match ENABLED.load(Ordering::Acquire) {
        true => Span::current(),
        false => Span::none(),
    }
}

/// The running exporter; flushes what it holds when dropped.
pub struct Exporter(SdkTracerProvider);

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "trace export did not flush at shutdown");
        }
    }
}

/// The layer exporting spans to `settings.otlp_endpoint`, and its exporter (keep it
/// alive while serving), or `None` when no endpoint is set. Must be called inside the
/// tokio runtime the exporter's connection will live on.
pub fn layer<S>(settings: &Trace) -> Result<Option<(impl tracing_subscriber::Layer<S>, Exporter)>, String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if settings.otlp_endpoint.is_empty() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.otlp_endpoint.clone())
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("trace.otlp_endpoint {:?}: {e}", settings.otlp_endpoint))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("tiergate");
    ENABLED.store(true, Ordering::Release);
    Ok(Some((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Exporter(provider),
    )))
}

/// Whether the log lines see `meta`: every event, and every span but a request's own
/// (`request`, and the `classify`, `tier` and `backend` spans inside it). Those are for
/// the exporter: a log layer formats each span's fields as it opens and again as each
/// is recorded, a cost paid on every request for lines that are rarely written. A
/// request's `served` line carries its `request_id`, `trace_id`, `route`, `tier` and
/// `reason` as fields instead; with export off, these spans are never made.
pub fn logged(meta: &tracing::Metadata<'_>) -> bool {
    !(meta.is_span() && meta.target().starts_with("tiergate") && EXPORTED_ONLY.contains(&meta.name()))
}

/// The spans of a request that only the exporter records.
const EXPORTED_ONLY: [&str; 4] = ["request", "classify", "tier", "backend"];

/// Makes `span` (a request's, not yet entered) a child of the client's span `parent` in
/// trace `trace_id` (`sampled` as the client said) and returns the exported trace and
/// span ids, or `None` when export is off.
pub fn adopt(span: &Span, trace_id: u128, parent: Option<u64>, sampled: bool) -> Option<(u128, u64)> {
    if !ENABLED.load(Ordering::Acquire) {
        return None;
    }
    if let Some(parent) = parent {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let remote = SpanContext::new(
            TraceId::from(trace_id),
            SpanId::from(parent),
            flags,
            true,
            TraceState::default(),
        );
        // Fails only when the span is disabled by the log filter; it is then not exported.
        let _ = span.set_parent(Context::new().with_remote_span_context(remote));
    }
    exported(span).map(|context| {
        (
            u128::from_be_bytes(context.trace_id().to_bytes()),
            u64::from_be_bytes(context.span_id().to_bytes()),
        )
    })
}

/// The exported id of `span`, or `None` when export is off (or the span is disabled).
pub fn span_id(span: &Span) -> Option<u64> {
    if !ENABLED.load(Ordering::Acquire) {
        return None;
    }
    exported(span).map(|context| u64::from_be_bytes(context.span_id().to_bytes()))
}

/// Links `span` to `other`'s exported span (a batch to each of its callers); nothing
/// when export is off.
pub fn link(span: &Span, other: &Span) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    if let Some(context) = exported(other) {
        span.add_link(context);
    }
}

/// The exported span context of `span`, when it has a valid one.
fn exported(span: &Span) -> Option<SpanContext> {
    let cx = span.context();
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

/// A log destination a unit test can read back.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Lines {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    use super::Lines;

    #[test]
    fn a_request_s_spans_are_never_made_for_log_lines_alone() {
        let lines = Lines::default();
        let writer = lines.clone();
        let logs = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(tracing_subscriber::filter::filter_fn(super::logged));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(logs), || {
            let request = tracing::info_span!("request", request_id = "r-1");
            assert!(
                request.is_disabled(),
                "no layer wants a request's span, so it is not made"
            );
            let _request = request.enter();
            let backend = tracing::info_span!("backend", endpoint = "10.0.0.1:8000");
            assert!(backend.is_disabled(), "nor the spans inside it");
            let _backend = backend.enter();
            let batch = tracing::info_span!("batch", rows = 3);
            let _batch = batch.enter();
            tracing::warn!(request_id = "r-2", "inside the backend call");
        });
        let text = String::from_utf8(lines.0.lock().expect("not poisoned").clone()).expect("utf-8");
        assert!(text.contains("inside the backend call"), "{text}");
        assert!(
            text.contains("request_id=\"r-2\""),
            "an event's own fields are kept: {text}"
        );
        assert!(
            text.contains("batch{rows=3}"),
            "other spans are still on the line: {text}"
        );
        assert!(!text.contains("request{") && !text.contains("backend{"), "{text}");
    }
}
