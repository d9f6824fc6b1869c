/**
 * HTTP-level scenarios: the reference server on the run's Postgres and Redis, with its real
 * logger (level info, JSON lines to /dev/null), beside
 * - `http_fastify_get`, the floor: a minimal Fastify route (no logger) that takes the same
 *   request (POST, JSON body, bearer header), does one `getBuffer` of the same response bytes
 *   from the same Redis and sends them;
 * - `GET /healthz`, the server's cost of HTTP alone;
 * - a cached app request with the server's defaults (two tiers, sealed, access line on), the
 *   same with the access line off (`VIEWER_CACHE_ACCESS_LOG=off`), and on a server with Redis
 *   only (`VIEWER_CACHE_MEMORY_TIER_BYTES=0`): rows judged against the floor (p50 and req/s);
 * - an uncached one (a preview of the same runnable: it runs the query as the viewer every time).
 *
 * The servers run in this process; the client runs in one of its own (`http_client.ts`), so a
 * row's CPU per request is its server's alone, and no client shares an event loop with the
 * server it measures (when it did, the cached request's CPU over the floor's measured +125 µs
 * instead of +35–60 µs). Rows are interleaved in rounds, as everywhere else. Latency is one
 * keep-alive connection; throughput and CPU per request are `HTTP_CONCURRENCY` connections.
 *
 * Standalone: `npx tsx bench/http_bench.ts [--quick]` (with DATABASE_URL and REDIS_URL) prints
 * the table; `npm run bench` runs it in a process of its own (`--json`) and includes its rows.
 */
import { type ChildProcess, fork, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { readConfig } from '../src/server/process/config.js';
import { createServerLogger, startServer } from '../src/server/start/serve.js';
import { deleteRunKeys, REDIS_URL, RUN_PREFIX, rawRedis } from './fixtures.js';
import { BenchInvariantError, type LatencyPlan, roundOrder } from './helpers.js';
import type { BatchRequest, BatchResult } from './http_client.js';
import { type BenchPostgres, benchPostgres } from './postgres_fixture.js';
import { HTTP_CONCURRENCY, type HttpRow, httpTable } from './report.js';

const CLIENT = join(dirname(fileURLToPath(import.meta.url)), 'http_client.ts');
export const APP_RUN = '/api/w/demo/apps/orders-dashboard/run';
export const LIST = JSON.stringify({ path: 'f/orders/list' });

interface HttpScenario {
  readonly id: string;
  readonly label: string;
  readonly target: Omit<BatchRequest, 'id' | 'conns' | 'ops' | 'ms' | 'minOps'>;
}

export async function httpBench(
  postgres: BenchPostgres,
  prefix: string,
  redisUrl: string,
  redisPrefix: string,
  plan: LatencyPlan,
): Promise<HttpRow[]> {
  // The server's default tiers, whatever this process's environment says.
  const twoTiers = await startBenchServer(postgres, prefix, redisUrl, redisPrefix, {
    VIEWER_CACHE_MEMORY_TIER_BYTES: undefined,
  });
  // The demo's roles are cluster-wide: the second server's get a prefix of their own, under the
  // run's (so they are dropped with it).
  const redisOnly = await startBenchServer(postgres, `${prefix}r`, redisUrl, `${redisPrefix}r:`, {
    VIEWER_CACHE_MEMORY_TIER_BYTES: '0',
  });
  // The default server with its access line off (`VIEWER_CACHE_ACCESS_LOG=off`): what the line
  // costs is this row against `http_cached`.
  const quiet = await startBenchServer(postgres, `${prefix}q`, redisUrl, `${redisPrefix}q:`, {
    VIEWER_CACHE_MEMORY_TIER_BYTES: undefined,
    VIEWER_CACHE_ACCESS_LOG: 'off',
  });
  const floor = await floorServer(redisUrl, `${redisPrefix}floor`);
  const client = await HttpClient.start();
  try {
    // The first request of each server fills its cache; the floor serves the very bytes a
    // cached request answers with.
    const bytes = await firstRun(twoTiers.server.url, twoTiers.token);
    await firstRun(redisOnly.server.url, redisOnly.token);
    await firstRun(quiet.server.url, quiet.token);
    await floor.store(bytes);
    const port = (url: string) => Number(new URL(url).port);
    const app = (url: string, token: string, expectCache: string) =>
      ({ port: port(url), method: 'POST', path: APP_RUN, body: LIST, token, expectCache }) as const;
    const scenarios: HttpScenario[] = [
      {
        id: 'http_fastify_get',
        label: 'floor: a minimal Fastify route doing one `getBuffer` of the same response bytes',
        // The same request as the cached one (POST, JSON body, bearer header): only the
        // server's work differs.
        target: {
          port: port(floor.url),
          method: 'POST',
          path: '/floor',
          body: LIST,
          token: twoTiers.token,
        },
      },
      {
        id: 'http_healthz',
        label: '`GET /healthz` (the server, HTTP round trip only)',
        target: {
          port: port(twoTiers.server.url),
          method: 'GET',
          path: '/healthz',
          token: twoTiers.token,
        },
      },
      {
        id: 'http_cached',
        label: 'app request, cache hit, two tiers (the default): the memory tier answers',
        target: app(twoTiers.server.url, twoTiers.token, 'hit'),
      },
      {
        id: 'http_cached_no_access_log',
        label: 'the same, access line off (`VIEWER_CACHE_ACCESS_LOG=off`)',
        target: app(quiet.server.url, quiet.token, 'hit'),
      },
      {
        id: 'http_cached_redis_only',
        label: 'app request, cache hit, Redis only (`VIEWER_CACHE_MEMORY_TIER_BYTES=0`)',
        target: app(redisOnly.server.url, redisOnly.token, 'hit'),
      },
      {
        id: 'http_uncached',
        label: 'preview of the same runnable (never cached: runs the query as the viewer)',
        target: {
          port: port(twoTiers.server.url),
          method: 'POST',
          path: '/api/w/demo/jobs/preview',
          body: LIST,
          token: twoTiers.token,
          expectCache: 'miss',
        },
      },
    ];
    return await measure(client, scenarios, plan);
  } finally {
    client.close();
    await floor.close();
    await redisOnly.server.close();
    await quiet.server.close();
    await twoTiers.server.close();
  }
}

/** The cached app request's first run (a miss, which fills the cache); its response bytes. */
export async function firstRun(base: string, token: string): Promise<Buffer> {
  const res = await fetch(new URL(APP_RUN, base), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: LIST,
  });
  if (res.status !== 200) throw new BenchInvariantError(`first run answered ${res.status}`);
  return Buffer.from(await res.arrayBuffer());
}

