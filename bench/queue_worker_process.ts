// One queue worker process of the queue scenarios (queue_bench.ts): DATABASE_URL, REDIS_URL,
// QUEUE_PREFIX, CACHE_PREFIX, CONCURRENCY. Says `ready` on stdout, stops on SIGTERM.
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
  concurrency: Number(env('CONCURRENCY') || '8'),
});
await worker.ready();
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  void worker.close().then(async () => {
    await store.close();
    await pool.end();
    redis.disconnect();
    process.exit(0);
  });
});
