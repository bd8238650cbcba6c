'use strict';
// Main-thread cost of one tool span (start + end) with and without the kit's processor:
//   node bench/bench-tool-span.js bare|kit
const sw = require('..');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const withKit = process.argv[2] === 'kit';
const runner = withKit ? sw.attach({ heartbeat: false }) : null;
const provider = new NodeTracerProvider({ spanProcessors: withKit ? [runner.spanProcessor] : [] });
const tracer = provider.getTracer('b');
const N = 20000;
for (let i = 0; i < 2000; i++) tracer.startSpan('execute_tool t', { attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 't' } }).end();
const t0 = process.hrtime.bigint();
for (let i = 0; i < N; i++) tracer.startSpan('execute_tool t', { attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 't' } }).end();
console.log(withKit ? 'kit' : 'bare', (Number(process.hrtime.bigint() - t0) / N / 1000).toFixed(1), 'us per tool span (start+end)');
process.exit(0);
