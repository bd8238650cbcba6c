'use strict';
// The kit's contracts with stallwatch, each with a real child runner and a real OTLP
// receiver: attach to the app's own provider, a synchronous tool keeps its heartbeat and
// its start record, BYE at deliberate exit, a failed first snapshot retried at once,
// ERR export_stuck, and the SIGUSR2 diagnostic report.
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { test } = require('node:test');

const { ping, shortTmp, spawnNode, startReceiver, waitUntil } = require('./helpers');

const TOOL = 'execute_tool slow_tool';

function runnerEnv(endpoint, dir, extra = {}) {
  return {
    OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
    OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
    OTEL_SERVICE_NAME: 'node-runner-under-test',
    OTEL_RESOURCE_ATTRIBUTES: 'stallwatch.runner.id=nrt-1,service.instance.id=inst-1',
    STALLWATCH_HEARTBEAT_SOCKET: path.join(dir, 'hb.sock'),
    ...extra,
  };
}

test('attach: the app keeps its own provider and exporter, and the tool span reaches stallwatch open', async (t) => {
  const rcv = await startReceiver();
  const dir = shortTmp();
  const child = spawnNode(
    `const sw = require('./index.js');
     const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
     const { InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
     const { resourceFromAttributes } = require('@opentelemetry/resources');
     const mine = new InMemorySpanExporter();
     const runner = sw.attach({ refreshIntervalMs: 60000 });
     const provider = new NodeTracerProvider({
       resource: resourceFromAttributes({ 'service.name': 'my-app', 'app.owned': true }),
       spanProcessors: [new SimpleSpanProcessor(mine), runner.spanProcessor],
     });
     provider.register();
     runner.heartbeatReady.then(async () => {
       await sw.withToolSpan('slow_tool', async () => {
         console.log('in-tool');
         await new Promise((r) => setTimeout(r, 1500));
       }, { slaMs: 4000 });
       await runner.shutdown();
       console.log('mine ' + JSON.stringify(mine.getFinishedSpans().map((s) => [s.name, s.spanContext().spanId])));
       process.exit(0);
     });`,
    runnerEnv(rcv.endpoint, dir),
  );
  t.after(async () => {
    child.kill('SIGKILL');
    await rcv.close();
  });
  await child.waitLine('in-tool');
  const open = await waitUntil(() => {
    const o = rcv.named(TOOL).filter((r) => r.end === 0n);
    return o.length > 0 && o;
  }, 'open span at stallwatch');
  assert.equal(open[0].resource['service.name'], 'my-app');
  assert.equal(open[0].resource['app.owned'], true);
  const mine = JSON.parse((await child.waitLine('mine ')).slice(5));
  assert.deepEqual(mine, [[TOOL, open[0].span_id]], "the app's own exporter got its (ended) span");
  assert.equal((await child.exited).code, 0);
});

const SYNC_TOOL = `
const sw = require('./index.js');
const runner = sw.setup({ refreshIntervalMs: 60000 });
function spin(ms) { const end = Date.now() + ms; while (Date.now() < end) {} }
runner.heartbeatReady.then(() => {
  console.log('ready');
  process.stdin.once('data', () => {
    if (process.env.WHERE === 'tool') sw.withToolSpan('slow_tool', () => spin(4000), { slaMs: 10000 });
    else spin(4000);
    console.log('done');
  });
});
`;

// The heartbeat is answered by the kit's worker thread: while the main thread runs a
// synchronous tool that stallwatch already knows, it says PONG (the SLA governs); while
// the main loop is blocked outside any tool span, it does not vouch for the runner.
for (const where of ['tool', 'outside']) {
  test(`synchronous work ${where === 'tool' ? 'inside a known tool span: PONG' : 'outside any tool span: no PONG'}`, async (t) => {
    const rcv = await startReceiver();
    const dir = shortTmp();
    const child = spawnNode(SYNC_TOOL, runnerEnv(rcv.endpoint, dir, { WHERE: where }));
    t.after(async () => {
      child.kill('SIGKILL');
      await rcv.close();
    });
    await child.waitLine('ready');
    const sock = path.join(dir, 'hb.sock');
    assert.equal(await ping(sock), 'PONG\n');
    child.stdin.write('go\n');
    if (where === 'tool') {
      // The start record left before the tool's code ran, although the main loop never turned.
      await waitUntil(() => rcv.named(TOOL).some((r) => r.end === 0n), 'start record during the sync tool', 3500);
    }
    await new Promise((r) => setTimeout(r, 1800)); // main loop blocked for > 1 s now
    const answer = await ping(sock);
    assert.equal(child.lines.includes('done'), false, 'still inside the synchronous work');
    assert.equal(answer, where === 'tool' ? 'PONG\n' : 'ERR event_loop_blocked\n');
    await child.waitLine('done');
    // The loop has turned once 'done' is out; the worker sees it at the loop's next tick,
    // which a loaded machine may delay: PONG again within the deadline, not at once.
    await waitUntil(async () => (await ping(sock)) === 'PONG\n', 'PONG once the loop turns');
  });
}

