// Types for @stallwatch/runner (CommonJS). See integrations/README.md.
import type { Attributes, Context, Span as ApiSpan } from '@opentelemetry/api';
import type { Resource } from '@opentelemetry/resources';
import type { ReadableSpan, Span, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

/** Environment variable that carries the heartbeat socket path. */
export declare const HEARTBEAT_SOCKET_ENV: 'STALLWATCH_HEARTBEAT_SOCKET';
/** Longest UNIX socket path in bytes (107). */
export declare const MAX_SOCKET_PATH_BYTES: number;
/** Most bytes read from one heartbeat client (64). */
export declare const MAX_REQUEST_BYTES: number;
/** Milliseconds a heartbeat client may take to send its PING line (1000). */
export declare const CLIENT_READ_TIMEOUT_MS: number;

/** The heartbeat socket cannot be served. */
export declare class HeartbeatError extends Error {}
/** The socket path is over 107 bytes. */
export declare class SocketPathTooLongError extends HeartbeatError {}

/** UNIX socket server answering `PING\n` with `PONG\n`; unref'd. */
export declare class HeartbeatServer {
  /** Throws SocketPathTooLongError for a path over 107 bytes. */
  constructor(socketPath: string);
  readonly path: string;
  /** PONG answers sent. */
  pongs: number;
  readonly listening: boolean;
  /** Creates the parent folder, unlinks a stale socket (throws HeartbeatError synchronously if the path is not a socket), listens. */
  start(): Promise<HeartbeatServer>;
  /** Stops listening and removes the socket file. */
  close(): Promise<void>;
}
/** Start a HeartbeatServer on `socketPath` (default $STALLWATCH_HEARTBEAT_SOCKET); null when unset. */
export declare function serveHeartbeat(socketPath?: string): Promise<HeartbeatServer> | null;

/** Exit code of a runner that crashed on an unhandled error (101). */
export declare const CRASH_EXIT_CODE: number;
/** Install unhandledRejection/uncaughtException hooks: one JSON line on stderr, then exit. Idempotent. */
export declare function installCrashHooks(options?: { exitCode?: number }): void;

/** Default milliseconds between refreshes of a running tool span (5000). */
export declare const DEFAULT_REFRESH_INTERVAL_MS: number;
/** Most snapshot exports in flight at once (4). */
export declare const MAX_IN_FLIGHT: number;
/** True when the attributes mark a tool execution. */
export declare function isToolSpan(attributes: Attributes | undefined | null): boolean;
/** A ReadableSpan copy of a running span with endTime [0, 0]; null if it ended. */
export declare function snapshot(span: Span): ReadableSpan | null;
/** Exports snapshots (end time 0) of tool spans at start and every refreshIntervalMs while they run. */
export declare class OnStartSpanProcessor implements SpanProcessor {
  constructor(exporter: SpanExporter, options?: { refreshIntervalMs?: number });
  exported: number;
  dropped: number;
  onStart(span: Span, parentContext: Context): void;
  onEnd(span: ReadableSpan): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

/** Default per-request timeout (ms) of the snapshot exporter (2000). */
export declare const DEFAULT_EXPORT_TIMEOUT_MS: number;
/** 'stallwatch.runner.id' */
export declare const RUNNER_ID_ATTR: string;

export interface SetupOptions {
  /** Overrides OTEL_SERVICE_NAME. */
  serviceName?: string;
  /** Milliseconds between refreshes of a running tool span (default 5000). */
  refreshIntervalMs?: number;
  /** Per-request timeout of the snapshot exporter in ms (default 2000). */
  exportTimeoutMillis?: number;
  /** Serve $STALLWATCH_HEARTBEAT_SOCKET when set (default true). */
  heartbeat?: boolean;
  /** Install the crash hooks (default true). */
  crashHooks?: boolean;
  /** Register the provider globally with a context manager (default true). */
  register?: boolean;
}

export interface Runner {
  tracerProvider: NodeTracerProvider;
  resource: Resource;
  onStart: OnStartSpanProcessor;
  /** Set once heartbeatReady resolves. */
  heartbeat: HeartbeatServer | null;
  /** Resolves with the heartbeat server (null when none); rejects if it cannot listen. */
  heartbeatReady: Promise<HeartbeatServer | null>;
  runnerId: string | null;
  closed: boolean;
  shutdown(): Promise<void>;
}

export declare function buildResource(serviceName?: string): Resource;
/** $STALLWATCH_CHECKPOINT_DIR or null. */
export declare function checkpointDir(): string | null;
/** Wire the SDK to stallwatch; a second call returns the first Runner. */
export declare function setup(options?: SetupOptions): Runner;
/** Run fn inside a tool span `execute_tool {name}`; sync or async. */
export declare function withToolSpan<T>(
  name: string,
  fn: (span: ApiSpan) => T,
  options?: { attributes?: Attributes; slaMs?: number },
): T;
