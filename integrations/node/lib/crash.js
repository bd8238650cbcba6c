'use strict';
/**
 * Crash hooks: turn an unhandled rejection or uncaught exception into ONE structured
 * JSON line on stderr and exit code 101, so stallwatch (which keeps a runner's last
 * stderr lines and its exit status) can report `runner.crashed` with the reason.
 */
const fs = require('node:fs');

/** Exit code of a runner that crashed on an unhandled error. */
const CRASH_EXIT_CODE = 101;

let installed = false;

function describe(kind, reason) {
  const isError = reason instanceof Error;
  let message;
  try {
    message = isError ? reason.message : typeof reason === 'string' ? reason : String(reason);
  } catch (_) {
    message = '<unprintable>';
  }
  return {
    event: 'runner.crashed',
    kind,
    message,
    stack: isError && typeof reason.stack === 'string' ? reason.stack : null,
    name: isError ? reason.name : typeof reason,
    pid: process.pid,
  };
}

function crash(kind, reason, exitCode) {
  let line;
  try {
    line = JSON.stringify(describe(kind, reason));
  } catch (_) {
    line = JSON.stringify({ event: 'runner.crashed', kind, message: '<unserializable>', stack: null });
  }
  try {
    fs.writeSync(2, line + '\n');
  } catch (_) {
    /* stderr closed: still exit */
  }
  process.exit(exitCode);
}

/**
 * Install `unhandledRejection` and `uncaughtException` handlers that write
 * `{"event":"runner.crashed","kind":...,"message":...,"stack":...}` (one line) to stderr
 * and exit with `exitCode` (default 101). Idempotent.
 */
function installCrashHooks({ exitCode = CRASH_EXIT_CODE } = {}) {
  if (installed) return;
  installed = true;
  process.on('unhandledRejection', (reason) => crash('unhandledRejection', reason, exitCode));
  process.on('uncaughtException', (err, origin) =>
    crash(origin === 'unhandledRejection' ? 'unhandledRejection' : 'uncaughtException', err, exitCode),
  );
}

module.exports = { CRASH_EXIT_CODE, installCrashHooks };
