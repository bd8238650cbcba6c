'use strict';
/**
 * The kit's agent: a worker thread that owns the heartbeat socket and the on-start
 * snapshot exporter, so both keep working while the main thread runs a synchronous tool.
 *
 * Why a thread: in Node the heartbeat server, the exporter's HTTP request and the
 * refresh timer all live on an event loop. A synchronous tool blocks the main loop, so
 * a start record sent "on a later turn" never leaves and the PONGs stop: stallwatch then
 * sees "heartbeat lost, no open span" and trips a tool that is within its SLA. Here the
 * main thread hands each tool span to this worker with `postMessage` *before the tool's
 * code runs* (postMessage enqueues on the worker's own loop at once), and this worker
 * exports it, refreshes it and answers the heartbeat.
 *
 * Heartbeat answers (docs/design.md, "Heartbeat details" and "Runner lifecycle"):
 * - `BYE`: the runner is exiting on purpose (`goodbye` flag set by the main thread);
 * - `ERR export_stuck`: a tool span has waited longer than the heartbeat timeout for
 *   its first successful export (stallwatch cannot know the call, so we do not vouch);
 * - `PONG`: the main event loop turned within LOOP_BLOCKED_MS, or it is busy inside a
 *   tool span that stallwatch already knows (its snapshot was accepted): the watchdog
 *   then judges that span against its SLA;
 * - `ERR event_loop_blocked`: the main loop is blocked outside any known tool span.
 *
 * Stall forensics: a `STACKS` request is answered with the main thread's JavaScript
 * stack and the open tool spans' await sites (./mainstack.js), or `ERR <why>`.
 *
 * Messages from the main thread: `{type: 'resource', id, attributes, schemaUrl}`,
 * `{type: 'start' | 'update' | 'end', span}` (span serialized by watch.js), `{type:
 * 'flush', id}`; to it: `{type: 'listening'}`, `{type: 'in_use'}` (the runner serves the
 * socket), `{type: 'error', message}`, `{type:
 * 'flushed', id}`.
 */
const fs = require('node:fs');
const net = require('node:net');
const { parentPort, workerData } = require('node:worker_threads');

const { CLIENT_READ_TIMEOUT_MS, MAX_REQUEST_BYTES, socketIsLive } = require('./heartbeat');
const { mainStackAnswer } = require('./mainstack');

/** Main-loop tick older than this (ms) counts as a blocked loop. */
const LOOP_BLOCKED_MS = 1000;
/** First retry delay (ms) of a failed first snapshot; doubles up to MAX_RETRY_DELAY_MS. */
const FIRST_RETRY_DELAY_MS = 50;
/** Longest delay (ms) between retries of a failed first snapshot. */
const MAX_RETRY_DELAY_MS = 1000;
/** Most exports in flight at once; more are dropped (and retried if first snapshots). */
const MAX_IN_FLIGHT = 4;
/** Most open tool spans tracked. */
const MAX_TRACKED_SPANS = 4096;

/** Indexes into the shared Int32Array `workerData.state`. */
const STATE = { GOODBYE: 0, TICK_SEC: 1, TICK_MS: 2 };

function makeResource(attributes) {
  const resources = require('@opentelemetry/resources');
  if (typeof resources.resourceFromAttributes === 'function') return resources.resourceFromAttributes(attributes);
  return new resources.Resource(attributes); // SDK 1.x
}

function hydrate(s, resource) {
  const ctx = { traceId: s.traceId, spanId: s.spanId, traceFlags: s.traceFlags, isRemote: false };
  const parent = s.parent ? { ...s.parent } : undefined;
  const scope = s.scope || { name: '' };
  return {
    name: s.name,
    kind: s.kind,
    spanContext: () => ctx,
    parentSpanContext: parent,
    parentSpanId: parent ? parent.spanId : undefined, // SDK 1.x transformers
    startTime: s.startTime,
    endTime: s.ended ? s.endTime : [0, 0],
    duration: s.ended ? s.duration : [0, 0],
    ended: s.ended,
    status: s.status,
    attributes: s.attributes,
    links: s.links,
    events: s.events,
    resource,
    instrumentationScope: scope,
    instrumentationLibrary: scope, // SDK 1.x transformers
    droppedAttributesCount: s.droppedAttributesCount || 0,
    droppedEventsCount: s.droppedEventsCount || 0,
    droppedLinksCount: s.droppedLinksCount || 0,
  };
}

class Agent {
  constructor(data) {
    this.state = new Int32Array(data.state);
    this.heartbeatTimeoutMs = data.heartbeatTimeoutMs;
    this.resources = new Map();
    this.open = new Map(); // spanId -> serialized running tool span
    this.unacked = new Map(); // spanId -> Date.now() when its start arrived
    this.inFlight = 0;
    this.retryDelay = FIRST_RETRY_DELAY_MS;
    this.retryTimer = null;
    const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
    this.exporter = new OTLPTraceExporter({ timeoutMillis: data.exportTimeoutMillis });
    this.refreshTimer = setInterval(() => this.export([...this.open.values()]), data.refreshIntervalMs);
    if (data.socketPath) this.listen(data.socketPath);
  }

  // -- main-thread liveness -------------------------------------------------------

  mainTickAgeMs() {
    const sec = Atomics.load(this.state, STATE.TICK_SEC);
    const ms = Atomics.load(this.state, STATE.TICK_MS);
    return Date.now() - (sec * 1000 + ms);
  }

