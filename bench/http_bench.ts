/**
 * HTTP-level scenarios: the reference server, in process, on the run's Postgres and Redis, with
 * its real logger (level info, JSON lines to /dev/null). A cached request beside:
 * - `http_fastify_get`, the floor: a minimal Fastify route (no logger) that takes the same
 *   request (POST, JSON body, bearer header), does one `getBuffer` of the same response bytes
 *   from the same Redis and sends them;
 * - `GET /healthz`, the server's cost of HTTP alone;
 * - an uncached one (a preview of the same runnable: it runs the query as the viewer every time).
 * Latency is one keep-alive connection; throughput is `HTTP_CONCURRENCY` connections.
 *
 * Standalone (`npx tsx bench/http_bench.ts [--quick]`, with DATABASE_URL and REDIS_URL) it
 * prints the issue-11 ratios against the floor; `npm run bench` includes these rows.
 */
import { Agent, request } from 'node:http';
import { pathToFileURL } from 'node:url';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { readConfig } from '../src/server/config.js';
import { createServerLogger, startServer } from '../src/server/runtime.js';
import {
  BenchInvariantError,
  fmt,
  type LatencyPlan,
  markdownTable,
  measureLatency,
  measureThroughput,
  type Scenario,
} from './helpers.js';
import { type BenchPostgres, benchPostgres } from './postgres_fixture.js';

export interface HttpRow {
  readonly id: string;
  readonly label: string;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly ops: number;
  /** p50 ÷ `http_healthz` p50. */
  readonly ratio: number;
  /** p50 ÷ `http_fastify_get` p50 (the floor). */
  readonly floorRatio: number;
  /** Requests per second over `HTTP_CONCURRENCY` connections. */
  readonly reqPerSec: number;
  /** req/s ÷ the floor's req/s. */
  readonly floorThroughput: number;
  /**
   * CPU time (user + system, this process: client and server) per request, one connection.
   * Steadier than latency on a shared machine: another tenant's load delays a request but does
   * not add to this process's CPU. The client's share is the same for every row.
   */
  readonly cpuUs: number;
}

const HTTP_CONCURRENCY = 8;

