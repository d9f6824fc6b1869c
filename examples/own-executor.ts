import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { createViewerCache, type Job, RedisCacheStore } from 'viewer-cache';

// The executor you already have: it runs a job and returns its result.
async function myExecutor(job: Job): Promise<unknown> {
  return { report: job.runnable.path, quarter: job.args['quarter'], computedAt: Date.now() };
}

// Who is asking (from your session), and how long the answer may be reused.
const alice = { kind: 'app', session: { email: 'alice@acme.test' } } as const;
const run = { path: 'f/sales/report', args: { quarter: 'Q3' }, origin: alice, ttl: '60s' };

// In process memory (the default store)…
const memory = createViewerCache({ executor: myExecutor });
console.log((await memory.run(run)).fromCache, (await memory.run(run)).fromCache); // false true
await memory.close();

// …or Redis, shared by every process; sealed, so whoever can write to Redis cannot forge entries.
const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const shared = createViewerCache({
  executor: myExecutor,
  store: new RedisCacheStore({ redis, prefix: `example:${randomBytes(4).toString('hex')}:` }),
  seal: { secretKey: process.env.VIEWER_CACHE_SECRET_KEY ?? randomBytes(32).toString('hex') },
});
console.log((await shared.run(run)).fromCache, (await shared.run(run)).fromCache); // false true
await shared.close();
await redis.quit();
