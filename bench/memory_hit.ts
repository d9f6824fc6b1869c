/**
 * `memory_hit`: a `withResultCache` hit through the in-process `MemoryCacheStore`, read as the
 * server reads it (`result.json()` bytes).
 */
import { MemoryCacheStore, withResultCache } from '../src/index.js';
import { GuardedExecutor, type ScenarioSet, type SizeFixture } from './fixtures.js';
import { BenchInvariantError } from './helpers.js';

export async function memoryHit(fx: SizeFixture): Promise<ScenarioSet> {
  const executor = new GuardedExecutor('memory_hit', fx.json);
  // Room for every viewer's entry: an eviction would turn a hit into a miss (and fail the run).
  const store = new MemoryCacheStore({
    maxBytes: Math.max(64 << 20, fx.jobs.length * fx.bytes * 2),
  });
  const cached = withResultCache(executor, { store });
  for (const job of fx.jobs) await cached.run(job);
  if (cached.stats.stored !== fx.jobs.length || store.size !== fx.jobs.length) {
    throw new BenchInvariantError(`memory_hit: filled ${store.size}/${fx.jobs.length}`);
  }
  executor.arm();
  const { jobs, bytes } = fx;
  const n = jobs.length;
  return {
    scenarios: [
      {
        id: 'memory_hit',
        label: 'withResultCache hit, MemoryCacheStore (`json()` bytes)',
        async: true,
        op: async (i: number) => {
          const result = await cached.run(jobs[i % n]!);
          if (!result.fromCache || result.json().byteLength !== bytes) {
            throw new BenchInvariantError('memory_hit: not a hit of the stored bytes');
          }
        },
        verify: () => {
          const { storeErrors, rejected, bypasses } = cached.stats;
          if (storeErrors + rejected + bypasses > 0) {
            throw new BenchInvariantError(`memory_hit: ${JSON.stringify(cached.stats)}`);
          }
        },
      },
    ],
    close: () => store.close(),
  };
}