/**
 * Latency (one connection, `plan.roundMs` per row per round) and throughput with CPU per
 * request (`HTTP_CONCURRENCY` connections, a fixed number of requests per row per round), both
 * interleaved in rounds, each round in its own order (`roundOrder`).
 */
async function measure(
  client: HttpClient,
  scenarios: readonly HttpScenario[],
  plan: LatencyPlan,
): Promise<HttpRow[]> {
  const warmRounds = Math.max(1, Math.round(plan.warmupMs / plan.roundMs));
  const latencies = new Map(scenarios.map((s) => [s.id, [] as number[]]));
  for (let r = 0; r < warmRounds + plan.rounds; r++) {
    for (const s of roundOrder(scenarios, r)) {
      const batch = { ...s.target, conns: 1, ms: plan.roundMs, minOps: plan.minOpsPerRound };
      const { latenciesUs } = await client.batch(batch);
      if (r >= warmRounds) latencies.get(s.id)!.push(...latenciesUs);
    }
  }
  const loaded = new Map(scenarios.map((s) => [s.id, { requests: 0, wallNs: 0, cpuUs: 0 }]));
  const rounds = Math.max(6, Math.round(plan.rounds / 2));
  const perRound = HTTP_CONCURRENCY * 10;
  for (let r = 0; r < 2 + rounds; r++) {
    for (const s of roundOrder(scenarios, r)) {
      const before = process.cpuUsage();
      const { wallNs } = await client.batch({
        ...s.target,
        conns: HTTP_CONCURRENCY,
        ops: perRound,
      });
      const cpu = process.cpuUsage(before);
      if (r < 2) continue;
      const acc = loaded.get(s.id)!;
      acc.requests += perRound;
      acc.wallNs += wallNs;
      acc.cpuUs += cpu.user + cpu.system;
    }
  }
  const stats = new Map(
    scenarios.map((s) => {
      const sorted = Float64Array.from(latencies.get(s.id)!).sort();
      const at = (p: number) =>
        sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)]!;
      const acc = loaded.get(s.id)!;
      return [
        s.id,
        {
          ops: sorted.length,
          p50Us: at(0.5),
          p99Us: at(0.99),
          reqPerSec: (acc.requests * 1e9) / acc.wallNs,
          cpuUs: acc.cpuUs / acc.requests,
        },
      ];
    }),
  );
  const healthz = stats.get('http_healthz')!;
  const floor = stats.get('http_fastify_get')!;
  return scenarios.map((s) => {
    const st = stats.get(s.id)!;
    return {
      id: s.id,
      label: s.label,
      ...st,
      ratio: st.p50Us / healthz.p50Us,
      floorRatio: st.p50Us / floor.p50Us,
      floorThroughput: st.reqPerSec / floor.reqPerSec,
    };
  });
}

