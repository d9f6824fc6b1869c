import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  cachedResultPath,
  RedisCacheStore,
  TwoTierCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { makeJob } from '../../helpers/jobs.js';
import { deleteKeys, elapseOnServer, uniquePrefix } from '../../helpers/redis.js';
import { type RedisClusterHandle, startRedisCluster } from '../../helpers/redis_cluster.js';
import { waitUntil } from '../../helpers/wait.js';
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

// Issue 24 §5: the invalidation bus's Cluster paths — the Lua bump on one key (the epochs hash,
// one slot) and the subscriber duplicated from a Cluster client — on a real 3-master Cluster.
describe('invalidation on a Redis Cluster', () => {
  it('a bump by one process reaches the other: its memory tier drops, its next run misses', async () => {
    const busPrefix = `${prefix}bus:`;
    // Two "processes": a Cluster client each, each store duplicating its own subscriber.
    const other = new Cluster(cluster.nodes.map((n) => ({ host: n.host, port: n.port })));
    other.on('error', () => {});
    const a = new TwoTierCacheStore({ redis: cluster.client, prefix: busPrefix });
    const b = new TwoTierCacheStore({ redis: other, prefix: busPrefix });
    try {
      await Promise.all([a.invalidation.whenConfirmed(), b.invalidation.whenConfirmed()]);
      const inner = new CountingExecutor();
      const seal = { secretKey: 'k'.repeat(64) }; // shared stores are sealed (invariant 21)
      const cacheA = withResultCache(inner, { store: a, seal });
      const cacheB = withResultCache(inner, { store: b, seal });
      const job = (path: string) =>
        makeJob({ workspace: 'inv', path, viewer: 'alice@example.com', cacheTtlS: 60 });
      await cacheA.run(job('f/a'));
      await cacheA.run(job('f/b'));
      expect((await cacheB.run(job('f/a'))).fromCache).toBe(true);
      expect((await cacheB.run(job('f/b'))).fromCache).toBe(true);
      expect(b.memory.size).toBe(2);

      const tagOf = (path: string) => b.invalidation.tag('inv', path) as string;
      let before = tagOf('f/a');
      await cacheA.invalidate({ workspace: 'inv', path: 'f/a' });
      await waitUntil('B hears the path bump', () => tagOf('f/a') !== before);
      expect(tagOf('f/b')).toBe(before); // the other path's epoch did not move
      expect(b.memory.size).toBe(1); // B's memory dropped f/a's entry only
      expect((await cacheB.run(job('f/a'))).fromCache).toBe(false);
      expect((await cacheB.run(job('f/b'))).fromCache).toBe(true);

      before = tagOf('f/b');
      await cacheA.invalidate({ workspace: 'inv' });
      await waitUntil('B hears the workspace bump', () => tagOf('f/b') !== before);
      expect(b.memory.size).toBe(0);
      expect((await cacheB.run(job('f/b'))).fromCache).toBe(false);
      expect(b.invalidation.confirmed).toBe(true);
    } finally {
      await b.close();
      await a.close();
      other.disconnect();
      await deleteKeys(cluster.client, busPrefix);
    }
  }, 60_000);
});
