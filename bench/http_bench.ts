/**
 * HTTP-level scenarios: the reference server, in process, on the run's Postgres and
 * Redis. A cached request beside an uncached one (a preview of the same runnable: it runs the
 * query as the viewer every time) and beside `GET /healthz`, the cost of HTTP alone.
 */
import { Agent, request } from 'node:http';
import { pino } from 'pino';
import { readConfig } from '../src/server/config.js';
import { startServer } from '../src/server/runtime.js';
import { BenchInvariantError, type LatencyPlan, measureLatency, type Scenario } from './helpers.js';
import type { BenchPostgres } from './postgres_fixture.js';

export interface HttpRow {
  readonly id: string;
  readonly label: string;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly ops: number;
  readonly ratio: number;
}

export async function httpBench(
  postgres: BenchPostgres,
  prefix: string,
  redisUrl: string,
  redisPrefix: string,
  plan: LatencyPlan,
): Promise<HttpRow[]> {
  const database = `${prefix}http`;
  await postgres.createDatabase(database);
  // The demo's roles are cluster-wide: give them the run's prefix.
  process.env['VIEWER_CACHE_DEMO_ROLE_PREFIX'] = prefix;
  const config = readConfig({
    ...process.env,
    DATABASE_URL: postgres.url(database),
    REDIS_URL: redisUrl,
    VIEWER_CACHE_REDIS_PREFIX: redisPrefix,
    VIEWER_CACHE_REDIS_TIMEOUT_MS: '2000',
    VIEWER_CACHE_SECRET_KEY: 'bench-http-secret-0123456789abcdef-0123456789',
    PORT: '0',
    HOST: '127.0.0.1',
  });
  const server = await startServer(config, pino({ level: 'silent' }));
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const { port } = new URL(server.url);
  const alice = server.demoTokens['alice@example.com']!;

  const call = (method: string, path: string, body?: string) =>
    new Promise<{ status: number; cache: string | undefined }>((resolve, reject) => {
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
          res.on('data', () => {});
          res.on('end', () => {
            const cache = res.headers['x-viewer-cache'];
            resolve({
              status: res.statusCode ?? 0,
              cache: typeof cache === 'string' ? cache : undefined,
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
    (method: string, path: string, body: string | undefined, cache?: string) => async () => {
      const res = await call(method, path, body);
      if (res.status !== 200 || (cache !== undefined && res.cache !== cache)) {
        throw new BenchInvariantError(`${path}: ${res.status} ${String(res.cache)}`);
      }
    };
  await expect('POST', '/api/w/demo/apps/orders-dashboard/run', list)();

  const scenarios: Scenario[] = [
    {
      id: 'http_healthz',
      label: '`GET /healthz` (HTTP round trip only)',
      async: true,
      op: expect('GET', '/healthz', undefined),
    },
    {
      id: 'http_cached',
      label: 'app request, cache hit (stored bytes written as they are)',
      async: true,
      op: expect('POST', '/api/w/demo/apps/orders-dashboard/run', list, 'hit'),
    },
    {
      id: 'http_uncached',
      label: 'preview of the same runnable (never cached: runs the query as the viewer)',
      async: true,
      op: expect('POST', '/api/w/demo/jobs/preview', list, 'miss'),
    },
  ];
  try {
    const stats = await measureLatency(scenarios, plan);
    const base = stats.get('http_healthz')!;
    return scenarios.map((s) => {
      const st = stats.get(s.id)!;
      return {
        id: s.id,
        label: s.label,
        p50Us: st.p50Us,
        p99Us: st.p99Us,
        ops: st.ops,
        ratio: st.p50Us / base.p50Us,
      };
    });
  } finally {
    agent.destroy();
    await server.close();
  }
}
