'use strict';
const assert = require('node:assert/strict');
const { test } = require('node:test');

const { spawnNode } = require('./helpers');

async function crashLine(code) {
  const child = spawnNode(`require('./index.js').installCrashHooks();\n${code}`);
  const { code: exitCode } = await child.exited;
  await new Promise((r) => setImmediate(r));
  const lines = child.stderrText.split('\n').filter((l) => l.trim() !== '');
  return { exitCode, lines };
}

test('unhandled rejection writes one JSON line and exits 101', async () => {
  const { exitCode, lines } = await crashLine(`Promise.reject(new Error('boom-rejected'));`);
  assert.equal(exitCode, 101);
  assert.equal(lines.length, 1, lines.join('\n'));
  const rec = JSON.parse(lines[0]);
  assert.equal(rec.event, 'runner.crashed');
  assert.equal(rec.kind, 'unhandledRejection');
  assert.equal(rec.message, 'boom-rejected');
  assert.match(rec.stack, /boom-rejected/);
});

test('unhandled rejection with a non-Error reason', async () => {
  const { exitCode, lines } = await crashLine(`Promise.reject('plain reason');`);
  assert.equal(exitCode, 101);
  assert.equal(lines.length, 1);
  const rec = JSON.parse(lines[0]);
  assert.equal(rec.kind, 'unhandledRejection');
  assert.equal(rec.message, 'plain reason');
  assert.equal(rec.stack, null);
});

test('uncaught exception writes one JSON line and exits 101', async () => {
  const { exitCode, lines } = await crashLine(`setTimeout(() => { throw new TypeError('boom-thrown'); }, 10);`);
  assert.equal(exitCode, 101);
  assert.equal(lines.length, 1, lines.join('\n'));
  const rec = JSON.parse(lines[0]);
  assert.equal(rec.event, 'runner.crashed');
  assert.equal(rec.kind, 'uncaughtException');
  assert.equal(rec.message, 'boom-thrown');
  assert.match(rec.stack, /TypeError: boom-thrown/);
});

test('without the hooks Node exits 1 (the hooks make the difference)', async () => {
  const child = spawnNode(`Promise.reject(new Error('x'));`);
  const { code } = await child.exited;
  assert.equal(code, 1);
});
