'use strict';
/**
 * Stall forensics, agent-thread half (docs/design.md, "Stall forensics"; see ./stacks.js).
 *
 * Answers stallwatch's `STACKS` request on the heartbeat socket with one line
 * `STACKS <json>\n`, json = `{"main": [...], "tools": [...], "loop_blocked_ms": N}`:
 * `main` is the main thread's JavaScript stack (V8 `at fn (file:line:col)` lines,
 * innermost first, without this kit's and the inspector's own frames; empty when no
 * JavaScript was running, i.e. the event loop was free), `tools` the open tool spans'
 * await and start sites (`toolStacks()` of ./stacks.js), and, when the loop was free,
 * `libuv`: what the loop waits on, `[{type, is_active}]` from
 * `process.getActiveResourcesInfo()` (microseconds, unlike a full report; names mapped
 * to the libuv handle types a report uses: `Timeout` is `timer`, ...). Or `ERR <why>\n`.
 *
 * How: an in-process inspector session to the main thread
 * (`inspector.Session#connectToMainThread`, from this worker) sends `Runtime.evaluate`.
 * Node hands such messages to the main isolate with V8's `RequestInterrupt` (and a libuv
 * wake-up), so the expression runs at the busy loop's next interrupt check, on top of its
 * frames: `new Error().stack` names the line the loop is on. No debugger is enabled, no
 * port is opened, nothing is paused. A main thread inside one long native call (no
 * JavaScript running, no interrupt check) is not reached in time: `ERR main_thread_unreachable`.
 */
const path = require('node:path');

/** How long (ms) the main thread gets to run the expression. */
const MAIN_STACK_TIMEOUT_MS = 1500;
/** Most frames of the main stack answered. */
const MAX_FRAMES = 48;
/** Largest answer, bytes of JSON (tool sites are dropped first past it). */
const MAX_ANSWER_BYTES = 60 * 1024;
/** This kit's own folder. */
const KIT_DIR = __dirname + path.sep;

// Node's resource names (`process.getActiveResourcesInfo()`) as the libuv handle types a
// diagnostic report lists; other names are kept as they are.
const HANDLE_TYPES = {
  Timeout: 'timer',
  Immediate: 'check',
  TCPSocketWrap: 'tcp',
  TCPServerWrap: 'tcp',
  PipeWrap: 'pipe',
  PipeServerWrap: 'pipe',
  TTYWrap: 'tty',
  UDPWrap: 'udp',
  ProcessWrap: 'process',
  SignalWrap: 'signal',
  FSEventWrap: 'fs_event',
  StatWatcher: 'fs_poll',
};

// Frames that are not application code: the evaluated script's, Node's, V8 builtins'.
const NOT_APP = /<anonymous>:\d+:\d+\)?$|\(node:|^at node:|\(<anonymous>\)$/;

// Runs on the main thread, inside the interrupt. Restores what it changes.
const EXPRESSION = `(() => {
  const E = Error, limit = E.stackTraceLimit, prepare = E.prepareStackTrace;
  let stack = '';
  try {
    E.stackTraceLimit = ${MAX_FRAMES + 8};
    E.prepareStackTrace = undefined;
    stack = String(new E().stack);
  } finally {
    E.stackTraceLimit = limit;
    E.prepareStackTrace = prepare;
  }
  let tools = [];
  try {
    const f = globalThis[Symbol.for('@stallwatch/runner.toolStacks')];
    if (typeof f === 'function') tools = f();
  } catch (_) {}
  // No application frame: the event loop is free, so the report (what it waits on) is
  // cheap to take here, and no signal is needed for it.
  const kit = ${JSON.stringify(KIT_DIR)};
  const runtime = new RegExp(${JSON.stringify(NOT_APP.source)});
  const app = stack.split(String.fromCharCode(10)).some((l) => {
    l = l.trim();
    return l.startsWith('at ') && !l.includes(kit) && !runtime.test(l);
  });
  let libuv = null;
  if (!app) {
    try {
      const names = ${JSON.stringify(HANDLE_TYPES)};
      libuv = process.getActiveResourcesInfo().map((r) => ({ type: names[r] || r, is_active: true }));
    } catch (_) {}
  }
  return JSON.stringify({ stack, tools, libuv });
})()`;

let session = null;

function connect() {
  if (session) return session;
  const inspector = require('node:inspector');
  const s = new inspector.Session();
  s.connectToMainThread();
  session = s;
  return s;
}

// The expression's own frames (the evaluated script is `<anonymous>` with no file) and
// this kit's.
function isOwnFrame(line) {
  return /^at (?:.* \()?<anonymous>:\d+:\d+\)?$/.test(line) || line.includes(`(${KIT_DIR}`) || line.startsWith(`at ${KIT_DIR}`);
}

// Node's own frames and V8 builtins.
function isRuntimeFrame(line) {
  return /\(node:|^at node:|\(<anonymous>\)$/.test(line);
}

/** The main thread's stack and the tool sites, as the answer line (see the module doc). */
function mainStackAnswer(loopBlockedMs) {
  return new Promise((resolve) => {
    let s;
    try {
      s = connect();
    } catch (err) {
      resolve(`ERR no_inspector ${String(err && err.code ? err.code : 'unavailable')}\n`);
      return;
    }
    let done = false;
    const finish = (line) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(line);
    };
    const timer = setTimeout(() => finish('ERR main_thread_unreachable\n'), MAIN_STACK_TIMEOUT_MS);
    try {
      s.post('Runtime.evaluate', { expression: EXPRESSION, returnByValue: true, silent: true }, (err, res) => {
        if (err || !res || !res.result || typeof res.result.value !== 'string') {
          const ex = res && res.exceptionDetails;
          const why = String((err && err.message) || (ex && ex.exception && ex.exception.description) || (ex && ex.text) || '');
          finish(`ERR evaluate_failed ${why.split('\n')[0].slice(0, 200)}\n`);
          return;
        }
        let v;
        try {
          v = JSON.parse(res.result.value);
        } catch (_) {
          finish('ERR evaluate_failed\n');
          return;
        }
        let main = String(v.stack || '')
          .split('\n')
          .map((l) => l.trim())
          .filter((l) => l.startsWith('at ') && !isOwnFrame(l))
          .slice(0, MAX_FRAMES);
        // Only Node's own frames (a timer or the signal handler of a free loop ran just
        // then): no application code was running.
        if (main.every(isRuntimeFrame)) main = [];
        const answer = { main, tools: Array.isArray(v.tools) ? v.tools : [], loop_blocked_ms: loopBlockedMs };
        if (Array.isArray(v.libuv)) answer.libuv = v.libuv.slice(0, 4096);
        let json = JSON.stringify(answer);
        while (Buffer.byteLength(json) > MAX_ANSWER_BYTES && answer.tools.length > 0) {
          answer.tools.pop();
          json = JSON.stringify(answer);
        }
        finish(`STACKS ${json}\n`);
      });
    } catch (_) {
      finish('ERR evaluate_failed\n');
    }
  });
}

module.exports = { MAIN_STACK_TIMEOUT_MS, mainStackAnswer };
