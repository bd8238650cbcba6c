'use strict';
/**
 * Main-thread half of the kit's agent (see ./agent.js): starts the worker, keeps a
 * main-loop tick in shared memory, and `WatchSpanProcessor` hands every tool span to the
 * worker synchronously in `onStart`, before the tool's code runs.
 */
const fs = require('node:fs');
const path = require('node:path');
const { Worker } = require('node:worker_threads');

const { STATE } = require('./agent');
const { HeartbeatError, SocketPathTooLongError, HEARTBEAT_SOCKET_ENV, MAX_SOCKET_PATH_BYTES } = require('./heartbeat');
const { DEFAULT_REFRESH_INTERVAL_MS, isToolSpan } = require('./onstart');
const { trackToolSpan, untrackToolSpan } = require('./stacks');

/** Default per-request timeout (ms) of the snapshot exporter. */
const DEFAULT_EXPORT_TIMEOUT_MS = 2000;
/** Environment variable with stallwatch's heartbeat timeout (ms); default 5000. */
const HEARTBEAT_TIMEOUT_ENV = 'STALLWATCH_HEARTBEAT_TIMEOUT_MS';
/** stallwatch's default heartbeat timeout (ms). */
const DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000;
/** Milliseconds between main-loop ticks written for the worker. */
const TICK_INTERVAL_MS = 250;
/** Most running spans tracked on the main thread (tool spans plus candidates). */
const MAX_TRACKED_SPANS = 4096;

/** stallwatch's heartbeat timeout in ms: $STALLWATCH_HEARTBEAT_TIMEOUT_MS or 5000. */
function heartbeatTimeoutMs() {
  const n = Number.parseInt(process.env[HEARTBEAT_TIMEOUT_ENV] || '', 10);
  return Number.isFinite(n) && n > 0 ? n : DEFAULT_HEARTBEAT_TIMEOUT_MS;
}

// Same checks as HeartbeatServer, done synchronously here so a bad path throws from setup().
function prepareSocketPath(socketPath) {
  const n = Buffer.byteLength(socketPath);
  if (n > MAX_SOCKET_PATH_BYTES) {
    throw new SocketPathTooLongError(
      `heartbeat socket path is ${n} bytes, over the ${MAX_SOCKET_PATH_BYTES}-byte UNIX socket limit: ` +
        `${JSON.stringify(socketPath)} (choose a shorter path, e.g. under /tmp)`,
    );
  }
  const dir = path.dirname(socketPath);
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new HeartbeatError(`cannot create heartbeat socket folder ${JSON.stringify(dir)}: ${err.message}`);
  }
  let st = null;
  try {
    st = fs.lstatSync(socketPath);
  } catch (err) {
    if (err.code !== 'ENOENT') throw new HeartbeatError(`cannot inspect ${JSON.stringify(socketPath)}: ${err.message}`);
  }
  if (st && !st.isSocket()) {
    throw new HeartbeatError(
      `heartbeat socket path ${JSON.stringify(socketPath)} exists and is not a socket; refusing to remove it`,
    );
  }
  // An existing socket is left for the agent: it is stale only if nothing listens on it
  // (agent.js `listen`); a live one belongs to the runner that started this process.
}

function hr(t) {
  return Array.isArray(t) ? [t[0], t[1]] : [0, 0];
}

function ctxOf(c) {
  return c ? { traceId: c.traceId, spanId: c.spanId, traceFlags: c.traceFlags, isRemote: Boolean(c.isRemote) } : undefined;
}

/**
 * The agent: a worker thread serving the heartbeat socket and exporting tool-span
 * snapshots. `options`: socketPath (null: no heartbeat), refreshIntervalMs,
 * exportTimeoutMillis, heartbeatTimeoutMs. `ready` resolves when the socket listens
 * (at once without one) and rejects with HeartbeatError if it cannot.
 */
