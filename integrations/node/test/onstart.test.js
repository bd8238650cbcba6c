'use strict';
// On-start processor and setup(): child runners export to a real OTLP/HTTP protobuf
// receiver (decoded with protobufjs, see helpers.js).
const assert = require('node:assert/strict');
const net = require('node:net');
const path = require('node:path');
const { test } = require('node:test');

const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { OnStartSpanProcessor, isToolSpan } = require('..');
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

const BLOCKED_TOOL = `
const sw = require('./index.js');
const runner = sw.setup({ refreshIntervalMs: Number(process.env.REFRESH_MS) });
runner.heartbeatReady.then(() => {
  sw.withToolSpan('slow_tool', () => {
    console.log('in-tool');
    setInterval(() => {}, 1000);
    return new Promise(() => {}); // never settles
  }, { slaMs: 5000, attributes: { 'mcp.session.id': 's-1' } });
});
`;

test('the start record is exported at once with end time 0', async (t) => {
  const rcv = await startReceiver();
  const dir = shortTmp();
  const child = spawnNode(BLOCKED_TOOL, runnerEnv(rcv.endpoint, dir, { REFRESH_MS: '600000' }));
  t.after(async () => {
    child.kill('SIGKILL');
    await rcv.close();
  });
  await child.waitLine('in-tool');
  const [rec] = await waitUntil(() => rcv.named(TOOL).length > 0 && rcv.named(TOOL), 'start record');
  assert.equal(rec.end, 0n);
  assert.ok(rec.start > 0n);
  assert.equal(rec.attributes['gen_ai.operation.name'], 'execute_tool');
  assert.equal(rec.attributes['gen_ai.tool.name'], 'slow_tool');
  assert.equal(rec.attributes['stallwatch.sla_ms'], 5000);
  assert.equal(rec.attributes['mcp.session.id'], 's-1');
  assert.equal(rec.resource['stallwatch.runner.id'], 'nrt-1');
  assert.equal(rec.resource['service.name'], 'node-runner-under-test');
  assert.equal(rec.resource['process.pid'], child.pid);
  assert.equal(rec.trace_id.length, 32);
  assert.equal(await ping(path.join(dir, 'hb.sock')), 'PONG\n');
});

test('a running tool span is refreshed; the ended span follows', async (t) => {
  const rcv = await startReceiver();
  const dir = shortTmp();
  const child = spawnNode(
    `const sw = require('./index.js');
     const runner = sw.setup({ refreshIntervalMs: 100 });
     let release;
     sw.withToolSpan('slow_tool', () => {
       console.log('in-tool');
       return new Promise((r) => (release = r));
     })
       .then(() => runner.shutdown())
       .then(() => { console.log('done'); process.exit(0); });
     process.on('SIGUSR1', () => release());
     setInterval(() => {}, 1000);`,
    runnerEnv(rcv.endpoint, dir),
  );
  t.after(async () => {
    child.kill('SIGKILL');
    await rcv.close();
  });
  await child.waitLine('in-tool');
  const recs = await waitUntil(() => rcv.named(TOOL).length >= 4 && rcv.named(TOOL), '4 records');
  assert.equal(new Set(recs.map((r) => r.span_id)).size, 1);
  assert.ok(recs.every((r) => r.end === 0n));
  assert.equal(new Set(recs.map((r) => r.start)).size, 1);
  // End the tool: shutdown flushes the BatchSpanProcessor; the ended copy has a real end time.
  child.kill('SIGUSR1');
  await child.waitLine('done');
  // The kit's own ended copy (sent at once) and the batch processor's: one span, one end
  // (stallwatch stores the two copies once).
  const ended = rcv.named(TOOL).filter((r) => r.end !== 0n);
  assert.ok(ended.length >= 1 && ended.length <= 2, `ended copies: ${ended.length}`);
  assert.equal(new Set(ended.map((r) => `${r.span_id}/${r.end}`)).size, 1);
  assert.equal(ended[0].span_id, recs[0].span_id);
  assert.ok(ended[0].end > ended[0].start);
});

test('processor: only tool spans get snapshots; late tool attributes are picked up', async (t) => {
  const rcv = await startReceiver();
  const proc = new OnStartSpanProcessor(new OTLPTraceExporter({ url: `${rcv.endpoint}/v1/traces`, timeoutMillis: 2000 }), {
    refreshIntervalMs: 100,
  });
  const provider = new BasicTracerProvider({ spanProcessors: [proc] });
  t.after(async () => {
    await provider.shutdown();
    await rcv.close();
  });
  const tracer = provider.getTracer('t');
  const plain = tracer.startSpan('plain');
  const mcp = tracer.startSpan('mcp call', { attributes: { 'mcp.method.name': 'tools/call' } });
  const late = tracer.startSpan('late');
  late.setAttribute('gen_ai.operation.name', 'execute_tool');
  await waitUntil(() => rcv.named('mcp call').length > 0, 'mcp start record');
  await waitUntil(() => rcv.named('late').length > 0, 'late tool span via refresh');
  mcp.end();
  late.end();
  const before = rcv.spans.length;
  await new Promise((r) => setTimeout(r, 400));
  plain.end();
  assert.equal(rcv.named('plain').length, 0, 'a non-tool span gets no snapshot');
  // Snapshots while running, then the ended copy at once (not only with the batch).
  const mcpRecs = rcv.named('mcp call');
  assert.ok(mcpRecs.some((r) => r.end === 0n), 'a running snapshot');
  const ended = mcpRecs.filter((r) => r.end !== 0n);
  assert.equal(ended.length, 1, 'the ended copy follows at once');
  assert.ok(ended[0].end > ended[0].start);
  assert.ok(rcv.named('late').some((r) => r.end !== 0n), 'late tool span ended copy');
  // After the tool spans ended, refreshes stop (the ended copies, plus an export that was
  // in flight, may land after `before`).
  assert.ok(rcv.spans.length - before <= 4, `refreshes after end: ${rcv.spans.length - before}`);
  assert.equal(isToolSpan({ 'gen_ai.operation.name': 'chat' }), false);
});

