// A queue worker in a process of its own, for the fault tests (queue_faults.test.ts): the
// library's worker over the in-process executor, with a slow runnable that says on stdout when
// it started (so a test can kill the process mid-job) and one that reads the viewer's rows.
// Configured by environment: DATABASE_URL (the orders test database), REDIS_URL, QUEUE_PREFIX,
// CACHE_PREFIX, SECRET_KEY, LOCK_MS.

import { Redis } from 'ioredis';
import {
  createDatatables,
  createExecutor,
  createQueueWorker,
  RedisCacheStore,
  SharedJobTokens,
  withResultCache,
} from '../../src/index.js';
import { SLOW_RUNNABLES } from './queue_slow_runnables.js';

const env = (name: string) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
};

const datatables = await createDatatables({
  connection: env('DATABASE_URL'),
  secretKey: env('SECRET_KEY'),
  migrate: false,
  pools: { prepareAhead: false },
});
const redis = new Redis(env('REDIS_URL'), { maxRetriesPerRequest: null });
redis.on('error', () => {});
const executor = createExecutor({
  datatables,
  jobTokens: new SharedJobTokens({
    redis,
    prefix: env('QUEUE_PREFIX'),
    secretKey: env('SECRET_KEY'),
  }),
  runnables: SLOW_RUNNABLES,
});
const store = new RedisCacheStore({ redis: env('REDIS_URL'), prefix: env('CACHE_PREFIX') });
const cached = withResultCache(executor, {
  store,
  fingerprint: (job) => datatables.fingerprint(job),
  seal: { secretKey: env('SECRET_KEY') },
});
const worker = createQueueWorker({
  executor: cached,
  redis,
  secretKey: env('SECRET_KEY'),
  prefix: env('QUEUE_PREFIX'),
  lockDuration: Number(env('LOCK_MS')),
  concurrency: 2,
  onFinished: (outcome) => process.stdout.write(`${JSON.stringify({ finished: outcome.code })}\n`),
});
await worker.ready();
process.stdout.write(`${JSON.stringify({ url: 'ready', worker: worker.id })}\n`);
const stop = () => {
  void worker
    .close()
    .then(() => Promise.allSettled([store.close(), datatables.close()]))
    .then(() => {
      redis.disconnect();
      process.exit(0);
    });
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