  answer() {
    if (Atomics.load(this.state, STATE.GOODBYE) === 1) return 'BYE\n';
    if (this.exportStuckMs() > this.heartbeatTimeoutMs) return 'ERR export_stuck\n';
    if (this.mainTickAgeMs() <= LOOP_BLOCKED_MS) return 'PONG\n';
    for (const id of this.open.keys()) if (!this.unacked.has(id)) return 'PONG\n';
    return 'ERR event_loop_blocked\n';
  }

  exportStuckMs() {
    let oldest = Infinity;
    for (const t of this.unacked.values()) oldest = Math.min(oldest, t);
    return oldest === Infinity ? 0 : Date.now() - oldest;
  }

  // -- heartbeat --------------------------------------------------------------------

  listen(socketPath) {
    const server = net.createServer((conn) => {
      let data = Buffer.alloc(0);
      conn.setTimeout(CLIENT_READ_TIMEOUT_MS, () => conn.destroy());
      conn.on('error', () => conn.destroy());
      conn.on('data', (chunk) => {
        data = Buffer.concat([data, chunk]);
        const nl = data.indexOf(0x0a);
        if (nl === -1 || nl >= MAX_REQUEST_BYTES) {
          if (data.length >= MAX_REQUEST_BYTES) conn.destroy();
          return;
        }
        let line = data.subarray(0, nl).toString('latin1');
        if (line.endsWith('\r')) line = line.slice(0, -1);
        conn.removeAllListeners('data');
        if (line === 'PING') conn.end(this.answer());
        else if (line === 'STACKS') mainStackAnswer(this.mainTickAgeMs()).then((a) => conn.end(a));
        else conn.destroy();
      });
      conn.on('end', () => conn.destroy());
    });
    // A socket file already there is stale only if nothing listens on it: a live one is
    // the runner's that started this process (a child inherits STALLWATCH_HEARTBEAT_SOCKET),
    // and taking it over cut the runner off its heartbeat, so stallwatch stopped it.
    let retried = false;
    const onError = (err) => {
      if (err.code !== 'EADDRINUSE' || retried) {
        parentPort.postMessage({ type: 'error', message: err.message });
        return;
      }
      retried = true;
      socketIsLive(socketPath).then((live) => {
        if (live) {
          parentPort.postMessage({ type: 'in_use' });
          return;
        }
        try {
          if (fs.lstatSync(socketPath).isSocket()) fs.unlinkSync(socketPath);
        } catch (_) {
          /* gone already */
        }
        server.once('error', onError);
        server.listen(socketPath, onListening);
      });
    };
    const onListening = () => {
      server.removeAllListeners('error');
      server.on('error', () => {});
      try {
        fs.chmodSync(socketPath, 0o600);
      } catch (_) {
        /* best effort */
      }
      parentPort.postMessage({ type: 'listening' });
    };
    server.once('error', onError);
    server.listen(socketPath, onListening);
  }

  // -- spans ------------------------------------------------------------------------

  onMessage(msg) {
    switch (msg.type) {
      case 'resource':
        this.resources.set(msg.id, makeResource(msg.attributes));
        break;
      case 'start':
        if (this.open.size >= MAX_TRACKED_SPANS) return;
        this.open.set(msg.span.spanId, msg.span);
        this.unacked.set(msg.span.spanId, Date.now());
        this.export([msg.span]);
        break;
      case 'update':
        if (this.open.has(msg.span.spanId)) this.open.set(msg.span.spanId, msg.span);
        break;
      case 'end':
        this.open.delete(msg.span.spanId);
        this.unacked.delete(msg.span.spanId);
        this.export([msg.span]);
        break;
      case 'flush':
        this.whenIdle().then(() => parentPort.postMessage({ type: 'flushed', id: msg.id }));
        break;
      default:
        break;
    }
  }

  whenIdle() {
    return new Promise((resolve) => {
      const check = () => (this.inFlight === 0 ? resolve() : setTimeout(check, 10));
      check();
    });
  }

  export(spans) {
    if (spans.length === 0) return;
    const ids = spans.filter((s) => !s.ended).map((s) => s.spanId);
    if (this.inFlight >= MAX_IN_FLIGHT) {
      this.failed(ids);
      return;
    }
    const batch = spans.map((s) => hydrate(s, this.resources.get(s.resourceId) || makeResource({})));
    this.inFlight += 1;
    let done = false;
    const finish = (result) => {
      if (done) return;
      done = true;
      this.inFlight -= 1;
      if (result && result.code === 0) {
        for (const id of ids) this.unacked.delete(id);
        if (this.unacked.size === 0) this.retryDelay = FIRST_RETRY_DELAY_MS;
      } else {
        this.failed(ids);
      }
    };
    try {
      this.exporter.export(batch, finish);
    } catch (_) {
      finish({ code: 1 });
    }
  }

  // A first snapshot that did not go out is retried at once (short backoff), not only
  // at the next refresh, so a transient fault does not delay the watchdog.
  failed(ids) {
    if (!ids.some((id) => this.unacked.has(id)) || this.retryTimer) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      const again = [...this.unacked.keys()].map((id) => this.open.get(id)).filter(Boolean);
      this.export(again);
    }, this.retryDelay);
    this.retryDelay = Math.min(this.retryDelay * 2, MAX_RETRY_DELAY_MS);
  }
}

if (parentPort && workerData && workerData.stallwatchAgent) {
  const agent = new Agent(workerData);
  parentPort.on('message', (msg) => agent.onMessage(msg));
}

module.exports = { FIRST_RETRY_DELAY_MS, LOOP_BLOCKED_MS, MAX_RETRY_DELAY_MS, STATE };
