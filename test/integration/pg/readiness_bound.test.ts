import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { redisAddress } from '../../helpers/redis.js';
import { ServerFleet } from '../../helpers/server_fleet.js';
import { isRecord, pollUntil, ServerProcess } from '../../helpers/server_process.js';
import { type ProxyMode, TcpProxy } from '../../helpers/tcp_proxy.js';

// /readyz answers within its bound (each dependency asked at once, each answer waited for at
// most 0.8 s) whatever PostgreSQL, Redis or the fleet is doing, and says which is which: a
// queue-mode server whose Redis stops answering used to leave the probe hanging until Redis
// came back. A prober that retries does not pile questions up on the hung dependency.

const prefix = uniquePrefix();
let db: TestDatabase;
let fleet: ServerFleet;
let redis: TcpProxy;
let postgres: TcpProxy;
let url = '';

/** Far above the bound: a probe that takes this long is a hang, and fails the test. */
const HANG_MS = 5000;

async function probe(): Promise<{ ms: number; status: number; checks: Record<string, unknown> }> {
  const started = performance.now();
  const response = await fetch(new URL('/readyz', url), { signal: AbortSignal.timeout(HANG_MS) });
  const body = (await response.json()) as unknown;
  const checks = isRecord(body) && isRecord(body['checks']) ? body['checks'] : {};
  return { ms: Math.round(performance.now() - started), status: response.status, checks };
}

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  const { host, port, via } = redisAddress(inject('redisUrl'));
  redis = await TcpProxy.start({ host, port });
  const pgUrl = new URL(db.url);
  postgres = await TcpProxy.start({ host: pgUrl.hostname, port: Number(pgUrl.port || 5432) });
  pgUrl.hostname = '127.0.0.1';
  pgUrl.port = String(postgres.port);
  fleet = await ServerFleet.start({
    databaseUrl: pgUrl.toString(),
    prefix,
    secretKey: randomBytes(32).toString('hex'),
    redisUrl: via(redis.port),
    redisPrefix: `vc-test:readybound:${prefix}`,
    count: 1,
    env: {
      VIEWER_CACHE_EXECUTION: 'queue',
      VIEWER_CACHE_QUEUE_PREFIX: `{${prefix}q}`,
      // The listener goes straight to Postgres: this file stops the pool's path only.
      VIEWER_CACHE_LISTEN_URL: db.url,
    },
  });
  url = fleet.urls[0]!;
}, 180_000);

afterAll(async () => {
  await redis?.setMode('forward');
  await postgres?.setMode('forward');
  await fleet?.stop();
  await redis?.stop();
  await postgres?.stop();
  await db?.drop();
});

describe('/readyz answers within its bound, with each dependency’s state', {
  timeout: 120_000,
}, () => {
  const cases: [string, () => TcpProxy, ProxyMode, string, string[]][] = [
    ['Redis hangs', () => redis, 'blackhole', 'redis', ['down', 'timeout']],
    ['Redis refuses', () => redis, 'refuse', 'redis', ['down', 'reconnecting', 'connecting']],
    ['PostgreSQL hangs', () => postgres, 'blackhole', 'postgres', ['timeout']],
    ['PostgreSQL refuses', () => postgres, 'refuse', 'postgres', ['down']],
  ];
  it.each(cases)(
    '%s: every probe answers, 503, naming it',
    async (_, proxyOf, mode, name, states) => {
      const proxy = proxyOf();
      // Up: ready but for the fleet (no worker in this file).
      const up = await probe();
      expect(up.checks).toMatchObject({ postgres: 'ok', redis: 'ok', workers: 'none' });
      await proxy.setMode(mode);
      try {
        const times: number[] = [];
        for (let i = 0; i < 5; i++) {
          const answer = await probe();
          times.push(answer.ms);
          expect(answer.status).toBe(503);
          expect(states, `${name} is ${String(answer.checks[name])}`).toContain(
            answer.checks[name],
          );
        }
        // A prober that retries at once, 20 at a time: one question in flight per dependency,
        // so the hung one gains no pile of connections.
        const connectionsBefore = proxy.connections;
        const burst = await Promise.all(Array.from({ length: 20 }, probe));
        for (const answer of burst) expect(answer.status).toBe(503);
        expect(proxy.connections).toBeLessThanOrEqual(connectionsBefore + 2);
        console.log(
          `readyz, ${_}: ${times.join(', ')} ms (burst max ${Math.max(...burst.map((b) => b.ms))} ms) ${JSON.stringify(burst[0]!.checks)}`,
        );
      } finally {
        await proxy.setMode('forward');
      }
      // Back: ready again but for the fleet.
      const deadline = Date.now() + 30_000;
      for (;;) {
        const back = await probe();
        if (back.checks['postgres'] === 'ok' && back.checks['redis'] === 'ok') break;
        if (Date.now() > deadline) throw new Error(`not back: ${JSON.stringify(back.checks)}`);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    },
  );

  it("a worker's /healthz reflects its queue connection", async () => {
    const worker = new ServerProcess(fleet.cliEnv, ['--port', '0'], 'worker');
    try {
      const workerUrl = (await worker.ready).url;
      const health = async () => {
        const response = await fetch(new URL('/healthz', workerUrl), {
          signal: AbortSignal.timeout(HANG_MS),
        });
        return {
          status: response.status,
          body: (await response.json()) as Record<string, unknown>,
        };
      };
      expect(await health()).toMatchObject({ status: 200, body: { ok: true, queue: 'ok' } });
      for (const mode of ['refuse', 'blackhole'] as const) {
        await redis.setMode(mode);
        await pollUntil(async () => (await health()).status === 503, 20_000);
        expect((await health()).body).toMatchObject({ ok: false });
        await redis.setMode('forward');
        await pollUntil(async () => (await health()).status === 200, 30_000);
      }
    } finally {
      await redis.setMode('forward');
      await worker.kill();
    }
  });
});
