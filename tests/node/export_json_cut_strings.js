// Sends a span and a log record whose string attributes were cut inside a character, the
// way JavaScript cuts strings (by UTF-16 code unit: "hi 😀".substring(0, 4) ends in half of
// the emoji), through the SDK's own OTLP/JSON serializers (@opentelemetry/otlp-transformer,
// the encoder of the stock OTLP/HTTP JSON exporters). JSON.stringify writes such a lone
// surrogate as an escape (`\ud83d`). Prints the server's answer to each export as one JSON
// line: {"path", "status", "body"}. Needs NODE_PATH pointing at integrations/node/node_modules;
// endpoint from OTEL_EXPORTER_OTLP_ENDPOINT.
'use strict';

const { resourceFromAttributes } = require('@opentelemetry/resources');
const { BasicTracerProvider, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { LoggerProvider, SimpleLogRecordProcessor } = require('@opentelemetry/sdk-logs');
const { JsonTraceSerializer, JsonLogsSerializer } = require('@opentelemetry/otlp-transformer');

const endpoint = process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
const cutHigh = 'hi 😀'.substring(0, 4); // 'hi ' + high surrogate
const cutLow = '😀x'.substring(1); // low surrogate + 'x'
const pending = [];

function exporter(path, serialize) {
  return {
    export(items, done) {
      const body = serialize(items);
      const sent = fetch(endpoint + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      }).then(async (res) => {
        console.log(JSON.stringify({ path, status: res.status, body: await res.text(), sent: Buffer.from(body).toString('utf8') }));
        done({ code: res.ok ? 0 : 1 });
      }, (error) => {
        console.error(error);
        done({ code: 1, error });
      });
      pending.push(sent);
    },
    forceFlush: async () => {},
    shutdown: async () => {},
  };
}

async function main() {
  const resource = resourceFromAttributes({ 'service.name': 'node-cut-strings' });
  const tracer = new BasicTracerProvider({
    resource,
    spanProcessors: [new SimpleSpanProcessor(exporter('/v1/traces', (s) => JsonTraceSerializer.serializeRequest(s)))],
  });
  const span = tracer.getTracer('cut').startSpan('cut-strings');
  span.setAttribute('user.input', cutHigh);
  span.setAttribute('user.tail', cutLow);
  span.setAttribute('user.whole', 'hi 😀');
  span.end();
  await tracer.forceFlush();
  const logs = new LoggerProvider({
    resource,
    processors: [new SimpleLogRecordProcessor({ exporter: exporter('/v1/logs', (l) => JsonLogsSerializer.serializeRequest(l)) })],
  });
  logs.getLogger('cut').emit({ severityNumber: 9, body: cutHigh, attributes: { 'user.input': cutHigh } });
  await logs.forceFlush();
  await Promise.all(pending);
  await tracer.shutdown();
  await logs.shutdown();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
