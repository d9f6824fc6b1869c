import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { encodeEntry } from '../../../src/cache/cache_entry.js';
import {
  createTwoTierStore,
  openTwoTierStore,
  TwoTierCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { makeJob } from '../../helpers/jobs.js';
import {
  deleteKeys,
  elapseOnServer,
  rawClient,
  redisAddress,
  uniquePrefix,
} from '../../helpers/redis.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';
import { registerSealingSuite } from '../../sealing_suite.js';
import { registerStoreConformance } from '../../store_conformance.js';

const url = inject('redisUrl');
const prefix = uniquePrefix('two_tier_store');
let raw: Redis;

beforeAll(async () => {
  raw = await rawClient(url);
});

afterAll(async () => {
  await deleteKeys(raw, prefix);
  await raw.quit();
});

/** A store whose bus has loaded the epochs (so lookups take the in-memory path). */
async function open(options: Partial<ConstructorParameters<typeof TwoTierCacheStore>[0]> = {}) {
  const store = new TwoTierCacheStore({ redis: url, prefix, ...options });
  await store.invalidation.whenConfirmed();
  return store;
}

registerStoreConformance('TwoTierCacheStore', {
  create: () => open(),
  elapse: (ms) => elapseOnServer(raw, ms),
  async cleanup(store) {
    await store.close?.();
    await deleteKeys(raw, prefix);
  },
});

// Tampering goes into Redis, as an attacker with Redis access would do it. The memory tier of a
// process is out of their reach: each tampering is read by a process whose memory tier does not
// hold the key (dropped here), so it really reads what the attacker left in Redis.
let sealed: TwoTierCacheStore | undefined;
registerSealingSuite('TwoTierCacheStore', {
  async create() {
    sealed = await open();
    const store = sealed;
    return {
      store,
      raw: {
        keys: async () =>
          (await raw.keys(`${prefix}*`))
            .map((k) => k.slice(prefix.length))
            .filter((k) => k.includes('/cache/')),
        get: (key) => raw.getBuffer(prefix + key),
        set: async (key, value) => {
          await raw.set(prefix + key, value, 'PX', 3_600_000);
          await store.memory.delete(key);
        },
      },
    };
  },
  async cleanup() {
    await sealed?.close();
    await deleteKeys(raw, prefix);
  },
});

describe('TwoTierCacheStore memory tier', () => {
  const stores: TwoTierCacheStore[] = [];
  afterEach(async () => {
    for (const store of stores.splice(0)) await store.close();
    await deleteKeys(raw, prefix);
  });

  const digest = 'ab'.repeat(32);
  const envelope = (expiresAt: number, size = 16) =>
    encodeEntry(digest, expiresAt, new Uint8Array(size).fill(7));

  it('a hit from memory costs no Redis read: the entry is served after Redis lost it', async () => {
    const store = await open();
    stores.push(store);
    const cache = withResultCache(new CountingExecutor(), { store, seal: false });
    const job = makeJob({ viewer: 'alice@example.com', workspace: 'mem' });
    await cache.run(job);
    await deleteKeys(raw, prefix); // only the memory tier holds it now
    expect((await cache.run(job)).fromCache).toBe(true);
  });

  it('never keeps an entry read from Redis past the expiry the entry carries', async () => {
    const clock = new ManualClock(Date.now());
    const store = await open({ memory: { maxBytes: '1mb', now: clock.now } });
    stores.push(store);
    // Redis would keep it for an hour; the envelope says it expires in 1 s.
    await raw.set(
      `${prefix}ws/cache/a`,
      Buffer.from(envelope(clock.now() + 1000)),
      'PX',
      3_600_000,
    );
    expect(await store.get('ws/cache/a')).not.toBeNull(); // read from Redis, kept in memory
    expect(store.memory.size).toBe(1);
    await raw.del(`${prefix}ws/cache/a`);
    clock.advance(999);
    expect(await store.get('ws/cache/a')).not.toBeNull(); // from memory
    clock.advance(1);
    expect(await store.get('ws/cache/a')).toBeNull();
  });

  it('never keeps a written entry past the shorter of its TTL and its own expiry', async () => {
    const clock = new ManualClock(Date.now());
    const store = await open({ memory: { maxBytes: '1mb', now: clock.now } });
    stores.push(store);
    await store.set('ws/cache/b', envelope(clock.now() + 500), 60_000);
    await store.set('ws/cache/c', envelope(clock.now() + 60_000), 500);
    await raw.del(`${prefix}ws/cache/b`, `${prefix}ws/cache/c`);
    expect(await store.get('ws/cache/b')).not.toBeNull();
    expect(await store.get('ws/cache/c')).not.toBeNull();
    clock.advance(500);
    expect(await store.get('ws/cache/b')).toBeNull();
    expect(await store.get('ws/cache/c')).toBeNull();
  });

  it('keeps nothing that is not an envelope, nor one already expired', async () => {
    const store = await open();
    stores.push(store);
    await store.set('ws/cache/d', new Uint8Array([1, 2, 3]), 60_000);
    await raw.set(`${prefix}ws/cache/e`, Buffer.from(envelope(Date.now() - 1)), 'PX', 60_000);
    expect(await store.get('ws/cache/d')).not.toBeNull(); // from Redis
    expect(await store.get('ws/cache/e')).not.toBeNull(); // from Redis (the cache rejects it)
    expect(store.memory.size).toBe(0);
  });

  it('holds no more memory than maxBytes says, measured, when filled from Redis replies', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    // Freed ArrayBuffers are released by a background sweeper, which lags on a loaded machine:
    // read until the figure stops falling (polling a condition, like waitUntil).
    const heap = async () => {
      let last = Number.POSITIVE_INFINITY;
      for (let round = 0; round < 50; round++) {
        gc();
        gc();
        const { heapUsed, arrayBuffers } = process.memoryUsage();
        const now = heapUsed + arrayBuffers;
        if (now > last - (64 << 10)) return Math.min(now, last);
        last = now;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      return last;
    };
    const maxBytes = 24 << 20; // large enough that the heap's own noise (a few MB) does not count
    const store = await open({ memory: { maxBytes } });
    stores.push(store);
    const count = Math.ceil(maxBytes / 1024); // 1.5 × what fits, counting the overhead
    const pipeline = raw.pipeline();
    const value = Buffer.from(envelope(Date.now() + 3_600_000, 1024 - 48));
    for (let i = 0; i < count; i++) pipeline.set(`${prefix}ws/cache/${i}`, value, 'PX', 600_000);
    // Not an envelope, so never kept; read beside each entry so that both replies arrive in one
    // socket read, and the entry's reply is a view into a 3 KB buffer.
    pipeline.set(`${prefix}ws/cache/blob`, Buffer.alloc(2048, 1), 'PX', 600_000);
    await pipeline.exec();
    for (let i = 0; i < count; i++) {
      await Promise.all([store.get('ws/cache/blob'), store.get(`ws/cache/${i}`)]);
    }
    expect(store.memory.bytes).toBeGreaterThan(maxBytes * 0.95);
    expect(store.memory.bytes).toBeLessThanOrEqual(maxBytes);
    // What the memory tier holds: the heap with it full, less the heap once it is emptied.
    const full = await heap();
    await store.memory.close();
    const held = full - (await heap());
    expect(held).toBeLessThanOrEqual(maxBytes);
    expect(held).toBeGreaterThan(maxBytes * 0.5);
  });
});

// A platform engineer expects a store to work once its factory resolves, and anything else to
// say so with a code: never a silent bypass, never an uncoded throw.
describe('opening a two-tier store', () => {
  const stores: TwoTierCacheStore[] = [];
  afterEach(async () => {
    for (const store of stores.splice(0)) await store.close();
    await deleteKeys(raw, prefix);
  });
  const job = (q: number) =>
    makeJob({ viewer: 'alice@example.com', workspace: 'open', args: { q } });

  it('openTwoTierStore resolves once usable: the first run after it is cached, invalidate works', async () => {
    const store = await openTwoTierStore({ redis: url, prefix });
    stores.push(store);
    expect(store.invalidation.confirmed).toBe(true);
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store, seal: false });
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect((await cache.run(job(1))).fromCache).toBe(true);
    await cache.invalidate({ workspace: 'open' });
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect((await cache.run(job(1))).fromCache).toBe(true);
    expect(inner.calls).toBe(2);
    expect(cache.stats.bypasses).toBe(0);
  });

  it('createTwoTierStore used at once: its first lookup and invalidate wait for the bus', async () => {
    const fresh = () => {
      const store = createTwoTierStore({ redis: url, prefix });
      stores.push(store);
      expect(store.invalidation.confirmed).toBe(false);
      return withResultCache(new CountingExecutor(), { store, seal: false });
    };
    const a = fresh();
    expect((await a.run(job(2))).fromCache).toBe(false);
    expect((await a.run(job(2))).fromCache).toBe(true);
    // A brand-new store's first lookup: the entry A wrote, from Redis.
    expect((await fresh().run(job(2))).fromCache).toBe(true);
    // A brand-new store's invalidate goes through, and applies to its own next run.
    const c = fresh();
    await c.invalidate({ workspace: 'open' });
    expect((await c.run(job(2))).fromCache).toBe(false);
    expect(a.stats.bypasses + c.stats.bypasses).toBe(0);
  });

  it('before Redis answers, lookups and invalidate refuse with E_STORE_NOT_READY; usable once ready()', async () => {
    const proxy = await TcpProxy.start(redisAddress(url));
    try {
      await proxy.setMode('refuse');
      const store = createTwoTierStore({ redis: redisAddress(url).via(proxy.port), prefix });
      stores.push(store);
      const inner = new CountingExecutor();
      const bypassed: string[] = [];
      const cache = withResultCache(inner, { store, seal: false });
      cache.events.on('cache:bypass', (e) => bypassed.push(e.reason));
      await expect(cache.invalidate({ workspace: 'open' })).rejects.toMatchObject({
        code: 'E_STORE_NOT_READY',
        status: 503,
      });
      // The run itself succeeds, uncached, and says why.
      expect((await cache.run(job(3))).fromCache).toBe(false);
      expect(bypassed).toEqual(['store-not-ready']);
      await expect(store.ready({ timeout: 50 })).rejects.toMatchObject({
        code: 'E_STORE_NOT_READY',
      });

      await proxy.setMode('forward');
      await store.ready({ timeout: 10_000 });
      expect((await cache.run(job(3))).fromCache).toBe(false);
      expect((await cache.run(job(3))).fromCache).toBe(true);
      await cache.invalidate({ workspace: 'open' });
      expect((await cache.run(job(3))).fromCache).toBe(false);
    } finally {
      await proxy.stop();
    }
  });

  it('Redis unreachable at open: openTwoTierStore rejects with E_STORE_NOT_READY and closes it', async () => {
    const proxy = await TcpProxy.start(redisAddress(url));
    try {
      await proxy.setMode('refuse');
      const opening = openTwoTierStore({
        redis: redisAddress(url).via(proxy.port),
        prefix,
        openTimeout: 300,
      });
      const refusal = await opening.then(
        () => null,
        (err: unknown) => err as { code?: string; message: string; cause?: unknown },
      );
      expect(refusal).toMatchObject({ code: 'E_STORE_NOT_READY' });
      expect(refusal?.message).toContain('300 ms');
      expect(refusal?.cause).toBeInstanceOf(Error); // the connection failure, for the operator
      // Closed: nothing it opened is still trying (Redis answers again, nobody connects).
      await proxy.setMode('forward');
      expect(proxy.connections).toBe(0);
    } finally {
      await proxy.stop();
    }
  });
});
