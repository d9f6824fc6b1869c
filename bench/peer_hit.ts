/**
 * `peer_hit`: the cache a Node user would otherwise pick — BentoCache 1.6.1 `getOrSet` hits —
 * on the same Redis, with the same viewers and payloads:
 *
 * - `bento_memory_hit`: memory-only store, default options (L1 entries serialised, as
 *   BentoCache recommends so that callers cannot mutate cached values);
 * - `bento_memory_ref_hit`: memory-only, `serialize: false` (L1 hands back the stored reference:
 *   BentoCache's fastest configuration);
 * - `bento_tiered_l1_hit`: memory + Redis store, served from L1;
 * - `bento_tiered_l2_hit`: memory + Redis with a one-entry L1, so that cycling 1000 viewers
 *   misses L1 every time and measures BentoCache's L2 (Redis) hit path.
 *
 * The cached value is the result's JSON text, which is what a server forwarding JSON would keep
 * (the counterpart of our `json()` bytes). Every call derives its key with `cachedResultPath`
 * first, exactly as our middleware does, so the rows compare the cache layers, not the keys.
 */
import { BentoCache, bentostore } from 'bentocache';
import { memoryDriver } from 'bentocache/drivers/memory';
import { redisDriver } from 'bentocache/drivers/redis';
import type { Redis } from 'ioredis';
import { cachedResultPath } from '../src/index.js';
import { RUN_PREFIX, type ScenarioSet, type SizeFixture, TTL_S, VIEWERS } from './fixtures.js';
import { BenchInvariantError, type Scenario } from './helpers.js';

type StoreName = 'memory' | 'memoryRef' | 'tiered' | 'tieredL2';

/** `redis` is the run's shared client, used as BentoCache's L2 connection too. */
export async function peerHit(fx: SizeFixture, redis: Redis): Promise<ScenarioSet> {
  const maxItems = VIEWERS * 2;
  const bento = new BentoCache({
    default: 'memory',
    ttl: TTL_S * 1000,
    stores: {
      memory: bentostore({ prefix: `${RUN_PREFIX}bento-memory` }).useL1Layer(
        memoryDriver({ maxItems }),
      ),
      memoryRef: bentostore({ prefix: `${RUN_PREFIX}bento-memory-ref` }).useL1Layer(
        memoryDriver({ maxItems, serialize: false }),
      ),
      tiered: bentostore({ prefix: `${RUN_PREFIX}bento-tiered` })
        .useL1Layer(memoryDriver({ maxItems }))
        .useL2Layer(redisDriver({ connection: redis })),
      tieredL2: bentostore({ prefix: `${RUN_PREFIX}bento-tiered-l2` })
        .useL1Layer(memoryDriver({ maxItems: 1 }))
        .useL2Layer(redisDriver({ connection: redis })),
    },
  });

  let armed = false;
  let executions = 0;
  const { text, jobs } = fx;
  const factory = () => {
    executions++;
    if (armed) throw new BenchInvariantError('peer_hit: a measured BentoCache "hit" executed');
    return text;
  };

  const stores: Record<StoreName, ReturnType<typeof bento.use>> = {
    memory: bento.use('memory'),
    memoryRef: bento.use('memoryRef'),
    tiered: bento.use('tiered'),
    tieredL2: bento.use('tieredL2'),
  };
  for (const cache of Object.values(stores)) {
    for (const job of jobs) await cache.getOrSet({ key: cachedResultPath(job), factory });
  }
  if (executions !== jobs.length * 4) {
    throw new BenchInvariantError(`peer_hit: filled ${executions}/${jobs.length * 4}`);
  }
  armed = true;

  const n = jobs.length;
  const length = text.length;
  const scenario = (id: string, label: string, name: StoreName): Scenario => {
    const cache = stores[name];
    return {
      id,
      label,
      async: true,
      op: async (i: number) => {
        const value: unknown = await cache.getOrSet({
          key: cachedResultPath(jobs[i % n]!),
          factory,
        });
        if (typeof value !== 'string' || value.length !== length) {
          throw new BenchInvariantError(`${id}: not a hit of the stored JSON`);
        }
      },
    };
  };

  return {
    scenarios: [
      scenario('bento_memory_hit', 'BentoCache `getOrSet`, memory store (default)', 'memory'),
      scenario(
        'bento_memory_ref_hit',
        'BentoCache `getOrSet`, memory store, `serialize: false`',
        'memoryRef',
      ),
      scenario('bento_tiered_l1_hit', 'BentoCache `getOrSet`, memory+Redis, L1 hit', 'tiered'),
      scenario(
        'bento_tiered_l2_hit',
        'BentoCache `getOrSet`, memory+Redis, L1 miss → L2 hit',
        'tieredL2',
      ),
    ],
    // Not `bento.disconnectAll()`: its Redis driver would close the shared connection.
    close: async () => {},
  };
}
