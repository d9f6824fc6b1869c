import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExecutor, MemoryCacheStore, withResultCache } from '../../src/index.js';
import { buildHttpApp, type HttpDeps } from '../../src/server/http/http.js';

// The HTTP API joins the caller's trace (`traceparent`, W3C trace context): the request's span is
// the caller's child, and the run's span is the request's. The route is a public app's (no
// token), the runnable a plain function: the server built as `serve` builds it, in process.

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT_ID = '00f067aa0ba902b7';
let app: ReturnType<typeof buildHttpApp>;

beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  const executor = createExecutor({
    runnables: { 'f/hello': { cacheTtlS: 60, fn: async () => ({ hello: 'world' }) } },
  });
  const cache = withResultCache(executor, { store: new MemoryCacheStore(), seal: false });
  const stub = {} as never;
  const deps: HttpDeps = {
    logger: pino({ level: 'silent' }),
    executor,
    cache,
    datatables: stub,
    apps: { site: { publisher: 'pub@example.com', public: true, runnables: ['f/hello'] } },
    hooks: {},
    schedules: () => [],
    apiTokens: stub,
    jobTokens: stub,
    metrics: { registry: new Registry(), observeRequest() {}, observeJob() {} },
    storeState: async () => 'ok',
  };
  app = buildHttpApp(deps);
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  await provider.shutdown();
  trace.disable();
  context.disable();
  propagation.disable();
});

describe('HTTP traces', () => {
  it('a request with traceparent: its span is the caller’s child, the run’s span its own', async () => {
    const answer = await app.inject({
      method: 'POST',
      url: '/api/w/demo/public/apps/site/run',
      headers: { traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` },
      payload: { path: 'f/hello' },
    });
    expect(answer.statusCode).toBe(200);
    const spans = exporter.getFinishedSpans();
    const request = spans.find((s) => s.name === 'POST /api/w/:workspace/public/apps/:app/run');
    const run = spans.find((s) => s.name === 'viewer_cache.run');
    expect(request?.spanContext().traceId).toBe(TRACE_ID);
    expect(request?.parentSpanContext?.spanId).toBe(PARENT_ID);
    expect(request?.attributes).toMatchObject({
      'http.route': '/api/w/:workspace/public/apps/:app/run',
      'http.response.status_code': 200,
    });
    expect(run?.spanContext().traceId).toBe(TRACE_ID);
    expect(run?.parentSpanContext?.spanId).toBe(request?.spanContext().spanId);
  });
});
