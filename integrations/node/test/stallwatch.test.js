'use strict';
// The kit against the real stallwatch binary with its default heartbeat (2 s interval,
// 5 s timeout): a synchronous Node tool within its SLA is never tripped, one over its SLA
// is. The binary comes from $STALLWATCH_BIN (run-tests.sh sets it, building it when
// needed); without it these tests fail, they never pass silently.
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { test } = require('node:test');

const { shortTmp, waitUntil } = require('./helpers');

const KIT = path.resolve(__dirname, '..');

function getJson(addr, urlPath) {
  return new Promise((resolve, reject) => {
    http
      .get(`http://${addr}${urlPath}`, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => {
          try {
            resolve({ status: res.statusCode, json: JSON.parse(body) });
          } catch (err) {
            reject(new Error(`${urlPath}: ${res.statusCode} ${body}`));
          }
        });
      })
      .on('error', reject);
  });
}

/** Start `stallwatch serve` with `config` (TOML); resolves { ready, incidents(id), stop() }. */
async function startStallwatch(config) {
  const bin = process.env.STALLWATCH_BIN;
  assert.ok(bin && fs.existsSync(bin), `STALLWATCH_BIN must name the stallwatch binary (got ${bin}); run-tests.sh builds it`);
  const dir = shortTmp();
  fs.writeFileSync(path.join(dir, 'stallwatch.toml'), config);
  const child = spawn(
    bin,
    ['serve', '--config', path.join(dir, 'stallwatch.toml'), '--data-dir', path.join(dir, 'data'),
      '--otlp-grpc-listen', '127.0.0.1:0', '--otlp-http-listen', '127.0.0.1:0', '--dashboard-listen', '127.0.0.1:0'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const ready = await waitUntil(() => {
    if (child.exitCode !== null) throw new Error(`stallwatch exited ${child.exitCode}: ${err}`);
    const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
    return line && JSON.parse(line);
  }, 'the ready line', 30000);
  return {
    ready,
    stderr: () => err,
    async incidents(runner) {
      const { status, json } = await getJson(ready.dashboard, `/api/v1/incidents?runner_id=${runner}&limit=200`);
      assert.equal(status, 200);
      return json.items;
    },
    stop() {
      child.kill('SIGTERM');
      return new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
    },
  };
}

function runnerConfig(id, script, env = {}) {
  const envToml = Object.entries(env)
    .map(([k, v]) => `${k} = ${JSON.stringify(v)}`)
    .join(', ');
  return `[watchdog]\ndefault_sla_ms = 60000\n[reaper]\nmax_restarts = 0\n\n[[runner]]\nid = "${id}"\n` +
    `spawn = { argv = [${JSON.stringify(process.execPath)}, "-e", ${JSON.stringify(script)}], env = { ${envToml} } }\n`;
}

// Synchronous tools (busy loops, like a CPU-bound parser): `ms` each, `slaMs` SLA.
const SYNC_TOOLS = `
const fs = require('node:fs');
const sw = require(${JSON.stringify(KIT)});
const runner = sw.setup();
function spin(ms) { const end = Date.now() + ms; while (Date.now() < end) {} }
runner.heartbeatReady.then(async () => {
  await new Promise((r) => setTimeout(r, 2500)); // let a few PINGs land first
  for (const ms of JSON.parse(process.env.TOOLS_MS)) {
    sw.withToolSpan('sync_tool', () => spin(ms), { slaMs: Number(process.env.SLA_MS) });
    await new Promise((r) => setTimeout(r, 20));
  }
  fs.writeFileSync(process.env.DONE_FILE, 'done');
  setInterval(() => {}, 1000);
});
`;

const TRIPS = new Set(['breaker.opened', 'runner.terminated']);

for (const [name, toolsMs, slaMs] of [
  ['three back-to-back 2.5 s synchronous tools with a 4 s SLA', [2500, 2500, 2500], 4000],
  ['a 9 s synchronous tool with a 12 s SLA (longer than the 5 s heartbeat timeout)', [9000], 12000],
]) {
  test(`healthy: ${name} is never tripped`, { timeout: 90000 }, async (t) => {
    const dir = shortTmp();
    const done = path.join(dir, 'done');
    const id = 'node-sync-ok';
    const sw = await startStallwatch(
      runnerConfig(id, SYNC_TOOLS, { TOOLS_MS: JSON.stringify(toolsMs), SLA_MS: String(slaMs), DONE_FILE: done }),
    );
    t.after(() => sw.stop());
    await waitUntil(() => fs.existsSync(done), 'the tools to finish', 60000);
    await new Promise((r) => setTimeout(r, 2500)); // a trip decided at the end would show by now
    const events = (await sw.incidents(id)).map((i) => i.event);
    assert.equal(events.filter((e) => TRIPS.has(e)).length, 0, `tripped: ${events}\n${sw.stderr()}`);
  });
}

test('stalled: a synchronous tool past its 4 s SLA is tripped for its SLA', { timeout: 90000 }, async (t) => {
  const dir = shortTmp();
  const done = path.join(dir, 'done');
  const id = 'node-sync-stuck';
  const sw = await startStallwatch(
    runnerConfig(id, SYNC_TOOLS, { TOOLS_MS: JSON.stringify([600000]), SLA_MS: '4000', DONE_FILE: done }),
  );
  t.after(() => sw.stop());
  const opened = await waitUntil(async () => {
    const list = await sw.incidents(id);
    return list.find((i) => i.event === 'breaker.opened');
  }, 'breaker.opened', 60000);
  const reason = JSON.stringify(opened);
  assert.match(reason, /sync_tool/, `the trip names the tool span: ${reason}`);
  assert.match(reason, /overrun|sla/i, `tripped for its SLA, not for a lost heartbeat: ${reason}`);
  assert.equal(fs.existsSync(done), false);
});
