/**
 * `npx tsx bench/redis_process.ts <raw|hit> [bytes] [seconds]`: one Redis row alone in its own
 * process, 64 concurrent callers, reporting CPU time and garbage-collection time per op.
 *
 * Why beside `npm run bench`: there, every row shares one heap, so garbage one row leaves
 * behind is collected on another row's time (a store that kept settled replies alive slowed the
 * raw GET baseline too, and the ratio between them hid it). CPU per op is also steadier than
 * wall time on a shared machine. Compare runs of `raw` and `hit`, alternated, on one checkout;
 * or `hit` on two checkouts. Keys are written under the run's prefix and deleted at the end.
 */
import { PerformanceObserver } from 'node:perf_hooks';
import { RedisCacheStore, withResultCache } from '../src/index.js';
import { deleteRunKeys, GuardedExecutor, sharedRedis, sizeFixture } from './fixtures.js';
import { OURS_REDIS_PREFIX, redisHit } from './redis_hit.js';

const CALLERS = 64;
const which = process.argv[2];
if (which !== 'raw' && which !== 'hit') {
  console.error('usage: redis_process.ts <raw|hit> [bytes=1024] [seconds=4]');
  process.exit(2);
}
const bytes = Number(process.argv[3] ?? 1024);
const seconds = Number(process.argv[4] ?? 4);

const redis = sharedRedis();
const fx = sizeFixture(bytes);
const filled = await redisHit(fx, redis); // fills the entries both rows read
let op: (i: number) => Promise<void>;
let close = async () => {};
if (which === 'raw') {
  const keys = fx.keys.map((key) => OURS_REDIS_PREFIX + key);
  op = async (i) => {
    if ((await redis.getBuffer(keys[i % keys.length]!)) === null) throw new Error('entry missing');
  };
} else {
  const store = new RedisCacheStore({ redis, prefix: OURS_REDIS_PREFIX, commandTimeout: '2s' });
  const executor = new GuardedExecutor('redis_process', fx.json);
  executor.arm();
  const cached = withResultCache(executor, { store, seal: false });
  op = async (i) => {
    const result = await cached.run(fx.jobs[i % fx.jobs.length]!);
    if (!result.fromCache || result.json().byteLength !== bytes) throw new Error('not a hit');
  };
  close = () => store.close();
}

async function callers(until: number, each: () => void): Promise<void> {
  let i = 0;
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      while (Date.now() < until) {
        await op(i++);
        each();
      }
    }),
  );
}

await callers(Date.now() + 1000, () => {}); // warm-up
let gcMs = 0;
const gc = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) gcMs += entry.duration;
});
gc.observe({ entryTypes: ['gc'] });
let ops = 0;
const cpu0 = process.cpuUsage();
const t0 = performance.now();
await callers(Date.now() + seconds * 1000, () => ops++);
const cpu = process.cpuUsage(cpu0);
const wallMs = performance.now() - t0;
gc.disconnect();
console.log(
  `${which} ${fx.label}, ${CALLERS} callers: ${Math.round((ops * 1000) / wallMs)} ops/s, ` +
    `CPU ${((cpu.user + cpu.system) / ops).toFixed(2)} µs/op, ` +
    `GC ${((gcMs * 1000) / ops).toFixed(2)} µs/op, ` +
    `RSS ${Math.round(process.memoryUsage().rss / 1e6)} MB`,
);
await close();
await filled.close();
await deleteRunKeys(redis);
redis.disconnect();
