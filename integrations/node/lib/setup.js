'use strict';
/**
 * One-call setup that points a Node runner's OpenTelemetry SDK at stallwatch, from the
 * environment stallwatch gives spawned runners (docs/design.md, "Interfaces: Runners"):
 * OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES (with
 * stallwatch.runner.id), STALLWATCH_RUNNER_ID, STALLWATCH_HEARTBEAT_SOCKET,
 * STALLWATCH_STACKS_FILE. Two ways: `setup()` creates a NodeTracerProvider (batch
 * processor + OTLP proto exporter + the kit's processor); `attach()` creates only the
 * kit's agent and processor, for an app that builds its own provider or NodeSDK.
 */
const { trace, SpanStatusCode } = require('@opentelemetry/api');

const { installCrashHooks } = require('./crash');
const { HEARTBEAT_SOCKET_ENV } = require('./heartbeat');
const { DEFAULT_REFRESH_INTERVAL_MS } = require('./onstart');
const { STACKS_FILE_ENV, installStacksHook } = require('./stacks');
const { Agent, DEFAULT_EXPORT_TIMEOUT_MS, WatchSpanProcessor } = require('./watch');

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
  const { defaultResource, detectResources, envDetector, resourceFromAttributes } = require('@opentelemetry/resources');
  const resource = defaultResource().merge(detectResources({ detectors: [envDetector] }));
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

function makeRunner({ tracerProvider, resource, agent, processor, owns }) {
  const runner = {
    tracerProvider,
    resource,
    spanProcessor: processor,
    onStart: processor,
    heartbeat: null,
    heartbeatReady: agent.ready.then((a) => (runner.heartbeat = a)),
    runnerId: resource && resource.attributes[RUNNER_ID_ATTR] !== undefined ? String(resource.attributes[RUNNER_ID_ATTR]) : (process.env.STALLWATCH_RUNNER_ID || null),
    closed: false,
    async shutdown() {
      if (runner.closed) return;
      runner.closed = true;
      // Goodbye first: the heartbeat answers BYE (not silence) while exit work runs.
      agent.goodbye();
      try {
        if (owns) await tracerProvider.shutdown();
        else await processor.shutdown();
      } finally {
        agent.stop();
      }
    },
  };
  runner.heartbeatReady.catch((err) => {
    process.stderr.write(`stallwatch: heartbeat not served: ${err.message}\n`);
  });
  return runner;
}

function startAgent({ heartbeat, refreshIntervalMs, exportTimeoutMillis, crashHooks }) {
  const socketPath = heartbeat ? process.env[HEARTBEAT_SOCKET_ENV] || null : null;
  // First, so that a bad socket path throws before anything global is installed.
  const agent = new Agent({ socketPath, refreshIntervalMs, exportTimeoutMillis });
  if (crashHooks) installCrashHooks();
  try {
    installStacksHook(process.env[STACKS_FILE_ENV], { mainStack: Boolean(socketPath) });
  } catch (err) {
    process.stderr.write(`stallwatch: stacks file not usable: ${err.message}\n`);
  }
  return { agent, processor: new WatchSpanProcessor(agent, { refreshIntervalMs }) };
}

/**
 * Wire the SDK to stallwatch; returns the Runner (a second call returns the first one).
 * Options: serviceName, refreshIntervalMs (5000), exportTimeoutMillis (2000),
 * heartbeat (true: serve $STALLWATCH_HEARTBEAT_SOCKET when set; a bad path throws),
 * crashHooks (true), register (true: global provider + context manager),
 * tracerProvider (attach to this SDK 1.x provider, which has addSpanProcessor; SDK 2.x
 * providers take processors only when built: use attach() and pass
 * runner.spanProcessor in `spanProcessors`).
 */
function setup({
  serviceName,
  refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS,
  exportTimeoutMillis = DEFAULT_EXPORT_TIMEOUT_MS,
  heartbeat = true,
  crashHooks = true,
  register = true,
  tracerProvider,
} = {}) {
  if (current && !current.closed) return current;
  if (tracerProvider !== undefined && typeof tracerProvider.addSpanProcessor !== 'function') {
    throw new TypeError(
      'tracerProvider has no addSpanProcessor (OpenTelemetry JS SDK 2.x): use sw.attach() and pass ' +
        'runner.spanProcessor in the spanProcessors option of your NodeTracerProvider or NodeSDK',
    );
  }
  const { agent, processor } = startAgent({ heartbeat, refreshIntervalMs, exportTimeoutMillis, crashHooks });
  if (tracerProvider !== undefined) {
    tracerProvider.addSpanProcessor(processor);
    current = makeRunner({ tracerProvider, resource: tracerProvider.resource, agent, processor, owns: false });
    return current;
  }
  const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
  const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
  const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
  const resource = buildResource(serviceName);
  const provider = new NodeTracerProvider({
    resource,
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter()), processor],
  });
  if (register) provider.register();
  current = makeRunner({ tracerProvider: provider, resource, agent, processor, owns: true });
  return current;
}

/**
 * For an app that builds its own provider or NodeSDK: starts the heartbeat agent and
 * returns a Runner whose `spanProcessor` you add to `spanProcessors`; your exporters,
 * resource and sampler stay yours. `tracerProvider` is null. Same options as setup()
 * except serviceName/register/tracerProvider.
 */
function attach({
  refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS,
  exportTimeoutMillis = DEFAULT_EXPORT_TIMEOUT_MS,
  heartbeat = true,
  crashHooks = true,
} = {}) {
  if (current && !current.closed) return current;
  const { agent, processor } = startAgent({ heartbeat, refreshIntervalMs, exportTimeoutMillis, crashHooks });
  current = makeRunner({ tracerProvider: null, resource: null, agent, processor, owns: false });
  return current;
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

module.exports = {
  DEFAULT_EXPORT_TIMEOUT_MS,
  RUNNER_ID_ATTR,
  STACKS_FILE_ENV,
  attach,
  buildResource,
  checkpointDir,
  installStacksHook,
  setup,
  withToolSpan,
};
