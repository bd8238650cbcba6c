'use strict';
/**
 * Heartbeat server: answers stallwatch's `PING` with `PONG` on a UNIX socket.
 *
 * stallwatch connects, writes `PING\n`, reads at most 64 bytes up to `\n` and accepts
 * exactly `PONG` (docs/design.md, "Heartbeat details"). Anything else is closed without a
 * PONG. In Node the server lives on the event loop: a tool that blocks the loop
 * synchronously stops the PONGs, which stallwatch reads as a lost heartbeat.
 */
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

/** Environment variable that carries the socket path. */
const HEARTBEAT_SOCKET_ENV = 'STALLWATCH_HEARTBEAT_SOCKET';
/** Longest socket path in bytes (`sun_path` is 108 bytes on Linux with the NUL). */
const MAX_SOCKET_PATH_BYTES = 107;
/** Most bytes read from one client. */
const MAX_REQUEST_BYTES = 64;
/** Milliseconds a client may take to send its PING line. */
const CLIENT_READ_TIMEOUT_MS = 1000;

/** The heartbeat socket cannot be served (bad path, not a socket, bind failed). */
class HeartbeatError extends Error {
  constructor(message) {
    super(message);
    this.name = 'HeartbeatError';
  }
}

/** The socket path is longer than the 107-byte UNIX socket limit. */
class SocketPathTooLongError extends HeartbeatError {
  constructor(message) {
    super(message);
    this.name = 'SocketPathTooLongError';
  }
}

/**
 * The socket path is served by another live process: the runner this process was started
 * by (a child inherits `STALLWATCH_HEARTBEAT_SOCKET`). Taking it over cut the runner off
 * its heartbeat, and stallwatch stopped the healthy runner.
 */
class SocketInUseError extends HeartbeatError {
  constructor(message) {
    super(message);
    this.name = 'SocketInUseError';
  }
}

/** Resolves true when something listens on the UNIX socket at `socketPath`. */
function socketIsLive(socketPath) {
  return new Promise((resolve) => {
    let st;
    try {
      st = fs.lstatSync(socketPath);
    } catch (_) {
      return resolve(false);
    }
    if (!st.isSocket()) return resolve(false);
    const probe = net.connect(socketPath);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => {
      probe.destroy();
      resolve(false);
    });
  });
}

/** How a Windows named-pipe path starts: `\\.\pipe\`. */
const PIPE_PREFIX = '\\\\.\\pipe\\';

/**
 * True when `p` names a Windows named pipe (`\\.\pipe\...`): stallwatch injects one on
 * Windows instead of a socket path (docs/platforms.md). Node's `net` server listens on it
 * with the same code; only the socket-file handling is skipped.
 */
function isNamedPipe(p) {
  return String(p).startsWith(PIPE_PREFIX);
}

function checkPath(socketPath) {
  const n = Buffer.byteLength(socketPath);
  if (n > MAX_SOCKET_PATH_BYTES) {
    throw new SocketPathTooLongError(
      `heartbeat socket path is ${n} bytes, over the ${MAX_SOCKET_PATH_BYTES}-byte UNIX socket limit: ` +
        `${JSON.stringify(socketPath)} (choose a shorter path, e.g. under /tmp)`,
    );
  }
}

function removeStale(socketPath) {
  let st;
  try {
    st = fs.lstatSync(socketPath);
  } catch (err) {
    if (err.code === 'ENOENT') return;
    throw new HeartbeatError(`cannot inspect heartbeat socket path ${JSON.stringify(socketPath)}: ${err.message}`);
  }
  if (!st.isSocket()) {
    throw new HeartbeatError(
      `heartbeat socket path ${JSON.stringify(socketPath)} exists and is not a socket; refusing to remove it`,
    );
  }
  try {
    fs.unlinkSync(socketPath);
  } catch (err) {
    if (err.code !== 'ENOENT') throw new HeartbeatError(`cannot remove stale socket ${socketPath}: ${err.message}`);
  }
}

function answer(conn, server) {
  let data = Buffer.alloc(0);
  conn.setTimeout(CLIENT_READ_TIMEOUT_MS, () => conn.destroy());
  conn.on('error', () => conn.destroy());
  conn.on('data', (chunk) => {
    data = Buffer.concat([data, chunk]);
    const nl = data.indexOf(0x0a);
    if (nl === -1 || nl >= MAX_REQUEST_BYTES) {
      if (data.length >= MAX_REQUEST_BYTES) conn.destroy();
      return;
    }
    let line = data.subarray(0, nl).toString('latin1');
    if (line.endsWith('\r')) line = line.slice(0, -1);
    conn.removeAllListeners('data');
    if (line === 'PING') {
      server.pongs += 1;
      conn.end('PONG\n');
    } else {
      conn.destroy();
    }
  });
  conn.on('end', () => conn.destroy());
}

