// Types for @stallwatch/runner (CommonJS entry; index.d.mts re-exports them for ESM). See README.md.
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
/** The socket is served by another live process (the runner that started this one). */
export declare class SocketInUseError extends HeartbeatError {}

/** UNIX socket server answering `PING\n` with `PONG\n`; unref'd. */
export declare class HeartbeatServer {
  /** Throws SocketPathTooLongError for a path over 107 bytes. */
  constructor(socketPath: string);
  readonly path: string;
  /** PONG answers sent. */
  pongs: number;
  readonly listening: boolean;
  /** Creates the parent folder, unlinks a stale socket (throws HeartbeatError synchronously if the path is not a socket; rejects with SocketInUseError if another live process serves it), listens. */
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

/** 'STALLWATCH_STACKS_FILE' */
export declare const STACKS_FILE_ENV: string;
/** stallwatch's heartbeat timeout in ms: $STALLWATCH_HEARTBEAT_TIMEOUT_MS or 5000. */
export declare function heartbeatTimeoutMs(): number;

/**
 * The kit's agent: a worker thread that serves the heartbeat socket and exports tool-span
 * snapshots, so both go on while the main thread runs a synchronous tool. Answers PONG,
 * BYE (after goodbye()), ERR export_stuck or ERR event_loop_blocked.
 */
export declare class Agent {
  constructor(options?: {
    socketPath?: string | null;
    refreshIntervalMs?: number;
    exportTimeoutMillis?: number;
    heartbeatTimeoutMs?: number;
  });
  /** The heartbeat socket path, or null. */
  readonly path: string | null;
  /** Resolves with the agent once the socket listens (null without a socket). */
  readonly ready: Promise<Agent | null>;
  /** Answer BYE from now on (deliberate exit). */
  goodbye(): void;
  /** Resolves once no snapshot export is in flight (at most timeoutMs, default 3000). */
  flush(timeoutMs?: number): Promise<void>;
  stop(): void;
}

/** SpanProcessor that hands tool spans to the Agent synchronously in onStart. */
export declare class WatchSpanProcessor implements SpanProcessor {
  constructor(agent: Agent, options?: { refreshIntervalMs?: number });
  onStart(span: Span, parentContext: Context): void;
  onEnd(span: ReadableSpan): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

/** Turn on process.report for SIGUSR2, then write the stacks-file header (` main_stack=heartbeat` with options.mainStack); returns the report path or null. */
export declare function installStacksHook(file?: string, options?: { mainStack?: boolean }): string | null;

export interface AttachOptions {
  /** Milliseconds between refreshes of a running tool span (default 5000). */
  refreshIntervalMs?: number;
  /** Per-request timeout of the snapshot exporter in ms (default 2000). */
  exportTimeoutMillis?: number;
  /** Serve $STALLWATCH_HEARTBEAT_SOCKET when set (default true). */
  heartbeat?: boolean;
  /** Install the crash hooks (default true). */
  crashHooks?: boolean;
}

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
  /** Attach to this SDK 1.x provider (it must have addSpanProcessor); for SDK 2.x use attach(). */
  tracerProvider?: { addSpanProcessor(processor: SpanProcessor): void; resource?: Resource };
}

export interface Runner {
  /** The provider setup() created; null after attach() (the app owns its provider). */
  tracerProvider: NodeTracerProvider | null;
  resource: Resource | null;
  /** The kit's processor: add it to your own provider/NodeSDK after attach(). */
  spanProcessor: WatchSpanProcessor;
  /** Same object as spanProcessor (older name). */
  onStart: WatchSpanProcessor;
  /** Set once heartbeatReady resolves. */
  heartbeat: Agent | null;
  /** Resolves with the agent serving the heartbeat (null when none); rejects if it cannot listen. */
  heartbeatReady: Promise<Agent | null>;
  runnerId: string | null;
  closed: boolean;
  shutdown(): Promise<void>;
}

export declare function buildResource(serviceName?: string): Resource;
/** $STALLWATCH_CHECKPOINT_DIR or null. */
export declare function checkpointDir(): string | null;
/** Wire the SDK to stallwatch; a second call returns the first Runner. */
export declare function setup(options?: SetupOptions): Runner;
/** Start the agent only; add runner.spanProcessor to your provider or NodeSDK. */
export declare function attach(options?: AttachOptions): Runner;
/** Run fn inside a tool span `execute_tool {name}`; sync or async. */
export declare function withToolSpan<T>(
  name: string,
  fn: (span: ApiSpan) => T,
  options?: { attributes?: Attributes; slaMs?: number },
): T;
