'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { test } = require('node:test');

const { HeartbeatError, HeartbeatServer, SocketPathTooLongError } = require('..');
const { ping, shortTmp, spawnNode } = require('./helpers');

test('a runner waiting on a pending promise answers PONG', async (t) => {
  const dir = shortTmp();
  const sock = path.join(dir, 'hb.sock');
  const child = spawnNode(
    `const { serveHeartbeat } = require('./index.js');
     serveHeartbeat().then(() => { console.log('ready'); setInterval(() => {}, 1000); });`,
    { STALLWATCH_HEARTBEAT_SOCKET: sock },
  );
  t.after(() => child.kill('SIGKILL'));
  await child.waitLine('ready');
  for (let i = 0; i < 5; i++) assert.equal(await ping(sock), 'PONG\n');
  assert.equal(child.exitCode, null);
});

test('a runner whose event loop is blocked gives no PONG (Node semantics)', async (t) => {
  const dir = shortTmp();
  const sock = path.join(dir, 'hb.sock');
  const child = spawnNode(
    `const { serveHeartbeat } = require('./index.js');
     serveHeartbeat().then(() => { console.log('ready'); setImmediate(() => { for (;;) {} }); });`,
    { STALLWATCH_HEARTBEAT_SOCKET: sock },
  );
  t.after(() => child.kill('SIGKILL'));
  await child.waitLine('ready');
  await assert.rejects(ping(sock, 'PING\n', 1500), /timed out/);
});

test('garbage gets no PONG and the server keeps serving', async (t) => {
  const sock = path.join(shortTmp(), 'hb.sock');
  const server = await new HeartbeatServer(sock).start();
  t.after(() => server.close());
  assert.equal(await ping(sock, 'HELLO\n'), '');
  assert.equal(await ping(sock, 'PINGPONG\n'), '');
  assert.equal(await ping(sock, 'P'.repeat(70)), '');
  assert.equal(await ping(sock, 'x'.repeat(70) + '\n'), '');
  assert.equal(server.pongs, 0);
  assert.equal(await ping(sock, 'PING\n'), 'PONG\n');
  assert.equal(server.pongs, 1);
});

test('a PING split across writes is answered', async (t) => {
  const sock = path.join(shortTmp(), 'hb.sock');
  const server = await new HeartbeatServer(sock).start();
  t.after(() => server.close());
  const got = await new Promise((resolve, reject) => {
    const c = net.createConnection(sock, () => {
      c.write('PI');
      setTimeout(() => c.write('NG\n'), 50);
    });
    let out = '';
    c.on('data', (d) => (out += d));
    c.on('close', () => resolve(out));
    c.on('error', reject);
  });
  assert.equal(got, 'PONG\n');
});

test('a stale socket file is replaced; close removes the socket', async () => {
  const dir = shortTmp();
  const sock = path.join(dir, 'hb.sock');
  // A real socket file that nobody listens on: bind in a child and SIGKILL it.
  const child = spawnNode(
    `require('node:net').createServer().listen(${JSON.stringify(sock)}, () => console.log('bound'));`,
  );
  await child.waitLine('bound');
  child.kill('SIGKILL');
  await child.exited;
  assert.ok(fs.lstatSync(sock).isSocket());
  await assert.rejects(ping(sock), /ECONNREFUSED/);
  const server = await new HeartbeatServer(sock).start();
  assert.equal(await ping(sock), 'PONG\n');
  assert.equal(fs.statSync(sock).mode & 0o777, 0o600);
  await server.close();
  assert.equal(fs.existsSync(sock), false);
});

test('a child of the runner that sets the kit up never takes the runner\'s socket', async (t) => {
  // A helper process inherits STALLWATCH_HEARTBEAT_SOCKET: its setup() unlinked the runner's
  // live socket and bound its own, then removed it (or said BYE) at exit, so stallwatch
  // stopped the healthy runner. Now the child does not serve it and the runner answers on.
  const sock = path.join(shortTmp(), 'hb.sock');
  const server = await new HeartbeatServer(sock).start();
  t.after(() => server.close());
  for (const code of [
    `const sw = require('./index.js');
     const runner = sw.setup({ exporter: false });
     runner.heartbeatReady.then((r) => { console.log('served ' + (r !== null)); runner.shutdown().then(() => process.exit(0)); });`,
    `const { serveHeartbeat } = require('./index.js');
     serveHeartbeat().then(() => console.log('served true'), (e) => console.log('served ' + e.name));`,
  ]) {
    const child = spawnNode(code, { STALLWATCH_HEARTBEAT_SOCKET: sock });
    t.after(() => child.kill('SIGKILL'));
    const line = await child.waitLine('served ');
    assert.match(line, /^served (false|SocketInUseError)$/);
    await child.exited;
    assert.ok(fs.existsSync(sock), 'the child removed the runner\'s socket');
    assert.equal(await ping(sock), 'PONG\n');
  }
  await assert.rejects(new HeartbeatServer(sock).start(), (e) => e.name === 'SocketInUseError');
  assert.equal(await ping(sock), 'PONG\n');
});

test('a regular file at the path is refused and kept', () => {
  const p = path.join(shortTmp(), 'hb.sock');
  fs.writeFileSync(p, 'user data');
  assert.throws(() => new HeartbeatServer(p).start(), (err) => err instanceof HeartbeatError && /not a socket/.test(err.message));
  assert.equal(fs.readFileSync(p, 'utf8'), 'user data');
});

test('the parent folder is created', async (t) => {
  const sock = path.join(shortTmp(), 'run', 'nested', 'hb.sock');
  const server = await new HeartbeatServer(sock).start();
  t.after(() => server.close());
  assert.equal(await ping(sock), 'PONG\n');
});

test('a path over 107 bytes raises a clear error', () => {
  const dir = shortTmp();
  const long = path.join(dir, 'd'.repeat(60), 's'.repeat(60) + '.sock');
  const n = Buffer.byteLength(long);
  assert.ok(n > 107);
  assert.throws(
    () => new HeartbeatServer(long),
    (err) => err instanceof SocketPathTooLongError && err.message.includes(`${n} bytes`) && err.message.includes('107-byte'),
  );
  assert.equal(fs.existsSync(path.join(dir, 'd'.repeat(60))), false);
});

test('a named-pipe path is recognised, skips the socket-file rules, and is refused off Windows', () => {
  const { isNamedPipe } = require('../lib/heartbeat.js');
  const pipe = '\\\\.\\pipe\\stallwatch-' + 'a'.repeat(200);
  assert.equal(isNamedPipe(pipe), true);
  assert.equal(isNamedPipe('/tmp/stallwatch-1000/x.sock'), false);
  assert.equal(isNamedPipe('C:\\pipe\\x'), false);
  // No 107-byte UNIX socket limit for a pipe name.
  const server = new HeartbeatServer(pipe);
  if (process.platform !== 'win32') {
    assert.throws(() => server.start(), (err) => err instanceof HeartbeatError && /Windows/.test(err.message));
    assert.equal(server.listening, false);
  }
});