class Agent {
  constructor({
    socketPath = null,
    refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS,
    exportTimeoutMillis = DEFAULT_EXPORT_TIMEOUT_MS,
    heartbeatTimeoutMs: hbTimeout = heartbeatTimeoutMs(),
  } = {}) {
    if (!(refreshIntervalMs > 0)) throw new RangeError(`refreshIntervalMs must be > 0, got ${refreshIntervalMs}`);
    if (socketPath) prepareSocketPath(socketPath);
    this.socketPath = socketPath;
    this._shared = new SharedArrayBuffer(4 * 4);
    this._state = new Int32Array(this._shared);
    this._tick();
    this._ticker = setInterval(() => this._tick(), TICK_INTERVAL_MS);
    this._ticker.unref();
    this._worker = new Worker(path.join(__dirname, 'agent.js'), {
      workerData: {
        stallwatchAgent: true,
        state: this._shared,
        socketPath,
        refreshIntervalMs,
        exportTimeoutMillis,
        heartbeatTimeoutMs: hbTimeout,
      },
    });
    this._worker.unref();
    this._flushes = new Map();
    this._nextFlush = 1;
    this.ready = new Promise((resolve, reject) => {
      if (!socketPath) resolve(null);
      this._worker.on('message', (msg) => {
        if (msg.type === 'listening') {
          this._served = true;
          resolve(this);
        } else if (msg.type === 'in_use') {
          // A child of the runner that inherited its environment: the runner serves the
          // heartbeat, and this process must not take it over (or remove it at exit).
          this.socketPath = null;
          resolve(null);
        } else if (msg.type === 'error') {
          reject(new HeartbeatError(`cannot serve heartbeat socket ${JSON.stringify(socketPath)}: ${msg.message}`));
        } else if (msg.type === 'flushed') {
          const done = this._flushes.get(msg.id);
          this._flushes.delete(msg.id);
          if (done) done();
        }
      });
      this._worker.on('error', (err) => reject(new HeartbeatError(`stallwatch agent failed: ${err.message}`)));
    });
    this.ready.catch(() => {});
    if (socketPath) {
      // The socket stays (answering BYE after goodbye()) until the very end of the process.
      process.once('exit', () => {
        if (!this._served) return;
        try {
          if (fs.lstatSync(socketPath).isSocket()) fs.unlinkSync(socketPath);
        } catch (_) {
          /* gone */
        }
      });
    }
  }

  /** The heartbeat socket path, or null. */
  get path() {
    return this.socketPath;
  }

  _tick() {
    const now = Date.now();
    Atomics.store(this._state, STATE.TICK_SEC, Math.floor(now / 1000));
    Atomics.store(this._state, STATE.TICK_MS, now % 1000);
  }

  /** Post a message to the worker (enqueued at once, whatever the main loop does). */
  post(msg) {
    try {
      this._worker.postMessage(msg);
    } catch (_) {
      /* a span that cannot be cloned is not watched; never throw into the tool */
    }
  }

  /** Answer BYE on the heartbeat from now on (deliberate exit); the socket keeps serving. */
  goodbye() {
    Atomics.store(this._state, STATE.GOODBYE, 1);
  }

  /** Resolves once the worker has no export in flight (at most `timeoutMs`). */
  flush(timeoutMs = 3000) {
    const id = this._nextFlush++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this._flushes.delete(id);
        resolve();
      }, timeoutMs);
      timer.unref();
      this._flushes.set(id, () => {
        clearTimeout(timer);
        resolve();
      });
      this.post({ type: 'flush', id });
    });
  }

  /** Stop ticking; the worker keeps answering BYE until the process exits. */
  stop() {
    clearInterval(this._ticker);
  }
}

/**
 * SpanProcessor that hands tool spans to the agent: `onStart` posts the span to the
 * worker synchronously (it leaves before the tool's first line runs), `onEnd` posts the
 * ended span (exported at once), and every `refreshIntervalMs` the current attributes
 * of running tool spans are posted (the worker refreshes its copies meanwhile, also
 * while the main thread is blocked). Add it to any @opentelemetry/sdk-trace-base 2.x
 * provider or NodeSDK (`spanProcessors: [..., processor]`).
 */
class WatchSpanProcessor {
  constructor(agent, { refreshIntervalMs = DEFAULT_REFRESH_INTERVAL_MS } = {}) {
    this._agent = agent;
    this._tools = new Map();
    this._candidates = new Map();
    this._resources = new WeakMap();
    this._nextResource = 1;
    this._stopped = false;
    this._timer = setInterval(() => this._refresh(), refreshIntervalMs);
    this._timer.unref();
  }

