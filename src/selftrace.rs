//! `--self-traces`: stallwatch's own `tracing` spans (ingest batches, verdicts,
//! terminations) become OTLP spans of `service.name = "stallwatch"`, stored through the
//! same storage pipeline, so its behaviour shows in its own dashboard.
//!
//! A `tracing_subscriber` layer records each span of a `stallwatch*` target at DEBUG or
//! above: fields become attributes, events inside it become span events, nesting becomes
//! parent/child with one trace per root span. Closed spans go through a bounded channel
//! (a full channel drops and counts; it never blocks the instrumented code) to a task that
//! writes them in batches with `Storage::write_traces`. They do not pass through the
//! collector, so storing them can never produce more self-spans.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::model::{
    now_unix_nano, AnyValue, Event, KeyValue, Resource, ResourceSpans, Scope, ScopeSpans, Span,
    SpanId, TraceBatch, TraceId,
};
use stallwatch_storage::Storage;
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Closed self-spans waiting to be written.
const QUEUE: usize = 4096;
/// How often queued self-spans are written.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Most self-spans written per batch.
const MAX_BATCH: usize = 512;

/// The layer; install it in the subscriber when `--self-traces` is on.
pub struct SelfTraceLayer {
    tx: mpsc::Sender<Span>,
    dropped: Arc<AtomicU64>,
}

/// The receiving side, handed to [`run_writer`] once storage is open.
pub struct SelfTraceSink {
    rx: mpsc::Receiver<Span>,
    dropped: Arc<AtomicU64>,
}

/// Creates the layer and its sink.
pub fn layer() -> (SelfTraceLayer, SelfTraceSink) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        SelfTraceLayer {
            tx,
            dropped: dropped.clone(),
        },
        SelfTraceSink { rx, dropped },
    )
}

struct Building {
    span: Span,
}

struct Fields<'a>(&'a mut Vec<KeyValue>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(KeyValue::new(
            field.name(),
            AnyValue::String(format!("{value:?}")),
        ));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .push(KeyValue::new(field.name(), AnyValue::String(value.into())));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0
            .push(KeyValue::new(field.name(), AnyValue::Int(value)));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        let v = i64::try_from(value)
            .map_or_else(|_| AnyValue::String(value.to_string()), AnyValue::Int);
        self.0.push(KeyValue::new(field.name(), v));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0
            .push(KeyValue::new(field.name(), AnyValue::Double(value)));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0
            .push(KeyValue::new(field.name(), AnyValue::Bool(value)));
    }
}

/// True for what the layer records: spans and events of `stallwatch*` targets at DEBUG or
/// above (per-request spans are DEBUG so they cost nothing unless `--self-traces` is on).
pub fn ours(meta: &tracing::Metadata<'_>) -> bool {
    meta.target().starts_with("stallwatch") && *meta.level() <= Level::DEBUG
}

fn random_nonzero<const N: usize>() -> [u8; N] {
    loop {
        let b: [u8; N] = rand::random();
        if b.iter().any(|x| *x != 0) {
            return b;
        }
    }
}

impl<S> Layer<S> for SelfTraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !ours(attrs.metadata()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        // The nearest recorded ancestor gives the trace and the parent.
        let parent = span.scope().skip(1).find_map(|p| {
            p.extensions()
                .get::<Building>()
                .map(|b| (b.span.trace_id, b.span.span_id))
        });
        let (trace_id, parent_span_id) = match parent {
            Some((t, s)) => (t, Some(s)),
            None => (TraceId(random_nonzero()), None),
        };
        let mut attributes = Vec::new();
        attrs.record(&mut Fields(&mut attributes));
        attributes.push(KeyValue::new(
            "code.namespace",
            AnyValue::String(attrs.metadata().target().into()),
        ));
        let record = Span {
            trace_id,
            span_id: SpanId(random_nonzero()),
            parent_span_id,
            name: attrs.metadata().name().into(),
            kind: 1,
            start_time_unix_nano: now_unix_nano(),
            attributes,
            ..Span::default()
        };
        span.extensions_mut().insert(Building { span: record });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(b) = span.extensions_mut().get_mut::<Building>() {
                values.record(&mut Fields(&mut b.span.attributes));
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if !ours(event.metadata()) {
            return;
        }
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let mut ext = span.extensions_mut();
        let Some(b) = ext.get_mut::<Building>() else {
            return;
        };
        let mut attributes = Vec::new();
        event.record(&mut Fields(&mut attributes));
        let name = attributes
            .iter()
            .position(|kv| kv.key == "message")
            .map(|i| attributes.remove(i))
            .and_then(|kv| kv.value.as_str().map(str::to_string))
            .unwrap_or_else(|| event.metadata().name().to_string());
        if *event.metadata().level() <= Level::WARN {
            b.span.status.code = stallwatch_storage::model::STATUS_ERROR;
            b.span.status.message = name.clone();
        }
        b.span.events.push(Event {
            time_unix_nano: now_unix_nano(),
            name,
            attributes,
            dropped_attributes_count: 0,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(mut b) = span.extensions_mut().remove::<Building>() else {
            return;
        };
        b.span.end_time_unix_nano = now_unix_nano().max(b.span.start_time_unix_nano);
        if self.tx.try_send(b.span).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes queued self-spans every [`FLUSH_EVERY`] until the layer is dropped.
pub async fn run_writer(mut sink: SelfTraceSink, storage: Storage) {
    let resource = Resource {
        attributes: vec![
            KeyValue::new("service.name", AnyValue::String("stallwatch".into())),
            KeyValue::new(
                "service.version",
                AnyValue::String(env!("CARGO_PKG_VERSION").into()),
            ),
            KeyValue::new("process.pid", AnyValue::Int(i64::from(std::process::id()))),
        ],
        ..Resource::default()
    };
    let scope = Scope {
        name: "stallwatch".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Scope::default()
    };
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tick.tick().await;
        let mut spans = Vec::new();
        while spans.len() < MAX_BATCH {
            match sink.rx.try_recv() {
                Ok(s) => spans.push(s),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        let dropped = sink.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::debug!(dropped, "self-trace queue was full; spans dropped");
        }
        if spans.is_empty() {
            continue;
        }
        let batch = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource: resource.clone(),
                scope_spans: vec![ScopeSpans {
                    scope: scope.clone(),
                    spans,
                }],
            }],
        };
        if let Err(e) = storage.write_traces(Arc::new(batch)).await {
            tracing::debug!("self-traces not stored: {e}");
        }
    }
}
