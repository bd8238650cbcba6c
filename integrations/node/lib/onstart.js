'use strict';
/**
 * On-start span processor: exports a running tool span at once (end time 0), then
 * refreshes it every `refreshIntervalMs` while it runs.
 *
 * SDKs export a span only when it ends, so a hung tool is never seen; stallwatch's
 * open-span ledger accepts a snapshot of the running span with
 * `end_time_unix_nano = 0` (docs/design.md, "Open spans", wire shape 1). `onStart` only
 * records the span and schedules an export with `setImmediate`; exports are async,
 * bounded in number (`MAX_IN_FLIGHT`) and time (the exporter's `timeoutMillis`), and a
 * record that cannot go out is dropped, never queued without bound.
 *
 * Tool span: `gen_ai.operation.name == "execute_tool"` or
 * `mcp.method.name == "tools/call"`; a span that gains them after start is picked up at
 * the next refresh.
 */

/** Default milliseconds between refreshes of a running tool span. */
const DEFAULT_REFRESH_INTERVAL_MS = 5000;
/** Most exports in flight at once; more are dropped. */
const MAX_IN_FLIGHT = 4;
/** Most start records waiting for the next export; more are dropped. */
const MAX_PENDING_STARTS = 1024;
/** Most running spans tracked (tool spans plus candidates). */
const MAX_TRACKED_SPANS = 4096;

/** True when `attributes` mark a tool execution. */
function isToolSpan(attributes) {
  if (!attributes) return false;
  return attributes['gen_ai.operation.name'] === 'execute_tool' || attributes['mcp.method.name'] === 'tools/call';
}

/** A ReadableSpan copy of a running span with endTime [0, 0], or null if it ended. */
function snapshot(span) {
  if (span.ended) return null;
  const ctx = span.spanContext();
  return {
    name: span.name,
    kind: span.kind,
    spanContext: () => ctx,
    parentSpanContext: span.parentSpanContext,
    startTime: span.startTime,
    endTime: [0, 0],
    status: { ...span.status },
    attributes: { ...span.attributes },
    links: [...(span.links || [])],
    events: [...(span.events || [])],
    duration: [0, 0],
    ended: false,
    resource: span.resource,
    instrumentationScope: span.instrumentationScope,
    droppedAttributesCount: span.droppedAttributesCount || 0,
    droppedEventsCount: span.droppedEventsCount || 0,
    droppedLinksCount: span.droppedLinksCount || 0,
  };
}

/**
 * SpanProcessor for @opentelemetry/sdk-trace-base that exports snapshots (end time 0)
 * of tool spans at start and every `refreshIntervalMs` (> 0) while they run.
 * `exporter` is a SpanExporter (setup() passes an OTLPTraceExporter from
 * @opentelemetry/exporter-trace-otlp-proto with a short timeoutMillis); the processor
 * shuts it down in `shutdown()`. Counters `exported` and `dropped` count snapshots.
 */
class OnStartSpanProcessor {
  constructor(exporter, { refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS } = {}) {
    if (!(refreshIntervalMs > 0)) throw new RangeError(`refreshIntervalMs must be > 0, got ${refreshIntervalMs}`);
    this._exporter = exporter;
    this._tools = new Map();
    this._candidates = new Map();
    this._pending = [];
    this._scheduled = null;
    this._inFlight = 0;
    this._stopped = false;
    this.exported = 0;
    this.dropped = 0;
    this._timer = setInterval(() => this._refresh(), refreshIntervalMs);
    this._timer.unref();
  }

  onStart(span, _parentContext) {
    if (this._stopped) return;
    try {
      const key = span.spanContext().spanId;
      if (isToolSpan(span.attributes)) {
        if (this._tools.size >= MAX_TRACKED_SPANS || this._pending.length >= MAX_PENDING_STARTS) {
          this.dropped += 1;
          return;
        }
        this._tools.set(key, span);
        this._pending.push(span);
        if (!this._scheduled) this._scheduled = setImmediate(() => this._flushStarts());
      } else if (this._candidates.size < MAX_TRACKED_SPANS) {
        this._candidates.set(key, span);
      }
    } catch (_) {
      /* never throw into the tool */
    }
  }

  // A tool span's ended copy goes out at once too: the SDK's batch processor waits
  // seconds, and until the end arrives the watchdog would judge the tool as still open.
  onEnd(span) {
    try {
      const key = span.spanContext().spanId;
      const wasTool = this._tools.delete(key);
      this._candidates.delete(key);
      if (!this._stopped && (wasTool || isToolSpan(span.attributes))) {
        if (this._pending.length >= MAX_PENDING_STARTS) {
          this.dropped += 1;
          return;
        }
        this._pending.push(span);
        if (!this._scheduled) this._scheduled = setImmediate(() => this._flushStarts());
      }
    } catch (_) {
      /* ignore */
    }
  }

  _flushStarts() {
    this._scheduled = null;
    const spans = this._pending;
    this._pending = [];
    this._export(spans);
  }

  _refresh() {
    if (this._stopped) return;
    for (const [key, span] of this._candidates) {
      if (span.ended) {
        this._candidates.delete(key);
      } else if (isToolSpan(span.attributes)) {
        this._candidates.delete(key);
        this._tools.set(key, span);
      }
    }
    this._export([...this._tools.values()]);
  }

  _export(spans) {
    // Ended spans go out as they are; running ones as snapshots with end time 0.
    const snaps = spans.map((s) => (s.ended ? s : snapshot(s))).filter(Boolean);
    if (snaps.length === 0) return;
    if (this._inFlight >= MAX_IN_FLIGHT) {
      this.dropped += snaps.length;
      return;
    }
    this._inFlight += 1;
    let done = false;
    const finish = (result) => {
      if (done) return;
      done = true;
      this._inFlight -= 1;
      if (result && result.code === 0) this.exported += snaps.length;
      else this.dropped += snaps.length;
    };
    try {
      this._exporter.export(snaps, finish);
    } catch (_) {
      finish({ code: 1 });
    }
  }

  forceFlush() {
    return Promise.resolve();
  }

  shutdown() {
    if (this._stopped) return Promise.resolve();
    this._stopped = true;
    clearInterval(this._timer);
    if (this._scheduled) clearImmediate(this._scheduled);
    this._tools.clear();
    this._candidates.clear();
    return Promise.resolve(this._exporter.shutdown()).catch(() => {});
  }
}

module.exports = {
  DEFAULT_REFRESH_INTERVAL_MS,
  MAX_IN_FLIGHT,
  OnStartSpanProcessor,
  isToolSpan,
  snapshot,
};
