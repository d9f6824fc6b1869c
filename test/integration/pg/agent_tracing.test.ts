import { context, propagation, SpanKind, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import Fastify, { type FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  type RunnableDefinition,
  withResultCache,
} from '../../../src/index.js';
import { silentLogger } from '../../../src/logger.js';
import {
  agentExecutor,
  InProcessAgentDispatch,
} from '../../../src/server/agents/agent_dispatch.js';
import { JOB_TOKEN_HEADER } from '../../../src/server/agents/agent_protocol.js';
import { type RunningAgent, startAgentWorker } from '../../../src/server/agents/agent_worker.js';
import { AgentTokens } from '../../../src/server/credentials/agent_tokens.js';
import { JobTokens } from '../../../src/server/credentials/tokens.js';
import { registerAgentRoutes } from '../../../src/server/http/http_agents.js';
import { traceRequests } from '../../../src/server/http/http_tracing.js';
import { migrateServer } from '../../../src/server/process/server_migrations.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, runFor, WS } from '../../helpers/orders_db.js';

// A miss run on an agent worker is one trace: the server's run, its take (PRODUCER, from the
// hand-off to the agent's take), the agent's run (CONSUMER) and, for each statement, the agent's
// proxied query (CLIENT) and the server's (SERVER) with the data-table connection and the
// statement beneath it, then the finish (CLIENT on the agent, SERVER on the server). The server
// and the agent run in this process, so one exporter sees both sides. The trace context goes to
// the agent with the taken job and comes back beside the job's token only: a `traceparent` with
// anything else grafts nothing. No span carries the viewer, the args, a row, a token or a key.

const ALICE = 'alice@example.com';
const NEEDLE = 'needle-agent-8813';
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let fx: OrdersDb;
let pool: pg.Pool;
let agentTokens: AgentTokens;
let dispatch: InProcessAgentDispatch;
let server: FastifyInstance;
let serverUrl: URL;
let agentToken = '';
let executor: Executor;
let cached: CachedExecutor;
let agent: RunningAgent;
/** Every key the cache wrote and every job token the agent was handed: none may be in a span. */
const keys = new Set<string>();
const jobTokens = new Set<string>();

const runnables: Record<string, RunnableDefinition> = {
  orders: {
    cacheTtlS: 300,
    fn: async (args, ctx) => {
      jobTokens.add(ctx.jobToken ?? '');
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
  pool = new pg.Pool({ connectionString: fx.db.url, max: 2 });
  pool.on('error', () => {});
  await migrateServer(pool);
  agentTokens = new AgentTokens(pool);
  await agentTokens.start();
  agentToken = await agentTokens.create(WS, 'default');
  dispatch = new InProcessAgentDispatch(new JobTokens(), { timeoutMs: 30_000 });
  server = Fastify();
  traceRequests(server);
  registerAgentRoutes(server, { agentTokens, dispatch, datatables: fx.datatables });
  serverUrl = new URL(await server.listen({ host: '127.0.0.1', port: 0 }));
  executor = createExecutor({ datatables: fx.datatables, runnables });
  const store = new MemoryCacheStore();
  cached = withResultCache(agentExecutor(dispatch, 'default'), {
    store: {
      shared: false,
      get: (key) => store.get(key),
      delete: (key) => store.delete(key),
      set: (key, value, ttlMs) => {
        keys.add(key);
        return store.set(key, value, ttlMs);
      },
    },
    fingerprint: fx.datatables.fingerprint,
    seal: false,
  });
  agent = startAgentWorker({ serverUrl, agentToken, runnables, logger: silentLogger, waitMs: 500 });
}, 120_000);

afterAll(async () => {
  await agent?.stop();
  dispatch?.close();
  await server?.close();
  agentTokens?.stop();
  await pool?.end();
  await fx?.close();
  await provider.shutdown();
  trace.disable();
  context.disable();
  propagation.disable();
});

const named = (spans: ReadableSpan[], name: string) => spans.filter((s) => s.name === name);
const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;
const idOf = (span: ReadableSpan) => span.spanContext().spanId;

describe('a miss through an agent', () => {
  it('is one connected trace: run → take → agent run → proxied query → statement, → finish', async () => {
    exporter.reset();
    const result = await runFor(executor, 'orders', app(ALICE), {
      through: cached,
      args: { filter: NEEDLE },
    });
    expect(result.fromCache).toBe(false);
    expect(result.value).toHaveLength(2);
    const spans = exporter.getFinishedSpans();
    const [run] = named(spans, 'viewer_cache.run');
    const [take] = named(spans, 'viewer_cache.agent.take');
    const [agentRun] = named(spans, 'viewer_cache.agent.run');
    const queries = named(spans, 'viewer_cache.agent.query');
    const finishes = named(spans, 'viewer_cache.agent.finish');
    const [connect] = named(spans, 'viewer_cache.datatable.connect');
    const [select] = named(spans, 'SELECT');
    expect(run?.attributes['viewer_cache.outcome']).toBe('miss');
    expect(take?.kind).toBe(SpanKind.PRODUCER);
    expect(agentRun?.kind).toBe(SpanKind.CONSUMER);
    const queryClient = queries.find((s) => s.kind === SpanKind.CLIENT);
    const queryServer = queries.find((s) => s.kind === SpanKind.SERVER);
    const finishClient = finishes.find((s) => s.kind === SpanKind.CLIENT);
    const finishServer = finishes.find((s) => s.kind === SpanKind.SERVER);
    const traceId = run!.spanContext().traceId;
    for (const span of [take, agentRun, queryClient, queryServer, finishClient, finishServer]) {
      expect(span?.spanContext().traceId, span?.name).toBe(traceId);
    }
    expect(parentOf(take!)).toBe(idOf(run!));
    expect(parentOf(agentRun!)).toBe(idOf(take!));
    expect(parentOf(queryClient!)).toBe(idOf(agentRun!));
    expect(parentOf(queryServer!)).toBe(idOf(queryClient!));
    expect(parentOf(connect!)).toBe(idOf(queryServer!));
    expect(connect!.spanContext().traceId).toBe(traceId);
    expect(select!.spanContext().traceId).toBe(traceId);
    expect(parentOf(finishClient!)).toBe(idOf(agentRun!));
    expect(parentOf(finishServer!)).toBe(idOf(finishClient!));

    // Nothing the cache protects, in any attribute, event or status of any span.
    const text = JSON.stringify(
      spans.map((s) => ({
        name: s.name,
        attributes: s.attributes,
        events: s.events,
        status: s.status,
      })),
    );
    const secrets = [ALICE, PUBLISHER, NEEDLE, 'emea', 'amer', agentToken, ...keys, ...jobTokens];
    expect(keys.size).toBeGreaterThan(0);
    expect(jobTokens.size).toBe(1);
    for (const secret of secrets) expect(text).not.toContain(secret);
  });

  it('a traceparent without the job’s own token grafts nothing', async () => {
    exporter.reset();
    const forged = `00-${'ab'.repeat(16)}-${'cd'.repeat(8)}-01`;
    const response = await fetch(new URL('/api/agent/query', serverUrl), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${agentToken}`,
        'x-viewer-cache-agent-protocol': '1',
        [JOB_TOKEN_HEADER]: 'vcj_not-a-job-token',
        'content-type': 'application/json',
        traceparent: forged,
      },
      body: JSON.stringify({ reference: { datatable: 'main', role: '@viewer' }, sql: 'select 1' }),
    });
    expect(response.status).toBeGreaterThanOrEqual(400);
    await response.body?.cancel();
    const finish = await fetch(new URL('/api/agent/jobs/some-job/finish', serverUrl), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${agentToken}`,
        'x-viewer-cache-agent-protocol': '1',
        'content-type': 'application/json',
        traceparent: forged,
      },
      body: JSON.stringify({ ok: true, value: 1 }),
    });
    expect(finish.status).toBe(404);
    await finish.body?.cancel();
    const spans = exporter.getFinishedSpans();
    expect(spans.length).toBeGreaterThan(0);
    for (const span of spans)
      expect(span.spanContext().traceId, span.name).not.toBe('ab'.repeat(16));
  });
});
