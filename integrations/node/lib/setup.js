'use strict';
/**
 * One-call setup that points a Node runner's OpenTelemetry SDK at stallwatch, from the
 * environment stallwatch gives spawned runners (DESIGN.md, "Interfaces: Runners"):
 * OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES (with
 * stallwatch.runner.id), STALLWATCH_RUNNER_ID, STALLWATCH_HEARTBEAT_SOCKET.
 */
const { trace, SpanStatusCode } = require('@opentelemetry/api');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { defaultResource, detectResources, envDetector, resourceFromAttributes } = require('@opentelemetry/resources');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');

const { installCrashHooks } = require('./crash');
const { serveHeartbeat } = require('./heartbeat');
const { DEFAULT_REFRESH_INTERVAL_MS, OnStartSpanProcessor } = require('./onstart');

/** Default per-request timeout (ms) of the on-start snapshot exporter. */
const DEFAULT_EXPORT_TIMEOUT_MS = 2000;
/** Resource attribute that ties spans to a runner. */
const RUNNER_ID_ATTR = 'stallwatch.runner.id';
/** Instrumentation scope name of spans made by this kit. */
const TRACER_NAME = '@stallwatch/runner';

/**
 * The runner's resource: SDK defaults + OTEL_RESOURCE_ATTRIBUTES + OTEL_SERVICE_NAME
 * (`serviceName` wins when given) + process.pid, and stallwatch.runner.id from
 * STALLWATCH_RUNNER_ID when the resource attributes lack it.
 */
function buildResource(serviceName) {
  let resource = defaultResource().merge(detectResources({ detectors: [envDetector] }));
  const extra = { 'process.pid': process.pid };
  if (serviceName) extra['service.name'] = serviceName;
  const runnerId = process.env.STALLWATCH_RUNNER_ID;
  if (runnerId && resource.attributes[RUNNER_ID_ATTR] === undefined) extra[RUNNER_ID_ATTR] = runnerId;
  return resource.merge(resourceFromAttributes(extra));
}

/** `$STALLWATCH_CHECKPOINT_DIR`, or null when unset or empty. */
function checkpointDir() {
  return process.env.STALLWATCH_CHECKPOINT_DIR || null;
}

let current = null;

/**
 * Wire the SDK to stallwatch; returns the Runner (a second call returns the first one).
 * Options: serviceName, refreshIntervalMs (5000), exportTimeoutMillis (2000),
 * heartbeat (true: serve $STALLWATCH_HEARTBEAT_SOCKET when set; a bad path throws),
 * crashHooks (true), register (true: global provider + context manager).
 */
function setup({
  serviceName,
  refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS,
  exportTimeoutMillis = DEFAULT_EXPORT_TIMEOUT_MS,
  heartbeat = true,
  crashHooks = true,
  register = true,
} = {}) {
  if (current && !current.closed) return current;
  // First, so that a bad socket path throws before anything global is installed.
  const hb = heartbeat ? serveHeartbeat() : null;
  if (crashHooks) installCrashHooks();
  const resource = buildResource(serviceName);
  const onStart = new OnStartSpanProcessor(new OTLPTraceExporter({ timeoutMillis: exportTimeoutMillis }), {
    refreshIntervalMs,
  });
  const tracerProvider = new NodeTracerProvider({
    resource,
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter()), onStart],
  });
  if (register) tracerProvider.register();
  const runner = {
    tracerProvider,
    resource,
    onStart,
    heartbeat: null,
    heartbeatReady: hb ? hb.then((server) => (runner.heartbeat = server)) : Promise.resolve(null),
    runnerId: resource.attributes[RUNNER_ID_ATTR] ?? null,
    closed: false,
    async shutdown() {
      if (runner.closed) return;
      runner.closed = true;
      const server = await runner.heartbeatReady.catch(() => null);
      if (server) await server.close();
      await tracerProvider.shutdown();
    },
  };
  runner.heartbeatReady.catch((err) => {
    process.stderr.write(`stallwatch: heartbeat not served: ${err.message}\n`);
  });
  current = runner;
  return runner;
}

/**
 * Run `fn(span)` inside a tool span `execute_tool {name}` with
 * gen_ai.operation.name=execute_tool and gen_ai.tool.name=name (plus `attributes`, and
 * stallwatch.sla_ms from `slaMs`). Works for sync and async `fn`; an error is recorded,
 * the span ends with status ERROR, and the error is rethrown.
 */
function withToolSpan(name, fn, { attributes = {}, slaMs } = {}) {
  const attrs = { ...attributes, 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name };
  if (slaMs !== undefined) attrs['stallwatch.sla_ms'] = Math.trunc(slaMs);
  const tracer = trace.getTracer(TRACER_NAME);
  return tracer.startActiveSpan(`execute_tool ${name}`, { attributes: attrs }, (span) => {
    const fail = (err) => {
      span.recordException(err);
      span.setStatus({ code: SpanStatusCode.ERROR, message: err && err.message });
      span.end();
      throw err;
    };
    let out;
    try {
      out = fn(span);
    } catch (err) {
      fail(err);
    }
    if (out && typeof out.then === 'function') {
      return out.then((v) => {
        span.end();
        return v;
      }, fail);
    }
    span.end();
    return out;
  });
}

module.exports = { DEFAULT_EXPORT_TIMEOUT_MS, RUNNER_ID_ATTR, buildResource, checkpointDir, setup, withToolSpan };
