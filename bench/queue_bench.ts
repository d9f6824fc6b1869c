/**
 * Jobs on workers (issue 20), short runs: `npx tsx bench/queue_bench.ts` with REDIS_URL (and
 * DATABASE_URL, else an embedded PostgreSQL). Prints, as ratios within this run:
 * - a miss through the queue (one worker process) vs in process: added latency p50 / p99;
 * - throughput of misses with 1 and 2 worker processes (32 callers);
 * - the hit path: a hit through a queue-mode cache vs an in-process one (hits never enqueue).
 * The runnable spends about 1 ms of CPU and returns a small result; no data table is involved,
 * so what is measured is the queue's own cost.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import pg from 'pg';
import {
  type CachedExecutor,
  createExecutor,
  createQueueExecutor,
  type Executor,
  migrateQueue,
  RedisCacheStore,
  withResultCache,
} from '../src/index.js';
import { benchPostgres } from './postgres_fixture.js';
import { QUEUE_BENCH_RUNNABLES, QUEUE_BENCH_SECRET } from './queue_runnables.js';

const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const tag = randomBytes(4).toString('hex');
const QUEUE_PREFIX = `{vc-bench-${tag}}`;
const CACHE_PREFIX = `vc-bench:${tag}:`;
const ORIGIN = { kind: 'app', session: { email: 'bench@example.com' } } as const;

const quantile = (sorted: number[], q: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;

async function latencies(n: number, once: (i: number) => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await once(i);
    out.push(performance.now() - t);
  }
  return out.sort((a, b) => a - b);
}

async function throughput(total: number, callers: number, once: (i: number) => Promise<unknown>) {
  let next = 0;
  const t = performance.now();
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < total) await once(next++);
    }),
  );
  return total / ((performance.now() - t) / 1000);
}

function run(cache: CachedExecutor, registry: Executor, args: Record<string, unknown>) {
  return cache.run(
    registry.createJob({
      workspace: 'bench',
      path: 'work',
      runAs: 'pub@example.com',
      origin: ORIGIN,
      args,
    }),
  );
}

async function startWorker(databaseUrl: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'bench/queue_worker_process.ts'], {
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      REDIS_URL,
      QUEUE_PREFIX,
      CACHE_PREFIX,
      CONCURRENCY: '8',
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => line === 'ready' && resolve());
    child.once('exit', (code) => reject(new Error(`worker exited ${code}`)));
  });
  return child;
}

async function stopWorker(child: ChildProcess) {
  child.kill('SIGTERM');
  await once(child, 'exit');
}

const pgServer = await benchPostgres();
const database = `vc_queue_bench_${tag}`;
await pgServer.createDatabase(database);
const databaseUrl = pgServer.url(database);
const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
await migrateQueue(pool);
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
const stores: RedisCacheStore[] = [];
const store = () => {
  const s = new RedisCacheStore({ redis: REDIS_URL, prefix: CACHE_PREFIX, commandTimeout: 5000 });
  stores.push(s);
  return s;
};
const seal = { secretKey: QUEUE_BENCH_SECRET };
const local = createExecutor({ runnables: QUEUE_BENCH_RUNNABLES });
const inProcess = withResultCache(local, { store: store(), seal });
const queue = createQueueExecutor({
  executor: local,
  pool,
  redis,
  secretKey: QUEUE_BENCH_SECRET,
  prefix: QUEUE_PREFIX,
});
await queue.ready();
const queued = withResultCache(queue, { store: store(), seal });

const N = Number(process.env['QUEUE_BENCH_N'] ?? '300');
const rows: string[][] = [];
const ms = (v: number) => v.toFixed(2);
try {
  const workers = [await startWorker(databaseUrl)];
  // Warm both paths.
  for (let i = 0; i < 30; i++) {
    await run(inProcess, local, { warm: i, side: 'l' });
    await run(queued, queue, { warm: i, side: 'q' });
  }
  const base = await latencies(N, (i) => run(inProcess, local, { miss: i, side: 'l' }));
  const viaQueue = await latencies(N, (i) => run(queued, queue, { miss: i, side: 'q' }));
  for (const [label, q] of [
    ['p50', 0.5],
    ['p99', 0.99],
  ] as const) {
    const b = quantile(base, q);
    const v = quantile(viaQueue, q);
    rows.push([
      `miss ${label}`,
      `${ms(b)} ms`,
      `${ms(v)} ms`,
      `+${ms(v - b)} ms`,
      `${(v / b).toFixed(2)}×`,
    ]);
  }
  const total = N * 2;
  const one = await throughput(total, 32, (i) => run(queued, queue, { t1: i }));
  workers.push(await startWorker(databaseUrl));
  const two = await throughput(total, 32, (i) => run(queued, queue, { t2: i }));
  const inProc = await throughput(total, 32, (i) => run(inProcess, local, { t0: i }));
  rows.push([
    'misses/s, 32 callers',
    `${inProc.toFixed(0)} (in process)`,
    `${one.toFixed(0)} (1 worker)`,
    `${two.toFixed(0)} (2 workers)`,
    `${(two / one).toFixed(2)}× (2 vs 1)`,
  ]);
  // Hits: the same entry read through either cache; the queue is never touched.
  await run(queued, queue, { hit: 1 });
  const hitsBase = await latencies(N * 4, () => run(inProcess, local, { hit: 1 }));
  const hitsQueue = await latencies(N * 4, () => run(queued, queue, { hit: 1 }));
  const hb = quantile(hitsBase, 0.5);
  const hq = quantile(hitsQueue, 0.5);
  rows.push([
    'hit p50',
    `${ms(hb)} ms`,
    `${ms(hq)} ms`,
    `${ms(hq - hb)} ms`,
    `${(hq / hb).toFixed(2)}×`,
  ]);
  for (const w of workers) await stopWorker(w);
} finally {
  await queue.close();
  for (const s of stores) await s.close();
  let cursor = '0';
  for (const match of [`${QUEUE_PREFIX}*`, `${CACHE_PREFIX}*`]) {
    do {
      const [nextCursor, keys] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000);
      cursor = nextCursor;
      if (keys.length > 0) await redis.del(...keys);
    } while (cursor !== '0');
  }
  redis.disconnect();
  await pool.end();
  await pgServer.close('vc_queue_bench_');
}
console.log('| | in process | queue | added | ratio |\n|---|---|---|---|---|');
for (const row of rows) console.log(`| ${row.join(' | ')} |`);