const FAST_TOOLS = `
const sw = require('./index.js');
sw.setup({ refreshIntervalMs: 50, exportTimeoutMillis: 3000 });
const t0 = process.hrtime.bigint();
let chain = Promise.resolve();
for (let i = 0; i < 20; i++) chain = chain.then(() => sw.withToolSpan('quick', async () => {
  await new Promise((r) => setImmediate(r));
}));
chain.then(() => {
  console.log('elapsed ' + Number(process.hrtime.bigint() - t0) / 1e9);
  setInterval(() => {}, 1000);
});
`;

for (const kind of ['closed-port', 'silent-listener']) {
  test(`never blocks when the endpoint is unreachable (${kind})`, async (t) => {
    let endpoint;
    let silent = null;
    if (kind === 'closed-port') {
      const s = net.createServer();
      await new Promise((r) => s.listen(0, '127.0.0.1', r));
      endpoint = `http://127.0.0.1:${s.address().port}`;
      await new Promise((r) => s.close(r));
    } else {
      silent = net.createServer(() => {}); // accepts, never answers
      await new Promise((r) => silent.listen(0, '127.0.0.1', r));
      endpoint = `http://127.0.0.1:${silent.address().port}`;
    }
    const dir = shortTmp();
    const child = spawnNode(FAST_TOOLS, runnerEnv(endpoint, dir));
    t.after(() => {
      child.kill('SIGKILL');
      if (silent) silent.close();
    });
    const elapsed = Number((await child.waitLine('elapsed ')).split(' ')[1]);
    assert.ok(elapsed < 1.5, `20 tool spans took ${elapsed}s`);
    // The heartbeat is served by the kit's worker thread, which may start after the tools ran.
    const sock = path.join(dir, 'hb.sock');
    const answer = await waitUntil(() => ping(sock).catch(() => null), 'the heartbeat socket to listen');
    assert.equal(answer, 'PONG\n');
  });
}

test('setup reads the runner environment', async (t) => {
  const dir = shortTmp();
  const child = spawnNode(
    `const sw = require('./index.js');
     const r = sw.setup();
     r.heartbeatReady.then(() => {
       console.log('report ' + JSON.stringify({
         runnerId: r.runnerId,
         resource: r.resource.attributes,
         again: sw.setup() === r,
         heartbeat: r.heartbeat && r.heartbeat.path,
         checkpoint: sw.checkpointDir(),
       }));
       r.shutdown().then(() => process.exit(0));
     });`,
    runnerEnv('http://127.0.0.1:9', dir, { STALLWATCH_CHECKPOINT_DIR: path.join(dir, 'ck') }),
  );
  t.after(() => child.kill('SIGKILL'));
  const rep = JSON.parse((await child.waitLine('report ')).slice('report '.length));
  assert.equal(rep.runnerId, 'nrt-1');
  assert.equal(rep.resource['stallwatch.runner.id'], 'nrt-1');
  assert.equal(rep.resource['service.name'], 'node-runner-under-test');
  assert.equal(rep.resource['service.instance.id'], 'inst-1');
  assert.equal(rep.resource['process.pid'], child.pid);
  assert.equal(rep.again, true);
  assert.equal(rep.heartbeat, path.join(dir, 'hb.sock'));
  assert.equal(rep.checkpoint, path.join(dir, 'ck'));
  const { code } = await child.exited;
  assert.equal(code, 0);
});

test('setup takes the runner id from STALLWATCH_RUNNER_ID when the resource lacks it', async (t) => {
  const dir = shortTmp();
  const child = spawnNode(
    `const sw = require('./index.js');
     const r = sw.setup({ serviceName: 'svc-arg' });
     r.heartbeatReady.then((hb) => {
       console.log('report ' + JSON.stringify({ runnerId: r.runnerId, service: r.resource.attributes['service.name'], heartbeat: hb }));
       return r.shutdown();
     }).then(() => process.exit(0));
`,
    runnerEnv('http://127.0.0.1:9', dir, {
      OTEL_RESOURCE_ATTRIBUTES: '',
      STALLWATCH_RUNNER_ID: 'nrt-env',
      STALLWATCH_HEARTBEAT_SOCKET: '',
    }),
  );
  t.after(() => child.kill('SIGKILL'));
  const rep = JSON.parse((await child.waitLine('report ')).slice('report '.length));
  assert.equal(rep.runnerId, 'nrt-env');
  assert.equal(rep.service, 'svc-arg');
  assert.equal(rep.heartbeat, null);
  assert.equal((await child.exited).code, 0);
});

test('setup with a heartbeat path over 107 bytes throws a clear error', async () => {
  const dir = shortTmp();
  const long = path.join(dir, 'x'.repeat(120), 'hb.sock');
  const child = spawnNode(
    `const sw = require('./index.js');
     try { sw.setup({ crashHooks: false }); console.log('no error'); }
     catch (err) { console.log('error ' + JSON.stringify({ name: err.name, message: err.message })); }
     process.exit(0);`,
    runnerEnv('http://127.0.0.1:9', dir, { STALLWATCH_HEARTBEAT_SOCKET: long }),
  );
  const rep = JSON.parse((await child.waitLine('error ')).slice('error '.length));
  assert.equal(rep.name, 'SocketPathTooLongError');
  assert.match(rep.message, /107-byte/);
});
