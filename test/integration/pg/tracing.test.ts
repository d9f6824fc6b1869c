import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  type CacheStore,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { sanitizeStatement } from '../../../src/tracing.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, runFor } from '../../helpers/orders_db.js';

// Traces reach the user's OpenTelemetry SDK (here an in-memory exporter) and carry nothing the
// cache protects: the run's viewer, args values, rows, key names. The scan at the end reads
// every attribute, event and status of every span the file produced.

const ALICE = 'alice@example.com';
const CAROL = 'carol@example.com';
/** An args value no span may repeat. */
const NEEDLE = 'needle-args-7731';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;
/** Every key the cache wrote: none may appear in a span. */
const keys = new Set<string>();

function recording(store: MemoryCacheStore): CacheStore {
  return {
    shared: false,
    get: (key) => store.get(key),
    delete: (key) => store.delete(key),
    set: (key, value, ttlMs) => {
      keys.add(key);
      return store.set(key, value, ttlMs);
    },
  };
}

beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  fx = await ordersDb();
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
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
    },
  });
  cached = withResultCache(executor, {
    store: recording(new MemoryCacheStore()),
    fingerprint: fx.datatables.fingerprint,
    seal: false,
  });
});

afterAll(async () => {
  await fx?.close();
  await provider.shutdown();
  trace.disable();
  context.disable();
  propagation.disable();
});

beforeEach(() => exporter.reset());

const byName = (spans: ReadableSpan[], name: string) => spans.filter((s) => s.name === name);
const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;

describe('traces', () => {
  it('a miss: run → store read, data-table connect (a role’s own login), the statement, store write — one trace', async () => {
    const result = await runFor(executor, 'orders', app(ALICE), {
      through: cached,
      args: { filter: NEEDLE },
    });
    expect(result.fromCache).toBe(false);
    const spans = exporter.getFinishedSpans();
    const [run] = byName(spans, 'viewer_cache.run');
    expect(run?.attributes).toMatchObject({
      'viewer_cache.outcome': 'miss',
      'viewer_cache.runnable.path': 'orders',
    });
    const [connect] = byName(spans, 'viewer_cache.datatable.connect');
    expect(connect?.attributes).toMatchObject({
      'viewer_cache.datatable.access': 'viewer',
      'viewer_cache.login.kind': 'role',
    });
    const [select] = byName(spans, 'SELECT');
    expect(select?.attributes).toMatchObject({
      'db.system.name': 'postgresql',
      'db.operation.name': 'SELECT',
      'db.response.returned_rows': 2,
    });
    // Off by default: not even the sanitized text.
    expect(select?.attributes['db.query.text']).toBeUndefined();
    const runId = run!.spanContext().spanId;
    for (const child of [connect!, select!, ...byName(spans, 'viewer_cache.store.get')]) {
      expect(child.spanContext().traceId).toBe(run!.spanContext().traceId);
      expect(parentOf(child)).toBe(runId);
    }
    // Stored under each fingerprint it was found to depend on (a first run learns its set).
    expect(byName(spans, 'viewer_cache.store.set').length).toBeGreaterThanOrEqual(1);
  });

  it('the repeat is a hit: one run span saying so, and no connection', async () => {
    const result = await runFor(executor, 'orders', app(ALICE), {
      through: cached,
      args: { filter: NEEDLE },
    });
    expect(result.fromCache).toBe(true);
    const spans = exporter.getFinishedSpans();
    expect(byName(spans, 'viewer_cache.run')[0]?.attributes['viewer_cache.outcome']).toBe('hit');
    expect(byName(spans, 'viewer_cache.datatable.connect')).toHaveLength(0);
  });

  it('a viewer of two roles leases a set login, said as its kind only', async () => {
    await runFor(executor, 'orders', app(CAROL), { through: cached, args: { filter: NEEDLE } });
    const [connect] = byName(exporter.getFinishedSpans(), 'viewer_cache.datatable.connect');
    expect(connect?.attributes['viewer_cache.login.kind']).toBe('set');
  });

  it('a refusal is said as refused, with its code', async () => {
    await expect(
      runFor(executor, 'orders', app(null), { through: cached, args: { filter: NEEDLE } }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    const [run] = byName(exporter.getFinishedSpans(), 'viewer_cache.run');
    expect(run?.attributes).toMatchObject({
      'viewer_cache.outcome': 'refused',
      'error.type': 'E_NO_VIEWER',
    });
  });

  it('a run under a caller’s span joins the caller’s trace', async () => {
    const parent = provider.getTracer('test').startSpan('caller');
    await context.with(trace.setSpan(context.active(), parent), () =>
      runFor(executor, 'orders', app(ALICE), { through: cached, args: { filter: 'other' } }),
    );
    parent.end();
    const [run] = byName(exporter.getFinishedSpans(), 'viewer_cache.run');
    expect(run?.spanContext().traceId).toBe(parent.spanContext().traceId);
    expect(parentOf(run!)).toBe(parent.spanContext().spanId);
  });

  it('no span carries a viewer, an email, an args value, a row value or a key name', async () => {
    await runFor(executor, 'orders', app(CAROL), { through: cached, args: { filter: NEEDLE } });
    await runFor(executor, 'orders', app(ALICE), { through: cached, args: { filter: 'p2' } });
    const spans = exporter.getFinishedSpans();
    expect(spans.length).toBeGreaterThan(3);
    expect(keys.size).toBeGreaterThan(0);
    const forbidden = [ALICE, CAROL, PUBLISHER, NEEDLE, 'p2', 'emea', 'amer', ...keys];
    const text = JSON.stringify(
      spans.map((s) => ({
        name: s.name,
        attributes: s.attributes,
        events: s.events,
        status: s.status,
        links: s.links,
        resource: s.resource.attributes,
      })),
    );
    expect(forbidden.filter((value) => text.includes(value))).toEqual([]);
  });
});

describe('sanitized statement text (opt-in)', () => {
  it('keeps identifiers and operators, drops every literal and comment', () => {
    expect(
      sanitizeStatement(
        `select "id", a.b from t1 /* alice */ where x = 'it''s' and y = E'\\n' and z = -12.5e3
         and w = $tag$secret$tag$ and v = $1 -- bob@example.com`,
      ),
    ).toBe('select "id", a.b from t1 where x = ? and y = ? and z = ? and w = ? and v = $1');
  });
});
