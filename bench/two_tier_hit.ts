/**
 * `two_tier_hit`: `withResultCache` on a `TwoTierCacheStore` (our two tiers against BentoCache's),
 * read as the server reads it (`result.json()` bytes), with the invalidation bus up (epochs checked in memory):
 *
 * - `two_tier_memory_hit`: served by the memory tier; compared with `bento_tiered_l1_hit`;
 * - `two_tier_redis_hit`: a memory tier too small to keep any entry, so every lookup misses it
 *   and reads Redis; compared with `redis_raw_get` (and `bento_tiered_l2_hit`).
 *
 * Entries are unsealed, as BentoCache's are, except `two_tier_memory_hit_sealed`: the server's
 * default, whose memory tier keeps entries opened, so sealing costs it no AES-GCM.
 */
import type { Redis } from 'ioredis';
import { TwoTierCacheStore, withResultCache } from '../src/index.js';
import { GuardedExecutor, RUN_PREFIX, type ScenarioSet, type SizeFixture } from './fixtures.js';
import { BenchInvariantError, type Scenario } from './helpers.js';

/** `redis` is the run's shared client, borrowed (the bus opens its own subscriber beside it). */
export async function twoTierHit(fx: SizeFixture, redis: Redis): Promise<ScenarioSet> {
  const { jobs, bytes } = fx;
  const make = async (id: string, prefix: string, maxBytes: number, sealed = false) => {
    const executor = new GuardedExecutor(id, fx.json);
    // A 2 s bound, as redis_hit: a stall on this shared machine must not fail the run.
    const store = new TwoTierCacheStore({
      redis,
      prefix: `${RUN_PREFIX}${prefix}`,
      commandTimeout: '2s',
      memory: { maxBytes, maxEntryBytes: Math.min(maxBytes, Math.max(1, maxBytes / 8)) },
    });
    await store.invalidation.whenConfirmed();
    const cached = withResultCache(executor, {
      store,
      seal: sealed ? { secretKey: 'bench-only secret, 32 bytes or more, not for use' } : false,
    });
    for (const job of jobs) await cached.run(job);
    if (cached.stats.stored !== jobs.length) {
      throw new BenchInvariantError(`${id}: filled ${cached.stats.stored}/${jobs.length}`);
    }
    executor.arm();
    return { store, cached };
  };
  // Room for every viewer's entry in memory, or for none at all.
  const l1 = await make(
    'two_tier_memory_hit',
    'two-tier:',
    Math.max(64 << 20, jobs.length * bytes * 2),
  );
  if (l1.store.memory.size !== jobs.length) {
    throw new BenchInvariantError(`two_tier_memory_hit: ${l1.store.memory.size} in memory`);
  }
  const l2 = await make('two_tier_redis_hit', 'two-tier-l2:', 1024);
  // The server's default: sealed, so the memory tier keeps entries opened (no AES-GCM per hit).
  const sealedL1 = await make(
    'two_tier_memory_hit_sealed',
    'two-tier-sealed:',
    Math.max(64 << 20, jobs.length * bytes * 2),
    true,
  );
  const n = jobs.length;
  const scenario = (
    id: string,
    label: string,
    { store, cached }: typeof l1,
    inMemory: boolean,
  ): Scenario => ({
    id,
    label,
    async: true,
    op: async (i: number) => {
      const result = await cached.run(jobs[i % n]!);
      if (!result.fromCache || result.json().byteLength !== bytes) {
        throw new BenchInvariantError(`${id}: not a hit of the stored bytes`);
      }
    },
    verify: () => {
      const { storeErrors, rejected, bypasses } = cached.stats;
      if (storeErrors + rejected + bypasses > 0 || !store.invalidation.confirmed) {
        throw new BenchInvariantError(`${id}: ${JSON.stringify(cached.stats)}`);
      }
      if ((store.memory.size === n) !== inMemory) {
        throw new BenchInvariantError(`${id}: memory tier holds ${store.memory.size}`);
      }
    },
  });
  return {
    scenarios: [
      scenario(
        'two_tier_memory_hit',
        'withResultCache hit, TwoTierCacheStore, memory tier',
        l1,
        true,
      ),
      scenario(
        'two_tier_memory_hit_sealed',
        'the same, sealed (the server default): the memory tier keeps entries opened',
        sealedL1,
        true,
      ),
      scenario(
        'two_tier_redis_hit',
        'withResultCache hit, TwoTierCacheStore, memory-tier miss → Redis',
        l2,
        false,
      ),
    ],
    close: async () => {
      await l1.store.close();
      await l2.store.close();
      await sealedL1.store.close();
    },
  };
}
