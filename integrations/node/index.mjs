// ESM entry of @stallwatch/runner: the same module as the CommonJS one (one copy of its
// state, e.g. the single Runner that setup() returns), re-exported by name.
import sw from './index.js';

export const {
  HEARTBEAT_SOCKET_ENV,
  MAX_SOCKET_PATH_BYTES,
  MAX_REQUEST_BYTES,
  CLIENT_READ_TIMEOUT_MS,
  HeartbeatError,
  SocketInUseError,
  SocketPathTooLongError,
  HeartbeatServer,
  serveHeartbeat,
  CRASH_EXIT_CODE,
  installCrashHooks,
  DEFAULT_REFRESH_INTERVAL_MS,
  MAX_IN_FLIGHT,
  OnStartSpanProcessor,
  isToolSpan,
  snapshot,
  DEFAULT_EXPORT_TIMEOUT_MS,
  RUNNER_ID_ATTR,
  STACKS_FILE_ENV,
  attach,
  buildResource,
  checkpointDir,
  installStacksHook,
  setup,
  withToolSpan,
  Agent,
  WatchSpanProcessor,
  heartbeatTimeoutMs,
} = sw;
export default sw;
