import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cachedResultPath, RedisCacheStore, withResultCache } from '../../../src/index.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { makeJob } from '../../helpers/jobs.js';
import { deleteKeys, elapseOnServer, uniquePrefix } from '../../helpers/redis.js';
import { type RedisClusterHandle, startRedisCluster } from '../../helpers/redis_cluster.js';
import { registerStoreConformance } from '../../store_conformance.js';

const prefix = uniquePrefix('redis_cluster');
let cluster: RedisClusterHandle;

beforeAll(async () => {
  cluster = await startRedisCluster();
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
});

registerStoreConformance('RedisCacheStore on a 3-master Redis Cluster', {
  create: () => new RedisCacheStore({ redis: cluster.client, prefix }),
  elapse: (ms) => elapseOnServer(cluster.client, ms),
  async cleanup(store) {
    await store.close?.();
    await deleteKeys(cluster.client, prefix);
  },
});

describe('withResultCache on a Redis Cluster', () => {
  it('spreads viewers over the masters and serves each only its own entry', async () => {
    const clock = new ManualClock();
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, {
      store: new RedisCacheStore({ redis: cluster.client, prefix }),
      seal: false,
      now: clock.now,
    });
    const viewers = Array.from({ length: 30 }, (_, i) => `user${i}@example.com`);
    const job = (viewer: string) => makeJob({ viewer, args: { q: 1 }, cacheTtlS: 60 });
    for (const viewer of viewers) await cache.run(job(viewer));
    for (const viewer of viewers) {
      const hit = await cache.run(job(viewer));
      expect(hit.fromCache).toBe(true);
      expect((hit.value as { viewer: unknown }).viewer).toBe(viewer);
    }
    expect(inner.calls).toBe(viewers.length);
    // the keys really live on more than one master
    const holders = new Set<number>();
    for (const viewer of viewers) {
      const key = prefix + cachedResultPath(job(viewer));
      for (const [i, node] of cluster.client.nodes('master').entries()) {
        if ((await node.exists(key).catch(() => 0)) === 1) holders.add(i);
      }
    }
    expect(holders.size).toBeGreaterThan(1);
    await deleteKeys(cluster.client, prefix);
  });
});