/**
 * A UNIX socket server that answers `PING\n` with `PONG\n`.
 *
 * `new HeartbeatServer(path)` throws SocketPathTooLongError for a path over 107 bytes.
 * `start()` creates the parent folder (mode 0700), unlinks a stale socket file (throws
 * HeartbeatError synchronously if the path is something else), and returns a Promise
 * that resolves with the server once it listens (rejects with HeartbeatError if bind
 * fails). The server is unref'd: it never keeps the process alive on its own.
 */
class HeartbeatServer {
  constructor(socketPath) {
    this.path = String(socketPath);
    this.pipe = isNamedPipe(this.path);
    if (!this.pipe) checkPath(this.path);
    /** Number of PONG answers sent. */
    this.pongs = 0;
    this._server = null;
  }

  start() {
    if (this._server) return Promise.resolve(this);
    if (this.pipe) {
      if (process.platform !== 'win32') {
        throw new HeartbeatError(
          `heartbeat path ${JSON.stringify(this.path)} is a Windows named pipe; it can be served on Windows only`,
        );
      }
    } else {
      const dir = path.dirname(this.path);
      try {
        fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
      } catch (err) {
        throw new HeartbeatError(`cannot create heartbeat socket folder ${JSON.stringify(dir)}: ${err.message}`);
      }
      // A path that is not a socket throws here, synchronously, as before.
      let existing = null;
      try {
        existing = fs.lstatSync(this.path);
      } catch (_) {
        /* free */
      }
      if (existing && !existing.isSocket()) removeStale(this.path);
      return socketIsLive(this.path).then((live) => {
        if (live) {
          throw new SocketInUseError(
            `heartbeat socket ${JSON.stringify(this.path)} is served by another live process ` +
              '(the runner this process was started by); this process does not serve it',
          );
        }
        removeStale(this.path);
        return this._listen();
      });
    }
    return this._listen();
  }

  _listen() {
    const server = net.createServer((conn) => answer(conn, this));
    this._server = server;
    return new Promise((resolve, reject) => {
      const onError = (err) => {
        this._server = null;
        reject(new HeartbeatError(`cannot serve heartbeat socket ${JSON.stringify(this.path)}: ${err.message}`));
      };
      server.once('error', onError);
      server.listen(this.path, () => {
        server.removeListener('error', onError);
        server.on('error', () => {});
        if (!this.pipe) {
          try {
            fs.chmodSync(this.path, 0o600);
          } catch (_) {
            /* best effort */
          }
        }
        server.unref();
        resolve(this);
      });
    });
  }

  /** True while listening. */
  get listening() {
    return Boolean(this._server && this._server.listening);
  }

  /** Stop listening and remove the socket file; resolves when closed. */
  close() {
    const server = this._server;
    this._server = null;
    return new Promise((resolve) => {
      if (!server) return resolve();
      server.close(() => resolve());
      // net.Server removes its own socket file on close; make sure of it.
      if (this.pipe) return;
      try {
        if (fs.lstatSync(this.path).isSocket()) fs.unlinkSync(this.path);
      } catch (_) {
        /* already gone */
      }
    });
  }
}

/**
 * Start a HeartbeatServer on `socketPath` (default `$STALLWATCH_HEARTBEAT_SOCKET`).
 * Returns a Promise of the server, or null (not a Promise) when no path is set.
 * Throws synchronously for a bad path.
 */
function serveHeartbeat(socketPath) {
  const p = socketPath ?? process.env[HEARTBEAT_SOCKET_ENV];
  if (!p) return null;
  return new HeartbeatServer(p).start();
}

module.exports = {
  HEARTBEAT_SOCKET_ENV,
  PIPE_PREFIX,
  isNamedPipe,
  MAX_SOCKET_PATH_BYTES,
  MAX_REQUEST_BYTES,
  CLIENT_READ_TIMEOUT_MS,
  HeartbeatError,
  SocketInUseError,
  SocketPathTooLongError,
  HeartbeatServer,
  socketIsLive,
  serveHeartbeat,
};