  _resourceId(resource) {
    if (!resource || typeof resource !== 'object') return 0;
    let id = this._resources.get(resource);
    if (id === undefined) {
      id = this._nextResource++;
      this._resources.set(resource, id);
      let attributes = {};
      try {
        attributes = { ...resource.attributes };
      } catch (_) {
        /* async attributes not settled: send what we have */
      }
      this._agent.post({ type: 'resource', id, attributes, schemaUrl: resource.schemaUrl });
    }
    return id;
  }

  _serialize(span, ended) {
    const ctx = span.spanContext();
    const parent = span.parentSpanContext || (span.parentSpanId ? { traceId: ctx.traceId, spanId: span.parentSpanId, traceFlags: ctx.traceFlags } : undefined);
    const scope = span.instrumentationScope || span.instrumentationLibrary || { name: '' };
    return {
      name: span.name,
      kind: span.kind,
      traceId: ctx.traceId,
      spanId: ctx.spanId,
      traceFlags: ctx.traceFlags,
      parent: ctxOf(parent),
      startTime: hr(span.startTime),
      endTime: hr(span.endTime),
      duration: hr(span.duration),
      ended,
      status: { code: span.status ? span.status.code : 0, message: span.status ? span.status.message : undefined },
      attributes: { ...span.attributes },
      events: (span.events || []).map((e) => ({ name: e.name, time: hr(e.time), attributes: e.attributes ? { ...e.attributes } : {}, droppedAttributesCount: e.droppedAttributesCount || 0 })),
      links: (span.links || []).map((l) => ({ context: ctxOf(l.context), attributes: l.attributes ? { ...l.attributes } : {}, droppedAttributesCount: l.droppedAttributesCount || 0 })),
      resourceId: this._resourceId(span.resource),
      scope: { name: scope.name, version: scope.version, schemaUrl: scope.schemaUrl },
      droppedAttributesCount: span.droppedAttributesCount || 0,
      droppedEventsCount: span.droppedEventsCount || 0,
      droppedLinksCount: span.droppedLinksCount || 0,
    };
  }

  onStart(span, _parentContext) {
    if (this._stopped) return;
    try {
      const key = span.spanContext().spanId;
      if (isToolSpan(span.attributes)) {
        if (this._tools.size >= MAX_TRACKED_SPANS) return;
        this._tools.set(key, span);
        trackToolSpan(span, span.attributes['gen_ai.tool.name']);
        this._agent.post({ type: 'start', span: this._serialize(span, false) });
      } else if (this._candidates.size < MAX_TRACKED_SPANS) {
        this._candidates.set(key, span);
      }
    } catch (_) {
      /* never throw into the tool */
    }
  }

  onEnd(span) {
    try {
      const key = span.spanContext().spanId;
      const wasTool = this._tools.delete(key);
      this._candidates.delete(key);
      untrackToolSpan(span);
      if (!this._stopped && (wasTool || isToolSpan(span.attributes))) {
        this._agent.post({ type: 'end', span: this._serialize(span, true) });
      }
    } catch (_) {
      /* ignore */
    }
  }

  _refresh() {
    if (this._stopped) return;
    for (const [key, span] of this._candidates) {
      if (span.ended) {
        this._candidates.delete(key);
      } else if (isToolSpan(span.attributes)) {
        this._candidates.delete(key);
        this._tools.set(key, span);
        trackToolSpan(span, span.attributes['gen_ai.tool.name']);
        this._agent.post({ type: 'start', span: this._serialize(span, false) });
      }
    }
    for (const span of this._tools.values()) {
      if (!span.ended) this._agent.post({ type: 'update', span: this._serialize(span, false) });
    }
  }

  forceFlush() {
    return this._agent.flush();
  }

  shutdown() {
    if (this._stopped) return Promise.resolve();
    this._stopped = true;
    clearInterval(this._timer);
    for (const span of this._tools.values()) untrackToolSpan(span);
    this._tools.clear();
    this._candidates.clear();
    return this._agent.flush();
  }
}

module.exports = {
  Agent,
  DEFAULT_EXPORT_TIMEOUT_MS,
  DEFAULT_HEARTBEAT_TIMEOUT_MS,
  HEARTBEAT_SOCKET_ENV,
  HEARTBEAT_TIMEOUT_ENV,
  WatchSpanProcessor,
  heartbeatTimeoutMs,
};
