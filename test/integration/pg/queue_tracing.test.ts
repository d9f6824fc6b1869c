import { context, propagation, SpanKind, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { RunnableDefinition } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, runFor } from '../../helpers/orders_db.js';
import { QueueDeployment, type QueueSide } from '../../helpers/queue_fixture.js';

// A miss through the queue is one trace: the server's run, its enqueue (PRODUCER), the worker's
// run (CONSUMER) and what the worker's run did — the data-table connection and the statement.
// The trace context travels sealed inside the job record: nothing of it is in Redis in clear,
// and no span carries the viewer, the args, a row or a key name.

const ALICE = 'alice@example.com';
const NEEDLE = 'needle-queue-5521';
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let fx: OrdersDb;
let deploy: QueueDeployment;
let server: QueueSide;

const runnables: Record<string, RunnableDefinition> = {
  orders: {
    cacheTtlS: 300,
    fn: async (args, ctx) => {
      const client = await ctx.datatable('main', { as: 'viewer' });
      const { rows } = await client.query(
        "select id, region from orders where $1::text <> 'x' order by id",
        [String(args['filter'])],
      );
      return rows;
    },
  },
};

beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  fx = await ordersDb();
  deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, fx.datatables, runnables);
  await deploy.migrate();
  server = await deploy.server();
  await deploy.worker();
});

afterAll(async () => {
  await deploy?.close();
  await fx?.close();
  await provider.shutdown();
  trace.disable();
  context.disable();
  propagation.disable();
});

const named = (spans: ReadableSpan[], name: string) => spans.filter((s) => s.name === name);

describe('a miss through the queue', () => {
  it('is one connected trace from the server’s run to the worker’s statement', async () => {
    let redisAfter = '';
    const running = runFor(server.registry, 'orders', app(ALICE), {
      through: server.cached,
      args: { filter: NEEDLE },
    });
    const result = await running;
    expect(result.fromCache).toBe(false);
    redisAfter = [...(await deploy.dump()).values()].join('\n');
    const spans = exporter.getFinishedSpans();
    const runs = named(spans, 'viewer_cache.run');
    const [enqueue] = named(spans, 'viewer_cache.queue.enqueue');
    const [taken] = named(spans, 'viewer_cache.queue.run');
    const [connect] = named(spans, 'viewer_cache.datatable.connect');
    const [select] = named(spans, 'SELECT');
    expect(runs).toHaveLength(2); // the server's and the worker's
    expect(enqueue?.kind).toBe(SpanKind.PRODUCER);
    expect(taken?.kind).toBe(SpanKind.CONSUMER);
    const traceId = enqueue!.spanContext().traceId;
    for (const span of [...runs, enqueue!, taken!, connect!, select!]) {
      expect(span.spanContext().traceId, span.name).toBe(traceId);
    }
    const serverRun = runs.find((s) => s.parentSpanContext === undefined)!;
    const workerRun = runs.find((s) => s !== serverRun)!;
    expect(enqueue!.parentSpanContext?.spanId).toBe(serverRun.spanContext().spanId);
    expect(taken!.parentSpanContext?.spanId).toBe(enqueue!.spanContext().spanId);
    expect(workerRun.parentSpanContext?.spanId).toBe(taken!.spanContext().spanId);
    expect(serverRun.attributes['viewer_cache.outcome']).toBe('miss');
    // Nothing of the trace left in Redis in clear (it travels sealed in the record).
    expect(redisAfter).not.toContain(traceId);
    const text = JSON.stringify(
      spans.map((s) => ({ name: s.name, attributes: s.attributes, events: s.events })),
    );
    for (const secret of [ALICE, PUBLISHER, NEEDLE, 'emea']) expect(text).not.toContain(secret);
  });
});
