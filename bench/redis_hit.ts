/**
 * `redis_hit`: a `withResultCache` hit through `RedisCacheStore`, read the way the server reads
 * it — the stored JSON bytes via `result.json()`, never parsed. `redis_hit_sealed`: the same
 * with entries sealed.
 */
import type { Redis } from 'ioredis';
import { RedisCacheStore, withResultCache } from '../src/index.js';
import { GuardedExecutor, RUN_PREFIX, type ScenarioSet, type SizeFixture } from './fixtures.js';
import { BenchInvariantError } from './helpers.js';

/** Where this scenario's store writes; `redis_raw_get` reads the very same entries. */
export const OURS_REDIS_PREFIX = `${RUN_PREFIX}ours:`;
/** A fixed bench secret (never a real one). */
const BENCH_SECRET = 'bench-only secret, 32 bytes or more, not for use';

/**
 * `redis` is the run's shared client: the store borrows it, so that this row and the raw GET
 * baseline travel over the same TCP connection (see `sharedRedis` for why that matters).
 */
export async function redisHit(fx: SizeFixture, redis: Redis): Promise<ScenarioSet> {
  const executor = new GuardedExecutor('redis_hit', fx.json);
  // A 2 s bound instead of the 200 ms default: on this shared machine a stall of a few hundred
  // ms under 64 concurrent callers would otherwise make a hit time out, run uncached, and fail
  // the whole run. The bound's value costs nothing on the hit path.
  const store = new RedisCacheStore({ redis, prefix: OURS_REDIS_PREFIX, commandTimeout: '2s' });
  // Unsealed, explicitly (a shared store refuses to run without `seal` otherwise).
  const cached = withResultCache(executor, { store, seal: false });
  for (const job of fx.jobs) await cached.run(job);
  if (cached.stats.stored !== fx.jobs.length) {
    throw new BenchInvariantError(`redis_hit: filled ${cached.stats.stored}/${fx.jobs.length}`);
  }
  // The same hits with sealing on: its cost is this row over the one above.
  const sealedStore = new RedisCacheStore({
    redis,
    prefix: `${RUN_PREFIX}sealed:`,
    commandTimeout: '2s',
  });
  const sealed = withResultCache(executor, {
    store: sealedStore,
    seal: { secretKey: BENCH_SECRET },
  });
  for (const job of fx.jobs) await sealed.run(job);
  if (sealed.stats.stored !== fx.jobs.length) {
    throw new BenchInvariantError(
      `redis_hit_sealed: filled ${sealed.stats.stored}/${fx.jobs.length}`,
    );
  }
  executor.arm();
  const { jobs, bytes } = fx;
  const n = jobs.length;
  return {
    scenarios: [
      {
        id: 'redis_hit',
        label: 'withResultCache hit, RedisCacheStore (`json()` bytes)',
        async: true,
        op: async (i: number) => {
          const result = await cached.run(jobs[i % n]!);
          if (!result.fromCache || result.json().byteLength !== bytes) {
            throw new BenchInvariantError('redis_hit: not a hit of the stored bytes');
          }
        },
        verify: () => {
          const { storeErrors, rejected, bypasses } = cached.stats;
          if (storeErrors + rejected + bypasses > 0) {
            throw new BenchInvariantError(`redis_hit: ${JSON.stringify(cached.stats)}`);
          }
        },
      },
      {
        id: 'redis_hit_sealed',
        label: 'the same with `seal` (AES-256-GCM, keyed key names)',
        async: true,
        op: async (i: number) => {
          const result = await sealed.run(jobs[i % n]!);
          if (!result.fromCache || result.json().byteLength !== bytes) {
            throw new BenchInvariantError('redis_hit_sealed: not a hit of the stored bytes');
          }
        },
        verify: () => {
          const { storeErrors, rejected, bypasses } = sealed.stats;
          if (storeErrors + rejected + bypasses > 0) {
            throw new BenchInvariantError(`redis_hit_sealed: ${JSON.stringify(sealed.stats)}`);
          }
        },
      },
    ],
    close: async () => {
      await store.close();
      await sealedStore.close();
    },
  };
}
