// Compiled with `tsc --noEmit --strict` by test/types.test.js: checks index.d.ts.
import sw = require('../../index');

const runner: sw.Runner = sw.setup({ serviceName: 'svc', refreshIntervalMs: 100, exportTimeoutMillis: 500 });
const n: number = sw.withToolSpan('t', (span) => {
  span.setAttribute('step', 1);
  return 3;
}, { slaMs: 10, attributes: { 'mcp.session.id': 's' } });
const p: Promise<string> = sw.withToolSpan('t', async () => 'x');
void runner.heartbeatReady.then((h: sw.Agent | null) => (h ? h.flush() : undefined));
const attached: sw.Runner = sw.attach({ refreshIntervalMs: 100 });
const proc: sw.WatchSpanProcessor = attached.spanProcessor;
const report: string | null = sw.installStacksHook('/tmp/x');
const hb = new sw.HeartbeatServer('/tmp/x.sock');
const started: Promise<sw.HeartbeatServer> = hb.start();
const maybe: Promise<sw.HeartbeatServer> | null = sw.serveHeartbeat();
sw.installCrashHooks({ exitCode: sw.CRASH_EXIT_CODE });
const dir: string | null = sw.checkpointDir();
const id: string | null = runner.runnerId;
const tool: boolean = sw.isToolSpan({ 'gen_ai.operation.name': 'execute_tool' });
const err: sw.HeartbeatError = new sw.SocketPathTooLongError('x');
export { n, p, started, maybe, dir, id, tool, err, proc, report };