test('deliberate exit answers BYE (not silence) while exit work runs', async (t) => {
  const rcv = await startReceiver();
  const dir = shortTmp();
  const saved = path.join(dir, 'saved');
  const child = spawnNode(
    `const fs = require('node:fs');
     const sw = require('./index.js');
     const runner = sw.setup();
     runner.heartbeatReady.then(() => {
       console.log('ready');
       process.stdin.once('data', async () => {
         await runner.shutdown();
         console.log('saving');
         const end = Date.now() + 3000; while (Date.now() < end) {} // a 3 s synchronous cache save
         fs.writeFileSync(${JSON.stringify(saved)}, 'ok');
         process.exit(0);
       });
     });`,
    runnerEnv(rcv.endpoint, dir),
  );
  t.after(async () => {
    child.kill('SIGKILL');
    await rcv.close();
  });
  await child.waitLine('ready');
  const sock = path.join(dir, 'hb.sock');
  assert.equal(await ping(sock), 'PONG\n');
  child.stdin.write('go\n');
  await child.waitLine('saving');
  const answers = [];
  for (let i = 0; i < 5; i++) {
    answers.push(await ping(sock));
    await new Promise((r) => setTimeout(r, 300));
  }
  assert.deepEqual(answers, Array(5).fill('BYE\n'));
  assert.equal((await child.exited).code, 0);
  assert.equal(fs.readFileSync(saved, 'utf8'), 'ok', 'the exit work finished');
  assert.equal(fs.existsSync(sock), false, 'the socket is removed at the very end');
});

const HOLD_TOOL = `
const sw = require('./index.js');
const runner = sw.setup({ refreshIntervalMs: 60000, exportTimeoutMillis: Number(process.env.EXPORT_TIMEOUT_MS || 2000) });
runner.heartbeatReady.then(() => {
  console.log('ready');
  process.stdin.once('data', () => {
    sw.withToolSpan('slow_tool', () => { console.log('in-tool'); return new Promise(() => {}); });
  });
  setInterval(() => {}, 1000);
});
`;

test('a failed first snapshot is retried at once, not at the next refresh', async (t) => {
  const rcv = await startReceiver({ failFirst: 2 });
  const dir = shortTmp();
  const child = spawnNode(HOLD_TOOL, runnerEnv(rcv.endpoint, dir));
  t.after(async () => {
    child.kill('SIGKILL');
    await rcv.close();
  });
  await child.waitLine('ready');
  child.stdin.write('go\n');
  await child.waitLine('in-tool');
  const t0 = Date.now();
  await waitUntil(() => rcv.named(TOOL).length > 0, 'the start record after two failures', 10000);
  assert.equal(rcv.stats.failed, 2);
  assert.ok(Date.now() - t0 < 5000, 'retried at once (refresh is 60 s)');
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(rcv.named(TOOL).length, 1, 'no resend after the success');
});

test('the heartbeat says ERR export_stuck while a tool span cannot leave; PONG when exports work', async (t) => {
  const hang = net.createServer(() => {}); // accepts, never answers
  await new Promise((r) => hang.listen(0, '127.0.0.1', r));
  const rcv = await startReceiver();
  const stuckDir = shortTmp();
  const okDir = shortTmp();
  const env = { STALLWATCH_HEARTBEAT_TIMEOUT_MS: '1500', EXPORT_TIMEOUT_MS: '60000' };
  const stuck = spawnNode(HOLD_TOOL, runnerEnv(`http://127.0.0.1:${hang.address().port}`, stuckDir, env));
  const ok = spawnNode(HOLD_TOOL, runnerEnv(rcv.endpoint, okDir, env));
  t.after(async () => {
    stuck.kill('SIGKILL');
    ok.kill('SIGKILL');
    hang.close();
    await rcv.close();
  });
  await stuck.waitLine('ready');
  await ok.waitLine('ready');
  assert.equal(await ping(path.join(stuckDir, 'hb.sock')), 'PONG\n', 'no tool span yet');
  stuck.stdin.write('go\n');
  ok.stdin.write('go\n');
  await stuck.waitLine('in-tool');
  await ok.waitLine('in-tool');
  const answer = await waitUntil(async () => {
    const a = await ping(path.join(stuckDir, 'hb.sock'));
    return a !== 'PONG\n' && a;
  }, 'a non-PONG answer', 10000);
  assert.equal(answer, 'ERR export_stuck\n');
  await waitUntil(() => rcv.named(TOOL).length > 0, 'the healthy runner start record');
  assert.equal(await ping(path.join(okDir, 'hb.sock')), 'PONG\n');
});