/** The forked client: one batch at a time, each answered with its latencies. */
export class HttpClient {
  readonly #child: ChildProcess;
  #next = 0;

  private constructor(child: ChildProcess) {
    this.#child = child;
  }

  static async start(): Promise<HttpClient> {
    // The same loader flags as this process (tsx), so the client runs from its TypeScript.
    const child = fork(CLIENT, [], { execArgv: process.execArgv, stdio: 'inherit' });
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    // A failed send (the channel closed) is reported as an 'error' event; the client's exit,
    // which follows, fails the batch waiting on it.
    child.on('error', () => {});
    return new HttpClient(child);
  }

  batch(request: Omit<BatchRequest, 'id'>): Promise<BatchResult> {
    const id = ++this.#next;
    return new Promise((resolve, reject) => {
      const onMessage = (result: BatchResult) => {
        if (result.id !== id) return;
        this.#child.off('message', onMessage).off('exit', onExit);
        if (result.error !== undefined) reject(new BenchInvariantError(result.error));
        else resolve(result);
      };
      const onExit = (code: number | null) => {
        this.#child.off('message', onMessage);
        reject(new Error(`the HTTP bench client exited (${code})`));
      };
      this.#child.on('message', onMessage).once('exit', onExit);
      this.#child.send({ ...request, id });
    });
  }

  close(): void {
    this.#child.disconnect();
  }
}

/**
 * The reference server as the HTTP rows measure it: in this process, on a database of its own
 * named after `prefix`, with its real logger (level info, JSON lines to /dev/null), the demo
 * world, and `VIEWER_CACHE_MEMORY_TIER_BYTES` from the environment (two tiers unless `0`),
 * overridden by `env`. Returns it with alice's API token.
 */
export async function startBenchServer(
  postgres: BenchPostgres,
  prefix: string,
  redisUrl: string,
  redisPrefix: string,
  env: Record<string, string | undefined> = {},
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
    ...env,
  });
  process.env['VIEWER_CACHE_DEMO_ROLE_PREFIX'] = prefix;
  const server = await startServer(config, createServerLogger(config, '/dev/null'));
  return { server, token: server.demoTokens['alice@example.com']! };
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

/**
 * {@link httpBench} in a fresh process of its own, on the Postgres at `databaseUrl` (a
 * superuser URL): `npm run bench` measures its other sections first, and their leftovers in the
 * heap (a million-entry store, ten thousand viewers' catalog) made the servers' collector work
 * for them.
 */
export function httpBenchAlone(databaseUrl: string, quick: boolean): Promise<HttpRow[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        ...process.execArgv,
        fileURLToPath(import.meta.url),
        '--json',
        ...(quick ? ['--quick'] : []),
      ],
      { env: { ...process.env, DATABASE_URL: databaseUrl }, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('exit', (code) => {
      const last = out.trim().split('\n').at(-1) ?? '';
      if (code === 0 && last.startsWith('[')) resolve(JSON.parse(last) as HttpRow[]);
      else reject(new Error(`the HTTP bench exited with ${code}`));
    });
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const quick = process.argv.includes('--quick');
  const plan: LatencyPlan = quick
    ? { warmupMs: 200, rounds: 10, roundMs: 30, minOpsPerRound: 5 }
    : { warmupMs: 500, rounds: 40, roundMs: 40, minOpsPerRound: 10 };
  const prefix = `vchb${process.pid}_`;
  const postgres = await benchPostgres();
  const redis = rawRedis();
  try {
    const rows = await httpBench(postgres, prefix, REDIS_URL, `${RUN_PREFIX}http:`, plan);
    console.log(process.argv.includes('--json') ? JSON.stringify(rows) : httpTable(rows));
  } finally {
    await postgres.close(prefix);
    await deleteRunKeys(redis);
    redis.disconnect();
  }
  process.exit(0);
}
