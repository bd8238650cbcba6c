'use strict';
// Packaging and the version matrix: the `npm pack` tarball installs from the npm registry
// into a fresh ESM project with the NEWEST OpenTelemetry JS SDK 2.x the kit declares and
// into a fresh CommonJS project with the OLDEST (SDK 2.0.0, exporter 0.200.0; API 1.9.0, the oldest its metrics SDK accepts);
// each ends with ONE copy of @opentelemetry/api, type-checks its import (`import` with
// index.d.mts, `require` with index.d.ts), and runs: its own provider and exporter keep
// working and the kit's tool span reaches an OTLP receiver as an open span.
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');

const { shortTmp, spawnNode, startReceiver, waitUntil } = require('./helpers');

const KIT = path.resolve(__dirname, '..');
const TSC = path.join(KIT, 'node_modules', 'typescript', 'bin', 'tsc');
const TOOL = 'execute_tool packed_tool';

/** The two ends of the matrix (README "Versions"). */
const MATRIX = {
  newest: {
    type: 'module',
    deps: {
      '@opentelemetry/api': '1.9.0',
      '@opentelemetry/sdk-trace-node': '^2.0.0',
      '@opentelemetry/sdk-trace-base': '^2.0.0',
      '@opentelemetry/exporter-trace-otlp-proto': '>=0.200.0 <0.300.0',
    },
  },
  oldest: {
    type: 'commonjs',
    deps: {
      '@opentelemetry/api': '1.9.0',
      '@opentelemetry/sdk-trace-node': '2.0.0',
      '@opentelemetry/sdk-trace-base': '2.0.0',
      '@opentelemetry/resources': '2.0.0',
      '@opentelemetry/exporter-trace-otlp-proto': '0.200.0',
    },
  },
};

const APP_ESM = `
import { attach, withToolSpan } from '@stallwatch/runner';
import sw from '@stallwatch/runner';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
const mine = new InMemorySpanExporter();
const runner = attach();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(mine), runner.spanProcessor] });
provider.register();
await runner.heartbeatReady;
await withToolSpan('packed_tool', () => new Promise((r) => setTimeout(r, 1000)));
await runner.shutdown();
console.log('result ' + JSON.stringify({ same: sw.setup === attach || sw.attach === attach, mine: mine.getFinishedSpans().map((s) => s.name) }));
process.exit(0);
`;

const APP_CJS = `
const sw = require('@stallwatch/runner');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const mine = new InMemorySpanExporter();
const runner = sw.attach();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(mine), runner.spanProcessor] });
provider.register();
runner.heartbeatReady
  .then(() => sw.withToolSpan('packed_tool', () => new Promise((r) => setTimeout(r, 1000))))
  .then(() => runner.shutdown())
  .then(() => {
    console.log('result ' + JSON.stringify({ same: true, mine: mine.getFinishedSpans().map((s) => s.name) }));
    process.exit(0);
  });
`;

const TYPES_ESM = `import { attach, setup, type Runner } from '@stallwatch/runner';\nconst r: Runner = attach();\nconst s: typeof setup = setup;\nexport { r, s };\n`;
const TYPES_CJS = `import sw = require('@stallwatch/runner');\nconst r: sw.Runner = sw.attach();\nexport { r };\n`;

function npm(args, cwd) {
  return execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, encoding: 'utf8' });
}

let tarball = null;
function pack() {
  if (tarball) return tarball;
  const out = shortTmp();
  const name = npm(['pack', '--pack-destination', out], KIT).trim().split('\n').pop();
  tarball = path.join(out, name);
  return tarball;
}

for (const [end, spec] of Object.entries(MATRIX)) {
  test(`npm pack installs into a fresh ${spec.type} project with the ${end} OpenTelemetry SDK`, { timeout: 300000 }, async (t) => {
    const tgz = pack();
    const listed = execFileSync('tar', ['-tzf', tgz], { encoding: 'utf8' });
    for (const f of ['index.js', 'index.mjs', 'index.d.ts', 'index.d.mts', 'lib/agent.js', 'README.md', 'LICENSE']) {
      assert.ok(listed.includes(`package/${f}`), `${f} is in the tarball`);
    }
    const dir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), `swpack-${end}-`));
    t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
    fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `app-${end}`, private: true, type: spec.type, dependencies: spec.deps }));
    npm(['install'], dir);
    npm(['install', tgz], dir);

    // One copy of the API, so the app's spans and the kit's meet.
    const apis = npm(['ls', '@opentelemetry/api', '--all', '--parseable'], dir).trim().split('\n').filter(Boolean);
    assert.equal(new Set(apis).size, 1, `copies of @opentelemetry/api: ${apis.join(', ')}`);
    const version = (p) => JSON.parse(fs.readFileSync(path.join(dir, 'node_modules', p, 'package.json'), 'utf8')).version;
    const sdk = version('@opentelemetry/sdk-trace-node');
    if (end === 'oldest') assert.equal(sdk, '2.0.0');
    t.diagnostic(`${end}: api ${version('@opentelemetry/api')}, sdk-trace-node ${sdk}, exporter ${version('@opentelemetry/exporter-trace-otlp-proto')}`);

    // Types for `import` (index.d.mts) and `require` (index.d.ts) under nodenext resolution.
    const tsFile = path.join(dir, spec.type === 'module' ? 'check.mts' : 'check.cts');
    fs.writeFileSync(tsFile, spec.type === 'module' ? TYPES_ESM : TYPES_CJS);
    const tsArgs = ['--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022', '--skipLibCheck', '--types', 'node', '--typeRoots', path.join(KIT, 'node_modules', '@types'), tsFile];
    execFileSync(process.execPath, [TSC, ...tsArgs], { cwd: dir, encoding: 'utf8' });

    // It runs: the app's exporter gets its span, stallwatch's endpoint gets the open span.
    const rcv = await startReceiver();
    t.after(() => rcv.close());
    const app = path.join(dir, spec.type === 'module' ? 'app.mjs' : 'app.cjs');
    fs.writeFileSync(app, spec.type === 'module' ? APP_ESM : APP_CJS);
    const sock = path.join(shortTmp(), 'hb.sock');
    // `node -e "import(file)"` loads the .mjs and the .cjs app alike.
    const runApp = spawnNode(`import(${JSON.stringify(app)})`, { OTEL_EXPORTER_OTLP_ENDPOINT: rcv.endpoint, STALLWATCH_HEARTBEAT_SOCKET: sock });
    t.after(() => runApp.kill('SIGKILL'));
    const result = JSON.parse((await runApp.waitLine('result ')).slice(7));
    assert.deepEqual(result.mine, [TOOL]);
    assert.equal(result.same, true);
    await waitUntil(() => rcv.named(TOOL).some((r) => r.end === 0n), 'the open span at the receiver');
  });
}