// Stall forensics (issue 18): header line + process.report on SIGUSR2.
const STUCK = `
const sw = require('./index.js');
sw.setup({ refreshIntervalMs: 60000 });
function waitsForeverHere() {
  return new Promise(() => {}); // LINE-AWAIT never settles
}
function spinsHere(ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {} // LINE-SPIN
}
console.log('stuck');
if (process.env.HOW === 'promise') {
  setInterval(() => {}, 1000);
  sw.withToolSpan('slow_tool', () => waitsForeverHere());
} else {
  setTimeout(() => sw.withToolSpan('slow_tool', () => spinsHere(Number(process.env.SPIN_MS))), 300);
  setInterval(() => {}, 1000);
}
`;

for (const how of ['promise', 'busy']) {
  test(`SIGUSR2 writes the diagnostic report named in the stacks header (${how})`, async (t) => {
    const rcv = await startReceiver();
    const dir = shortTmp();
    const stacks = path.join(dir, 'stacks.txt');
    const child = spawnNode(STUCK, runnerEnv(rcv.endpoint, dir, { STALLWATCH_STACKS_FILE: stacks, HOW: how, SPIN_MS: '3000' }));
    t.after(async () => {
      child.kill('SIGKILL');
      await rcv.close();
    });
    await child.waitLine('stuck');
    const header = fs.readFileSync(stacks, 'utf8').split('\n')[0];
    const report = path.resolve(`${stacks}.report.json`);
    assert.equal(header, `stallwatch-stacks v1 pid=${child.pid} signal=SIGUSR2 runtime=node report=${report} main_stack=heartbeat`);
    if (how === 'busy') await waitUntil(() => rcv.named(TOOL).length > 0, 'the busy tool started');
    const t0 = Date.now();
    child.kill('SIGUSR2');
    const rep = await waitUntil(() => {
      try {
        return JSON.parse(fs.readFileSync(report, 'utf8'));
      } catch (_) {
        return null;
      }
    }, 'the report file', 15000);
    const waited = Date.now() - t0;
    assert.equal(rep.header.processId, child.pid);
    assert.equal(rep.header.trigger, 'Signal');
    assert.ok(Array.isArray(rep.libuv) && rep.libuv.length > 0, 'libuv handles are listed');
    if (how === 'busy') {
      // Node makes the report on its main event loop: a busy loop delays it until it returns.
      assert.ok(waited >= 1500, `report came after the busy loop returned (${waited} ms)`);
    } else {
      assert.ok(waited < 5000, `a free event loop reports at once (${waited} ms)`);
    }
    assert.equal(child.exitCode, null, 'SIGUSR2 with the hook installed does not kill the runner');
  });
}

// The STACKS answer on the heartbeat socket (main_stack=heartbeat): the busy main thread's
// own line, taken through the inspector while the loop spins; the await site of a tool
// span whose promise never settles.
const lineOf = (marker) => STUCK.split('\n').findIndex((l) => l.includes(marker)) + 1;

for (const how of ['busy', 'promise']) {
  test(`STACKS on the heartbeat socket names the tool's own line (${how})`, async (t) => {
    const rcv = await startReceiver();
    const dir = shortTmp();
    const stacks = path.join(dir, 'stacks.txt');
    const child = spawnNode(STUCK, runnerEnv(rcv.endpoint, dir, { STALLWATCH_STACKS_FILE: stacks, HOW: how, SPIN_MS: '60000' }));
    t.after(async () => {
      child.kill('SIGKILL');
      await rcv.close();
    });
    await child.waitLine('stuck');
    await waitUntil(() => rcv.named(TOOL).length > 0, 'the tool started');
    const sock = path.join(dir, 'hb.sock');
    if (how === 'busy') await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    const out = await ping(sock, 'STACKS\n');
    const took = Date.now() - t0;
    assert.ok(out.startsWith('STACKS {') && out.endsWith('\n'), out);
    const v = JSON.parse(out.slice('STACKS '.length));
    if (how === 'busy') {
      assert.match(v.main[0], new RegExp(`^at spinsHere \\(\\[eval\\]:${lineOf('LINE-SPIN')}:\\d+\\)$`), out);
      assert.ok(v.loop_blocked_ms > 0, out);
      assert.ok(took < 1500, `answered while the loop spins (${took} ms)`);
    } else {
      assert.deepEqual(v.main, [], 'a free loop runs no application code');
      assert.ok(v.libuv.some((h) => h.type === 'timer' && h.is_active), `what the free loop waits on: ${out}`);
      assert.equal(v.tools.length, 1, out);
      assert.equal(v.tools[0].name, TOOL);
      assert.match(v.tools[0].await[0], new RegExp(`^at waitsForeverHere \\(\\[eval\\]:${lineOf('LINE-AWAIT')}:\\d+\\)$`), out);
    }
    assert.ok(!v.tools.some((x) => [...x.await, ...x.start].some((l) => l.includes(path.join(__dirname, '..', 'lib') + path.sep))), `no kit frames: ${out}`);
    assert.equal(child.exitCode, null, 'asking does not end the runner');
    assert.equal(await ping(sock), 'PONG\n', 'the heartbeat still answers');
  });
}
