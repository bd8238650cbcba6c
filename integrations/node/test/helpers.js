'use strict';
// Shared test parts: a real OTLP/HTTP protobuf receiver, a PING client, child runners.
// The receiver decodes ExportTraceServiceRequest with protobufjs from an inline subset
// of the OTLP .proto files (field numbers from opentelemetry-proto trace/v1, common/v1).
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const protobuf = require('protobufjs');

const DEADLINE_MS = 20000;

const OTLP_SUBSET = `
syntax = "proto3";
package otlp;
message ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
message ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
message Resource { repeated KeyValue attributes = 1; }
message ScopeSpans { Scope scope = 1; repeated Span spans = 2; }
message Scope { string name = 1; string version = 2; }
message Span {
  bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; bytes parent_span_id = 4;
  string name = 5; int32 kind = 6; fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8;
  repeated KeyValue attributes = 9;
}
message KeyValue { string key = 1; AnyValue value = 2; }
message AnyValue {
  oneof value { string string_value = 1; bool bool_value = 2; int64 int_value = 3; double double_value = 4; }
}
`;
const Request = protobuf.parse(OTLP_SUBSET, { keepCase: true }).root.lookupType('otlp.ExportTraceServiceRequest');

function kvs(list) {
  const out = {};
  for (const kv of list || []) {
    const v = kv.value || {};
    out[kv.key] = v.string_value ?? v.bool_value ?? (v.int_value !== undefined ? Number(v.int_value) : v.double_value);
  }
  return out;
}

/**
 * Start a receiver on 127.0.0.1:0; resolves { endpoint, spans, named(name), failed, close() }.
 * `failFirst`: answer the first N requests with 400 (a fault the exporter does not retry).
 */
function startReceiver({ failFirst = 0 } = {}) {
  const spans = [];
  const stats = { failed: 0 };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (stats.failed < failFirst) {
        stats.failed += 1;
        res.writeHead(400).end('failing on purpose');
        return;
      }
      if (req.url !== '/v1/traces' || !String(req.headers['content-type']).startsWith('application/x-protobuf')) {
        res.writeHead(400).end('bad request');
        return;
      }
      const msg = Request.toObject(Request.decode(Buffer.concat(chunks)), { longs: String, bytes: String, defaults: true });
      for (const rs of msg.resource_spans) {
        const resource = kvs(rs.resource && rs.resource.attributes);
        for (const ss of rs.scope_spans) {
          for (const s of ss.spans) {
            spans.push({
              trace_id: Buffer.from(s.trace_id, 'base64').toString('hex'),
              span_id: Buffer.from(s.span_id, 'base64').toString('hex'),
              name: s.name,
              start: BigInt(s.start_time_unix_nano),
              end: BigInt(s.end_time_unix_nano),
              attributes: kvs(s.attributes),
              resource,
            });
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        endpoint: `http://127.0.0.1:${port}`,
        spans,
        stats,
        named: (name) => spans.filter((s) => s.name === name),
        close: () => new Promise((r) => server.close(() => r())),
      });
    });
  });
}

async function waitUntil(pred, what = 'condition', deadlineMs = DEADLINE_MS) {
  const end = Date.now() + deadlineMs;
  while (Date.now() < end) {
    const v = await pred();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out after ${deadlineMs} ms waiting for ${what}`);
}

/** Connect, write `payload`, resolve with all bytes (as a string) until the server closes. */
function ping(socketPath, payload = 'PING\n', timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const conn = net.createConnection(socketPath);
    let out = '';
    const timer = setTimeout(() => {
      conn.destroy();
      reject(new Error('ping timed out'));
    }, timeoutMs);
    conn.on('connect', () => {
      if (payload) conn.write(payload);
    });
    conn.on('data', (d) => (out += d.toString()));
    conn.on('close', () => {
      clearTimeout(timer);
      resolve(out);
    });
    conn.on('error', (err) => {
      clearTimeout(timer);
      if (err.code === 'ECONNRESET' || err.code === 'EPIPE') resolve(out);
      else reject(err);
    });
  });
}

const tmpDirs = [];
process.on('exit', () => {
  for (const d of tmpDirs) fs.rmSync(d, { recursive: true, force: true });
});

/** A short temporary folder under /tmp (socket paths must stay under 108 bytes). */
function shortTmp() {
  const d = fs.mkdtempSync(path.join('/tmp', 'swnt-'));
  tmpDirs.push(d);
  return d;
}

/** Spawn `node -e code` with extra env; collects stdout lines and stderr. */
function spawnNode(code, env = {}) {
  const child = spawn(process.execPath, ['-e', code], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.lines = [];
  child.stderrText = '';
  let buf = '';
  child.stdout.on('data', (d) => {
    buf += d.toString();
    let i;
    while ((i = buf.indexOf('\n')) !== -1) {
      child.lines.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  });
  child.stderr.on('data', (d) => (child.stderrText += d.toString()));
  child.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  child.waitLine = (prefix) =>
    waitUntil(() => {
      const l = child.lines.find((x) => x.startsWith(prefix));
      if (!l && child.exitCode !== null) {
        throw new Error(`child exited ${child.exitCode} before ${prefix}: ${child.stderrText}`);
      }
      return l;
    }, `child line ${prefix}`);
  return child;
}

module.exports = { DEADLINE_MS, os, ping, shortTmp, spawnNode, startReceiver, waitUntil };
