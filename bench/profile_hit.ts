/**
 * `npx tsx bench/profile_hit.ts <sealed|floor|plain|store|raw> [bytes] [seconds]`: one scenario
 * alone at 64 concurrent callers, for a CPU or heap profile (`node --cpu-prof --import tsx …`) or
 * a GC trace (`--trace-gc`). Prints ops/s, the CPU time per op and the GCs per op. `plain` is an
 * unsealed `withResultCache` hit; `store` the same entries read by `RedisCacheStore.get` alone
 * (keys derived beforehand); `raw` by the shared client's `getBuffer`: the three tell the cache's
 * share of a hit from the store's and from ioredis's.
 */
import { PerformanceObserver } from 'node:perf_hooks';
import { cachedResultPath, RedisCacheStore, withResultCache } from '../src/index.js';
import {
  deleteRunKeys,
  GuardedExecutor,
  RUN_PREFIX,
  sharedRedis,
  sizeFixture,
} from './fixtures.js';
import { sealedFloor } from './sealed_floor.js';

const [which = 'sealed', size = '1024', seconds = '8'] = process.argv.slice(2);
const fx = sizeFixture(Number(size));
const redis = sharedRedis();
let op: (i: number) => Promise<unknown>;
if (which === 'raw' || which === 'store') {
  const prefix = `${RUN_PREFIX}prof:`;
  const store = new RedisCacheStore({ redis, prefix, commandTimeout: '2s' });
  const cached = withResultCache(new GuardedExecutor('profile', fx.json), { store, seal: false });
  for (const job of fx.jobs) await cached.run(job);
  const keys = fx.jobs.map((job) => cachedResultPath(job));
  const prefixed = keys.map((key) => prefix + key);
  op =
    which === 'store'
      ? (i) => store.get(keys[i % keys.length]!)
      : (i) => redis.getBuffer(prefixed[i % prefixed.length]!);
} else if (which === 'floor') {
  op = (await sealedFloor(fx, redis)).scenarios[0]!.op as (i: number) => Promise<unknown>;
} else {
  const store = new RedisCacheStore({ redis, prefix: `${RUN_PREFIX}prof:`, commandTimeout: '2s' });
  const cached = withResultCache(new GuardedExecutor('profile', fx.json), {
    store,
    seal:
      which === 'sealed'
        ? { secretKey: 'bench-only secret, 32 bytes or more, not for use' }
        : false,
  });
  for (const job of fx.jobs) await cached.run(job);
  op = (i) => cached.run(fx.jobs[i % fx.jobs.length]!);
}
let done = 0;
const until = Date.now() + Number(seconds) * 1000;
// Garbage collections during the run, and the time they took.
let gcs = 0;
let gcMs = 0;
const observer = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    gcs++;
    gcMs += entry.duration;
  }
});
observer.observe({ entryTypes: ['gc'] });
const cpu0 = process.cpuUsage();
const started = process.hrtime.bigint();
await Promise.all(
  Array.from({ length: 64 }, async (_, c) => {
    for (let i = c; Date.now() < until; i += 64) {
      await op(i);
      done++;
    }
  }),
);
const ns = Number(process.hrtime.bigint() - started);
const cpu = process.cpuUsage(cpu0);
observer.disconnect();
console.log(
  JSON.stringify({
    which,
    size,
    ops: done,
    opsPerSec: Math.round((done * 1e9) / ns),
    cpuUsPerOp: +((cpu.user + cpu.system) / done).toFixed(1),
    gcPer1kOps: +((gcs * 1000) / done).toFixed(2),
    gcUsPerOp: +((gcMs * 1000) / done).toFixed(2),
  }),
);
await deleteRunKeys(redis);
redis.disconnect();
process.exit(0);
