/**
 * The work one queued miss costs, counted rather than timed: `npx tsx bench/queue_miss_work.ts`
 * with DATABASE_URL (else an embedded PostgreSQL). Starts a private `redis-server` (so other
 * clients of a shared Redis cannot pollute `INFO commandstats`), a database of its own, and a
 * server and a worker in this process wired as `viewer-cache serve`/`worker` wire them (result
 * cache, sealed store, shared job tokens). Over N misses it prints the PostgreSQL transactions
 * (`pg_stat_database.xact_commit + xact_rollback` of that database) and the Redis commands
 * (`INFO commandstats`, by command) per miss, beside a bare BullMQ round trip and an in-process
 * miss measured the same way. `QUEUE_WORK_N` overrides N (default 100); `--json`: one JSON line
 * (`npm run bench` runs it so).
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import pg from 'pg';
import {
  createExecutor,
  createQueueExecutor,
  createQueueWorker,
  RedisCacheStore,
  SharedJobTokens,
  withResultCache,
} from '../src/index.js';
import { benchPostgres } from './postgres_fixture.js';
import { bareBullmq, privateRedis } from './private_redis.js';
import { QUEUE_BENCH_RUNNABLES, QUEUE_BENCH_SECRET } from './queue_runnables.js';

const N = Number(process.env['QUEUE_WORK_N'] ?? '100');
const tag = randomBytes(4).toString('hex');
const ORIGIN = { kind: 'app', session: { email: 'bench@example.com' } } as const;

/** Total calls per command (INFO commandstats). */
async function commandStats(redis: Redis): Promise<Map<string, number>> {
  const text = await redis.info('commandstats');
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) out.set(m[1]!, Number(m[2]));
  return out;
}

/** Transactions of `database` so far, once the statistics stop moving (they flush lazily). */
async function transactions(admin: pg.Pool, database: string): Promise<number> {
  let last = -1;
  for (let i = 0; i < 6; i++) {
    await admin.query('select pg_stat_clear_snapshot()');
    const { rows } = await admin.query<{ n: string }>(
      'select xact_commit + xact_rollback as n from pg_stat_database where datname = $1',
      [database],
    );
    const n = Number(rows[0]?.n ?? 0);
    if (n === last) return n;
    last = n;
    // An idle backend flushes its statistics within 10 s (PGSTAT_IDLE_INTERVAL).
    await new Promise((resolve) => setTimeout(resolve, 11_000));
  }
  return last;
}

export interface Counted {
  readonly label: string;
  readonly pg: number;
  readonly redis: number;
  readonly byCommand: string;
}

async function count(
  label: string,
  admin: pg.Pool,
  database: string,
  stats: Redis,
  body: () => Promise<void>,
): Promise<Counted> {
  const pg0 = await transactions(admin, database);
  const r0 = await commandStats(stats);
  await body();
  const pg1 = await transactions(admin, database);
  const r1 = await commandStats(stats);
  const delta = new Map<string, number>();
  for (const [cmd, n] of r1) {
    // The statistics reads themselves (info) are not the miss's.
    if (cmd === 'info') continue;
    const d = n - (r0.get(cmd) ?? 0);
    if (d > 0) delta.set(cmd, d / N);
  }
  // The transactions() probes themselves run in the admin database, not this one.
  const total = [...delta.values()].reduce((a, b) => a + b, 0);
  const byCommand = [...delta]
    .sort((a, b) => b[1] - a[1])
    .map(([cmd, n]) => `${cmd} ${n.toFixed(2)}`)
    .join(', ');
  return { label, pg: (pg1 - pg0) / N, redis: total, byCommand };
}

const { url: redisUrl, child: redisChild } = await privateRedis();
const pgServer = await benchPostgres();
const database = `vc_queue_work_${tag}`;
await pgServer.createDatabase(database);
const databaseUrl = pgServer.url(database);
const admin = new pg.Pool({ connectionString: pgServer.url('postgres'), max: 1 });
const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
pool.on('error', () => {});
const redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
const stats = new Redis(redisUrl);
const closers: (() => Promise<unknown>)[] = [];
const results: Counted[] = [];
try {
  const { migrateQueue } = await import('../src/index.js');
  await migrateQueue(pool);
  const seal = { secretKey: QUEUE_BENCH_SECRET };
  const store = () => {
    const s = new RedisCacheStore({ redis: redisUrl, prefix: `vc-work:${tag}:` });
    closers.push(() => s.close());
    return s;
  };
  const local = createExecutor({ runnables: QUEUE_BENCH_RUNNABLES });
  const inProcess = withResultCache(local, { store: store(), seal });
  const queue = createQueueExecutor({
    executor: local,
    redis,
    secretKey: QUEUE_BENCH_SECRET,
    prefix: `{vc-work-${tag}}`,
  });
  closers.push(() => queue.close());
  await queue.ready();
  const queued = withResultCache(queue, { store: store(), seal });
  const workerCache = withResultCache(
    createExecutor({
      runnables: QUEUE_BENCH_RUNNABLES,
      jobTokens: new SharedJobTokens({
        redis,
        prefix: `{vc-work-${tag}}`,
        secretKey: QUEUE_BENCH_SECRET,
      }),
    }),
    { store: store(), seal },
  );
  const worker = createQueueWorker({
    executor: workerCache,
    redis,
    secretKey: QUEUE_BENCH_SECRET,
    prefix: `{vc-work-${tag}}`,
    workspaces: ['bench'],
    concurrency: 8,
  });
  closers.push(() => worker.close());
  await worker.ready();
  const miss = (through: typeof queued, registry: typeof local, args: Record<string, unknown>) =>
    through.run(
      registry.createJob({
        workspace: 'bench',
        path: 'work',
        runAs: 'pub@example.com',
        origin: ORIGIN,
        args,
      }),
    );
  for (let i = 0; i < 10; i++) await miss(queued, queue, { warm: i });
  results.push(
    await count('queued miss', admin, database, stats, async () => {
      for (let i = 0; i < N; i++) await miss(queued, queue, { q: i });
    }),
    await count('in-process miss', admin, database, stats, async () => {
      for (let i = 0; i < N; i++) await miss(inProcess, local, { l: i });
    }),
  );
  // A bare BullMQ round trip: add a job, a worker returns it, the caller awaits it.
  const bare = await bareBullmq(redis, `{vc-bare-${tag}}`);
  closers.push(() => bare.close());
  const roundTrip = bare.roundTrip;
  for (let i = 0; i < 10; i++) await roundTrip(i);
  results.push(
    await count('bare BullMQ round trip', admin, database, stats, async () => {
      for (let i = 0; i < N; i++) await roundTrip(i);
    }),
  );
} finally {
  for (const close of closers.reverse()) await close().catch(() => {});
  redis.disconnect();
  stats.disconnect();
  await pool.end();
  await admin.end();
  await pgServer.close('vc_queue_work_');
  redisChild.kill('SIGTERM');
}
if (process.argv.includes('--json')) {
  process.stdout.write(`${JSON.stringify({ n: N, rows: results })}\n`);
} else {
  process.stdout.write(`per miss, over ${N} sequential misses each:\n`);
  for (const r of results) {
    process.stdout.write(
      `${r.label.padEnd(24)} PostgreSQL transactions ${r.pg.toFixed(2).padStart(5)}   Redis commands ${r.redis.toFixed(2).padStart(6)}\n    ${r.byCommand}\n`,
    );
  }
}
process.exit(0);
