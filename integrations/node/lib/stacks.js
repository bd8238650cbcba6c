'use strict';
/**
 * Stall forensics, main-thread half (docs/design.md, "Stall forensics"; issue 18).
 *
 * stallwatch gives spawned runners STALLWATCH_STACKS_FILE. `installStacksHook()` turns on
 * `process.report` for SIGUSR2 (the diagnostic report: JavaScript stack, native stack,
 * libuv handles) and then writes the header line
 * `stallwatch-stacks v1 pid=<pid> signal=SIGUSR2 runtime=node report=<abs>[ main_stack=heartbeat]`.
 *
 * Node runs the report from the main event loop, so it is written only while that loop is
 * free, and then it names no frame of the tool: a synchronous busy loop delays it until
 * the loop returns, and a tool awaiting a promise that never settles is not on the stack
 * at all. Two more sources cover those cases; both are read by the kit's agent thread
 * (./agent.js) when stallwatch asks `STACKS` on the heartbeat socket, which is what
 * `main_stack=heartbeat` in the header announces:
 * - the main thread's JavaScript stack, taken by the agent through an in-process
 *   inspector session (`Runtime.evaluate` of `new Error().stack`, which V8 runs as an
 *   interrupt even inside a busy loop);
 * - for each open tool span, where its code last created a promise (the `await` site),
 *   recorded here by a V8 promise hook that is on only while a tool span is open (stack
 *   captures rate-limited: 64 at once, then 1000/s; `await_exact` is false when
 *   the newest promise was not captured), and where the span started. `toolStacks()` (reachable from the inspector as
 *   `globalThis[Symbol.for('@stallwatch/runner.toolStacks')]`) answers them.
 */
const fs = require('node:fs');
const path = require('node:path');

/** Environment variable naming the stall-forensics file (docs/design.md, "Stall forensics"). */
const STACKS_FILE_ENV = 'STALLWATCH_STACKS_FILE';
/**
 * Set to `0` to keep no await sites (no promise hook; the start site is still kept). The
 * hook takes the fast path off every promise made while a tool span is open.
 */
const AWAIT_SITES_ENV = 'STALLWATCH_NODE_AWAIT_SITES';
/** Global symbol under which the inspector finds `toolStacks`. */
const TOOL_STACKS_KEY = Symbol.for('@stallwatch/runner.toolStacks');
/** Most tool spans whose sites are kept. */
const MAX_TOOL_SPANS = 64;
/** Promise-creation sites kept per tool span (newest last). */
const MAX_SITES = 8;
/** Most frames answered per stack. */
const MAX_FRAMES = 48;
/** Promise-creation stacks captured at once (a burst, shared by all open tool spans)... */
const SITE_BURST = 64;
/** ... and per second after it. */
const SITE_RATE_PER_S = 1000;
/** This kit's own folder: its frames are never "the tool's code". */
const KIT_DIR = __dirname + path.sep;

let installed = null;
const open = new Map(); // span -> { name, spanId, traceId, tool, start, sites }
let stopHook = null;
let api = null;

/**
 * Stall-forensics hook: when `file` (default $STALLWATCH_STACKS_FILE) is set, turn on
 * `process.report` for SIGUSR2 (report JSON written to `<file>.report.json`) and then
 * append the header line to `file` (a header always means a handler: SIGUSR2 ends a
 * process that has none). `mainStack`: the heartbeat socket is served, so stallwatch may
 * ask it for the main thread's stack and the tool spans' await sites
 * (`main_stack=heartbeat`). Returns the report path, or null when there is no file.
 */
function installStacksHook(file = process.env[STACKS_FILE_ENV], { mainStack = false } = {}) {
  if (!file) return null;
  if (installed) return installed;
  const report = path.resolve(`${file}.report.json`);
  process.report.directory = path.dirname(report);
  process.report.filename = path.basename(report);
  process.report.signal = 'SIGUSR2';
  process.report.reportOnSignal = true;
  globalThis[TOOL_STACKS_KEY] = toolStacks;
  const extra = mainStack ? ' main_stack=heartbeat' : '';
  fs.appendFileSync(file, `stallwatch-stacks v1 pid=${process.pid} signal=SIGUSR2 runtime=node report=${report}${extra}\n`);
  installed = report;
  return report;
}

/** True once `installStacksHook` has installed the hook. */
function stacksHookInstalled() {
  return installed !== null;
}

// A plain object with a captured (lazily formatted) stack, starting below `above`.
function site(above) {
  const s = {};
  Error.captureStackTrace(s, above);
  return s;
}