export async function httpBench(
  postgres: BenchPostgres,
  prefix: string,
  redisUrl: string,
  redisPrefix: string,
  plan: LatencyPlan,
): Promise<HttpRow[]> {
  const { server, token: alice } = await startBenchServer(postgres, prefix, redisUrl, redisPrefix);
  const floor = await floorServer(redisUrl, `${redisPrefix}floor`);
  const single = new Agent({ keepAlive: true, maxSockets: 1 });
  const pool = new Agent({ keepAlive: true, maxSockets: HTTP_CONCURRENCY });

  const call = (agent: Agent, base: string, method: string, path: string, body?: string) =>
    new Promise<{ status: number; cache: string | undefined; text: string }>((resolve, reject) => {
      const { port } = new URL(base);
      const req = request(
        {
          host: '127.0.0.1',
          port,
          method,
          path,
          agent,
          headers: {
            authorization: `Bearer ${alice}`,
            ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () => {
            const cache = res.headers['x-viewer-cache'];
            resolve({
              status: res.statusCode ?? 0,
              cache: typeof cache === 'string' ? cache : undefined,
              text: Buffer.concat(chunks).toString('utf8'),
            });
          });
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  const list = JSON.stringify({ path: 'f/orders/list' });
  const expect =
    (agent: Agent, base: string, method: string, path: string, body?: string, cache?: string) =>
    async () => {
      const res = await call(agent, base, method, path, body);
      if (res.status !== 200 || (cache !== undefined && res.cache !== cache)) {
        throw new BenchInvariantError(`${path}: ${res.status} ${String(res.cache)}`);
      }
    };
  // The floor serves the very bytes a cached request answers with.
  const first = await call(
    single,
    server.url,
    'POST',
    '/api/w/demo/apps/orders-dashboard/run',
    list,
  );
  await floor.store(Buffer.from(first.text));

  const scenarios = (agent: Agent): Scenario[] => [
    {
      id: 'http_fastify_get',
      label: 'floor: a minimal Fastify route doing one `getBuffer` of the same response bytes',
      async: true,
      // The same request as the cached one (POST, JSON body, bearer header): only the server's
      // work differs.
      op: expect(agent, floor.url, 'POST', '/floor', list),
    },
    {
      id: 'http_healthz',
      label: '`GET /healthz` (the server, HTTP round trip only)',
      async: true,
      op: expect(agent, server.url, 'GET', '/healthz'),
    },
    {
      id: 'http_cached',
      label: 'app request, cache hit (stored bytes written as they are)',
      async: true,
      op: expect(agent, server.url, 'POST', '/api/w/demo/apps/orders-dashboard/run', list, 'hit'),
    },
    {
      id: 'http_uncached',
      label: 'preview of the same runnable (never cached: runs the query as the viewer)',
      async: true,
      op: expect(agent, server.url, 'POST', '/api/w/demo/jobs/preview', list, 'miss'),
    },
  ];
  try {
    const latency = await measureLatency(scenarios(single), plan);
    const throughput = await measureThroughput(scenarios(pool), {
      concurrency: HTTP_CONCURRENCY,
      opsPerRound: HTTP_CONCURRENCY * 10,
      warmupRounds: 2,
      rounds: Math.max(6, Math.round(plan.rounds / 2)),
    });
    const cpu = await measureCpu(scenarios(single), Math.max(5, Math.round(plan.rounds / 4)));
    const base = latency.get('http_healthz')!;
    const floorStats = latency.get('http_fastify_get')!;
    const floorRate = throughput.get('http_fastify_get')!.opsPerSec;
    return scenarios(single).map((s) => {
      const st = latency.get(s.id)!;
      const rate = throughput.get(s.id)!.opsPerSec;
      return {
        id: s.id,
        label: s.label,
        p50Us: st.p50Us,
        p99Us: st.p99Us,
        ops: st.ops,
        ratio: st.p50Us / base.p50Us,
        floorRatio: st.p50Us / floorStats.p50Us,
        reqPerSec: rate,
        floorThroughput: rate / floorRate,
        cpuUs: cpu.get(s.id)!,
      };
    });
  } finally {
    single.destroy();
    pool.destroy();
    await floor.close();
    await server.close();
  }
}

/**
 * The reference server as the HTTP rows measure it: in this process, on a database of its own
 * named after `prefix`, with its real logger (level info, JSON lines to /dev/null), the demo
 * world, and `VIEWER_CACHE_MEMORY_TIER_BYTES` from the environment (two tiers unless `0`).
 * Returns it with alice's API token.
 */
export async function startBenchServer(
  postgres: BenchPostgres,
  prefix: string,
  redisUrl: string,
  redisPrefix: string,
) {
  const database = `${prefix}http`;
  await postgres.createDatabase(database);
  const config = readConfig({
    ...process.env,
    DATABASE_URL: postgres.url(database),
    REDIS_URL: redisUrl,
    VIEWER_CACHE_REDIS_PREFIX: redisPrefix,
    VIEWER_CACHE_REDIS_TIMEOUT_MS: '2000',
    VIEWER_CACHE_SECRET_KEY: 'bench-http-secret-0123456789abcdef-0123456789',
    VIEWER_CACHE_DEMO: 'true',
    // The demo's roles are cluster-wide: give them the run's prefix.
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: process.env['VC_BENCH_LOG_LEVEL'] ?? 'info',
    LOG_FORMAT: 'json',
  });
  process.env['VIEWER_CACHE_DEMO_ROLE_PREFIX'] = prefix;
  const server = await startServer(config, createServerLogger(config, '/dev/null'));
  return { server, token: server.demoTokens['alice@example.com']! };
}

/** CPU µs per op of each scenario: `rounds` interleaved rounds of 200 sequential ops. */
async function measureCpu(scenarios: readonly Scenario[], rounds: number) {
  const OPS = 200;
  const total = new Map(scenarios.map((s) => [s.id, 0]));
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < scenarios.length; k++) {
      const s = scenarios[(k + r) % scenarios.length]!;
      const before = process.cpuUsage();
      for (let i = 0; i < OPS; i++) await s.op(i);
      const used = process.cpuUsage(before);
      total.set(s.id, total.get(s.id)! + used.user + used.system);
    }
  }
  return new Map([...total].map(([id, us]) => [id, us / (rounds * OPS)]));
}

/** The floor: Fastify with defaults (no logger), one route, one `getBuffer`. */
export async function floorServer(redisUrl: string, key: string) {
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  const app = Fastify();
  app.post('/floor', async (_request, reply) => {
    const bytes = await redis.getBuffer(key);
    return reply.header('content-type', 'application/json; charset=utf-8').send(bytes);
  });
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return {
    url,
    store: async (bytes: Buffer) => {
      await redis.set(key, bytes, 'EX', 3600);
    },
    close: async () => {
      await app.close();
      await redis.del(key);
      redis.disconnect();
    },
  };
}

/** The HTTP rows as a table, ratios against the floor (issue 11's figures). */
export function httpFloorTable(rows: readonly HttpRow[]): string {
  return markdownTable(
    [
      'scenario',
      'p50 µs',
      'p99 µs',
      'p50 × floor',
      `req/s (${HTTP_CONCURRENCY} conns)`,
      'req/s × floor',
      'CPU µs/req',
    ],
    rows.map((r) => [
      `\`${r.id}\``,
      fmt(r.p50Us),
      fmt(r.p99Us),
      fmt(r.floorRatio, 2),
      fmt(r.reqPerSec, 0),
      fmt(r.floorThroughput, 2),
      fmt(r.cpuUs),
    ]),
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const quick = process.argv.includes('--quick');
  const plan: LatencyPlan = quick
    ? { warmupMs: 200, rounds: 10, roundMs: 30, minOpsPerRound: 5 }
    : { warmupMs: 500, rounds: 40, roundMs: 40, minOpsPerRound: 10 };
  const prefix = `vchb${process.pid}_`;
  const postgres = await benchPostgres();
  try {
    const rows = await httpBench(
      postgres,
      prefix,
      process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379',
      `vc-bench-http-${process.pid}:`,
      plan,
    );
    console.log(httpFloorTable(rows));
  } finally {
    await postgres.close(prefix);
  }
  process.exit(0);
}
