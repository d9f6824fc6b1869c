// One queue worker process of the queue scenarios (queue_bench.ts): DATABASE_URL, REDIS_URL,
// QUEUE_PREFIX, CACHE_PREFIX, CONCURRENCY. Says `ready` on stdout, stops on SIGTERM.
import { Worker } from 'bullmq';
import { Redis } from 'ioredis';
import pg from 'pg';
import {
  createExecutor,
  createQueueWorker,
  RedisCacheStore,
  withResultCache,
} from '../src/index.js';
import { QUEUE_BENCH_RUNNABLES, QUEUE_BENCH_SECRET } from './queue_runnables.js';

const env = (name: string) => process.env[name] ?? '';
const pool = new pg.Pool({ connectionString: env('DATABASE_URL'), max: 8 });
pool.on('error', () => {});
const redis = new Redis(env('REDIS_URL'), { maxRetriesPerRequest: null });
redis.on('error', () => {});
const store = new RedisCacheStore({ redis: env('REDIS_URL'), prefix: env('CACHE_PREFIX') });
const cached = withResultCache(createExecutor({ runnables: QUEUE_BENCH_RUNNABLES }), {
  store,
  seal: { secretKey: QUEUE_BENCH_SECRET },
});
const worker = createQueueWorker({
  executor: cached,
  redis,
  secretKey: QUEUE_BENCH_SECRET,
  prefix: env('QUEUE_PREFIX'),
  workspaces: ['bench'],
  concurrency: Number(env('CONCURRENCY') || '8'),
});
// The floors beside it: a bare BullMQ worker (queue_bench.ts's bare round trips), on the same
// Redis, in this same process.
const bareConnection = redis.duplicate();
bareConnection.on('error', () => {});
// Jobs named `work` run the same ~1 ms runnable first (the fair floor for throughput: the same
// work per job, none of ours around it); the others return their data at once.
const work = (QUEUE_BENCH_RUNNABLES['work'] as { fn: (args: Record<string, unknown>) => unknown })
  .fn;
const bare = new Worker('bare', async (job) => (job.name === 'work' ? work(job.data) : job.data), {
  connection: bareConnection,
  prefix: env('QUEUE_PREFIX'),
  concurrency: Number(env('CONCURRENCY') || '8'),
});
bare.on('error', () => {});
await Promise.all([worker.ready(), bare.waitUntilReady()]);
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  void Promise.all([worker.close(), bare.close()]).then(async () => {
    await store.close();
    await pool.end();
    redis.disconnect();
    bareConnection.disconnect();
    process.exit(0);
  });
});
