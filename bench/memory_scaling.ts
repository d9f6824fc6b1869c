/**
 * `scale_*`: does a `MemoryCacheStore` hit stay flat from 1 k to 1 M entries (SPEC: growth
 * ≤ 1.2 × the same growth of a bare `lru-cache` lookup)? Each size is one store; hits cycle
 * through every entry of the 1 k store and through 100 k entries spread over the 1 M store,
 * so that the larger map is also a larger working set. The bare `lru-cache` rows do the same
 * lookups on the same keys, with nothing around them.
 */
import { LRUCache } from 'lru-cache';
import { MemoryCacheStore, withResultCache } from '../src/index.js';
import { GuardedExecutor, payloadJson, type ScenarioSet, sizeFixture } from './fixtures.js';
import { BenchInvariantError, type Scenario } from './helpers.js';

const PAYLOAD_BYTES = 256;
/** Entries of the large store whose hits are measured; the rest only make the map large. */
const MEASURED_OF_LARGE = 100_000;

export async function memoryScaling(large = 1_000_000): Promise<ScenarioSet> {
  const json = payloadJson(PAYLOAD_BYTES);
  const small = await filledStore('1k', 1000, 1000, json);
  const big = await filledStore('1m', large, Math.min(MEASURED_OF_LARGE, large), json);
  return {
    scenarios: [...small.scenarios, ...big.scenarios],
    close: async () => {
      await small.close();
      await big.close();
    },
  };
}

/** `entries` entries in one store (and one bare LRU), hits measured on the first `measured`. */
async function filledStore(
  size: string,
  entries: number,
  measured: number,
  json: Buffer,
): Promise<ScenarioSet> {
  const fx = sizeFixture(PAYLOAD_BYTES, measured);
  const executor = new GuardedExecutor(`scale_memory_hit_${size}`, json);
  const store = new MemoryCacheStore({ maxBytes: '4gb', maxEntryBytes: '1mb' });
  const cached = withResultCache(executor, { store });
  for (const job of fx.jobs) await cached.run(job);
  // Filler entries: real-sized values under distinct keys, never read.
  const filler = Buffer.alloc(json.byteLength + 48);
  for (let i = measured; i < entries; i++) {
    await store.set(`bench/cache/filler-${i.toString(16).padStart(58, '0')}`, filler, 3_600_000);
  }
  if (store.size !== entries) {
    throw new BenchInvariantError(`scale_${size}: holds ${store.size} of ${entries} entries`);
  }
  const lru = new LRUCache<string, Buffer>({ max: entries });
  for (let i = 0; i < entries; i++) lru.set(i < measured ? fx.keys[i]! : `filler-${i}`, filler);
  executor.arm();
  const { jobs, keys } = fx;
  const n = jobs.length;
  let sink = 0;
  const hit: Scenario = {
    id: `scale_memory_hit_${size}`,
    label: `withResultCache hit, MemoryCacheStore of ${size === '1k' ? '1 k' : '1 M'} entries`,
    async: true,
    op: async (i: number) => {
      const result = await cached.run(jobs[i % n]!);
      if (!result.fromCache) throw new BenchInvariantError(`scale_${size}: not a hit`);
    },
    verify: () => {
      if (cached.stats.rejected + cached.stats.bypasses > 0) {
        throw new BenchInvariantError(`scale_${size}: ${JSON.stringify(cached.stats)}`);
      }
    },
  };
  const bare: Scenario = {
    id: `scale_lru_get_${size}`,
    label: `bare \`lru-cache\` \`get\`, ${size === '1k' ? '1 k' : '1 M'} entries (floor)`,
    async: false,
    op: (i: number) => {
      sink ^= lru.get(keys[i % n]!)?.byteLength ?? -1;
    },
    verify: () => {
      if (sink === -2) console.log(sink); // keeps the lookups observable
    },
  };
  return { scenarios: [hit, bare], close: () => store.close() };
}
