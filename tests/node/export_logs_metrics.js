// Sends log records and the five metric instrument kinds (counter, up-down counter, gauge,
// histogram, exponential histogram) from the OpenTelemetry JS SDK (sdk-logs, sdk-metrics)
// to OTLP/HTTP protobuf, encoded by the SDK's own OTLP serializer (@opentelemetry/
// otlp-transformer, the encoder of the stock OTLP exporters). Needs NODE_PATH pointing at
// integrations/node/node_modules. Endpoint from OTEL_EXPORTER_OTLP_ENDPOINT, service from
// OTEL_SERVICE_NAME.
'use strict';

const { resourceFromAttributes } = require('@opentelemetry/resources');
const { LoggerProvider, SimpleLogRecordProcessor } = require('@opentelemetry/sdk-logs');
const {
  MeterProvider,
  PeriodicExportingMetricReader,
  AggregationType,
  AggregationTemporality,
} = require('@opentelemetry/sdk-metrics');
const {
  ProtobufLogsSerializer,
  ProtobufMetricsSerializer,
} = require('@opentelemetry/otlp-transformer');

const endpoint = process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
const service = process.env.OTEL_SERVICE_NAME || 'node-readback';

async function post(path, body) {
  const res = await fetch(endpoint + path, {
    method: 'POST',
    headers: { 'content-type': 'application/x-protobuf' },
    body,
  });
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status} ${await res.text()}`);
}

function exporter(path, serialize) {
  return {
    export(items, done) {
      post(path, serialize(items)).then(
        () => done({ code: 0 }),
        (error) => {
          console.error(error);
          done({ code: 1, error });
        },
      );
    },
    selectAggregationTemporality: () => AggregationTemporality.CUMULATIVE,
    forceFlush: async () => {},
    shutdown: async () => {},
  };
}

async function main() {
  const resource = resourceFromAttributes({
    'service.name': service,
    'deployment.environment': 'readback',
  });
  const logs = new LoggerProvider({
    resource,
    processors: [
      new SimpleLogRecordProcessor({
        exporter: exporter('/v1/logs', (l) => ProtobufLogsSerializer.serializeRequest(l)),
      }),
    ],
  });
  const logger = logs.getLogger('readback.node', '2.0');
  logger.emit({ severityNumber: 9, severityText: 'INFO', body: 'node loaded dataset', attributes: { dataset: 'iris' } });
  logger.emit({ severityNumber: 17, severityText: 'ERROR', body: 'node fit diverged', attributes: { dataset: 'iris', attempt: 2 } });
  await logs.forceFlush();
  await logs.shutdown();

  const reader = new PeriodicExportingMetricReader({
    exporter: exporter('/v1/metrics', (m) => ProtobufMetricsSerializer.serializeRequest(m)),
    exportIntervalMillis: 3600000,
  });
  const meters = new MeterProvider({
    resource,
    readers: [reader],
    views: [
      {
        instrumentName: 'payload.size',
        aggregation: { type: AggregationType.EXPONENTIAL_HISTOGRAM },
      },
    ],
  });
  const meter = meters.getMeter('readback.node.meter', '1.0');
  const counter = meter.createCounter('tool.calls', { unit: '{call}', description: 'tool calls' });
  for (const tool of ['a', 'a', 'a', 'b', 'b']) counter.add(1, { tool });
  const updown = meter.createUpDownCounter('queue.depth', { unit: '{item}', description: 'queued' });
  updown.add(5);
  updown.add(-2);
  const gauge = meter.createGauge('cpu.temperature', { unit: 'Cel', description: 'cpu temperature' });
  gauge.record(41.5, { core: '0' });
  const hist = meter.createHistogram('tool.duration', { unit: 'ms', description: 'tool duration' });
  for (const v of [5, 15, 30]) hist.record(v);
  const exp = meter.createHistogram('payload.size', { unit: 'By', description: 'payload size' });
  for (const v of [100, 200, 400, 800]) exp.record(v);
  await meters.forceFlush();
  await meters.shutdown();
  console.log(JSON.stringify({ ok: true }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