// Stack captures left (a token bucket shared by all tool spans; see SITE_BURST).
let tokens = 0;
let refilled = 0;

function onPromiseInit() {
  try {
    // A stack capture costs far more than a promise: at most SITE_BURST at once and
    // SITE_RATE_PER_S after that. A tool that stalls has stopped making promises, so its
    // last one is normally captured; `exact` says whether it was. Checked before the
    // context lookup, so a promise-heavy tool pays little once the bucket is empty.
    const now = performance.now();
    tokens = Math.min(SITE_BURST, tokens + ((now - refilled) * SITE_RATE_PER_S) / 1000);
    refilled = now;
    if (tokens < 1) {
      for (const rec of open.values()) rec.exact = false;
      return;
    }
    const span = api.trace.getSpan(api.context.active());
    const rec = span && open.get(span);
    if (!rec) return;
    tokens -= 1;
    rec.exact = true;
    rec.sites.push(site(onPromiseInit));
    if (rec.sites.length > MAX_SITES) rec.sites.shift();
  } catch (_) {
    /* never throw into the tool */
  }
}

/**
 * Start keeping the sites of tool span `span` (called from the span processor's onStart,
 * so the start site is the tool's caller). No-op unless the hook is installed. The
 * promise hook runs only while at least one tool span is open.
 */
function trackToolSpan(span, toolName) {
  if (!installed || open.size >= MAX_TOOL_SPANS || open.has(span)) return;
  try {
    if (!api) api = require('@opentelemetry/api');
    const ctx = span.spanContext();
    open.set(span, {
      name: span.name,
      tool: toolName,
      spanId: ctx.spanId,
      traceId: ctx.traceId,
      start: site(trackToolSpan),
      sites: [],
      exact: true,
    });
    if (!stopHook && process.env[AWAIT_SITES_ENV] !== '0') {
      tokens = SITE_BURST;
      refilled = performance.now();
      stopHook = require('node:v8').promiseHooks.onInit(onPromiseInit);
    }
  } catch (_) {
    /* no promise hooks: the start site is still kept */
  }
}

/** Forget tool span `span` (onEnd); the promise hook stops with the last one. */
function untrackToolSpan(span) {
  if (!open.delete(span) || open.size > 0 || !stopHook) return;
  try {
    stopHook();
  } catch (_) {
    /* already stopped */
  }
  stopHook = null;
}

function isKit(line) {
  return line.includes(`(${KIT_DIR}`) || line.startsWith(`at ${KIT_DIR}`);
}

// Node's own frames and V8 builtins (`at Promise.then (<anonymous>)`): no file to show.
function isRuntime(line) {
  return /\(node:|^at node:|\(<anonymous>\)$|^at <anonymous>$/.test(line);
}

/** V8 `at ...` lines of a captured stack, without Node's and V8's own frames. */
function lines(captured) {
  const text = captured && typeof captured.stack === 'string' ? captured.stack : '';
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.startsWith('at ') && !isRuntime(l));
}

// The frames shown: without this kit's own, at most MAX_FRAMES.
function shown(ls) {
  return ls.filter((l) => !isKit(l)).slice(0, MAX_FRAMES);
}

/**
 * The await site of a tool span: the newest promise its own code made (innermost frame
 * outside this kit and installed packages), else the newest one with any such frame
 * further out (a promise a library made for it), else none.
 */
function awaitSite(rec) {
  let fallback = [];
  for (let i = rec.sites.length - 1; i >= 0; i--) {
    const ls = lines(rec.sites[i]);
    if (ls.length > 0 && !isKit(ls[0]) && !ls[0].includes('/node_modules/')) return shown(ls);
    if (fallback.length === 0 && ls.some((l) => !isKit(l) && !l.includes('/node_modules/'))) fallback = shown(ls);
  }
  return fallback;
}

/**
 * The open tool spans, each `{span_id, trace_id, name, tool, await, start}`: `await` is
 * the await site (see `awaitSite`; V8 `at fn (file:line:col)` lines, innermost first),
 * `start` where the span started. Called on the main thread by the agent thread through
 * the inspector.
 */
function toolStacks() {
  const out = [];
  for (const rec of open.values()) {
    out.push({
      span_id: rec.spanId,
      trace_id: rec.traceId,
      name: rec.name,
      tool: rec.tool,
      await: awaitSite(rec),
      await_exact: rec.exact,
      start: shown(lines(rec.start)),
    });
  }
  return out;
}

module.exports = { AWAIT_SITES_ENV, STACKS_FILE_ENV, TOOL_STACKS_KEY, installStacksHook, stacksHookInstalled, toolStacks, trackToolSpan, untrackToolSpan };
