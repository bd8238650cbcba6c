'use strict';
// index.d.ts type-checks against a consumer (test/types/consumer.ts) under --strict,
// and a wrong use is rejected (so the check is real).
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');

const TSC = path.join(__dirname, '..', 'node_modules', 'typescript', 'bin', 'tsc');
const ARGS = ['--noEmit', '--strict', '--module', 'commonjs', '--moduleResolution', 'node', '--target', 'es2022', '--types', 'node'];

function tsc(file) {
  return spawnSync(process.execPath, [TSC, ...ARGS, file], { cwd: path.join(__dirname, '..'), encoding: 'utf8' });
}

test('index.d.ts type-checks for a consumer', () => {
  const r = tsc(path.join(__dirname, 'types', 'consumer.ts'));
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

test('a wrong use of the types is rejected', (t) => {
  const dir = fs.mkdtempSync(path.join(__dirname, 'types', 'tmp-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'bad.ts');
  fs.writeFileSync(file, "import sw = require('../../../index');\nconst n: number = sw.checkpointDir();\nexport { n };\n");
  const r = tsc(file);
  assert.notEqual(r.status, 0);
  assert.match(r.stdout, /TS2322/);
});
