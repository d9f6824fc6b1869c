import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import {
  type CachedExecutor,
  MemoryCacheStore,
  RedisCacheStore,
  type RejectionReason,
  SealRequiredError,
  TwoTierCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { entryCost, TAG_OVERHEAD } from '../../../src/stores/memory_store.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { makeJob } from '../../helpers/jobs.js';
import { deleteKeys, rawClient, uniquePrefix } from '../../helpers/redis.js';

// SPEC invariant 21: a shared store is sealed unless the caller says otherwise, and the memory
// tier of two tiers holds opened entries (never both forms) while Redis holds only sealed ones.

const url = inject('redisUrl');
const prefix = uniquePrefix('sealed_tiers');
const secretKey = 'sealed tiers test secret, 32 bytes or more';
const alice = 'alice@example.com';
const bob = 'bob@example.com';
const HOUR = 3_600_000;
let raw: Redis;

beforeAll(async () => {
  raw = await rawClient(url);
});

afterAll(async () => {
  await deleteKeys(raw, prefix);
  await raw.quit();
});

describe('a shared store is sealed unless the caller says otherwise (E_SEAL_REQUIRED)', () => {
  const closing: { close(): Promise<void> }[] = [];
  afterEach(async () => {
    for (const store of closing.splice(0)) await store.close();
  });

  it('refuses RedisCacheStore and TwoTierCacheStore without seal, naming both ways out', async () => {
    const redis = new RedisCacheStore({ redis: raw, prefix });
    const twoTier = new TwoTierCacheStore({ redis: raw, prefix });
    closing.push(redis, twoTier);
    for (const store of [redis, twoTier]) {
      let thrown: unknown;
      try {
        withResultCache(new CountingExecutor(), { store });
      } catch (err) {
        thrown = err;
      }
      expect(thrown).toBeInstanceOf(SealRequiredError);
      expect(thrown).toMatchObject({ code: 'E_SEAL_REQUIRED' });
      expect((thrown as Error).message).toContain('seal: { secretKey }');
      expect((thrown as Error).message).toContain('seal: false');
      // Either way out is accepted.
      withResultCache(new CountingExecutor(), { store, seal: { secretKey } });
      withResultCache(new CountingExecutor(), { store, seal: false });
    }
  });

  it('a store that does not say counts as shared; the in-process store needs neither', () => {
    const foreign = {
      get: async () => null,
      set: async () => {},
      delete: async () => {},
    };
    expect(() => withResultCache(new CountingExecutor(), { store: foreign })).toThrow(
      SealRequiredError,
    );
    expect(() =>
      withResultCache(new CountingExecutor(), { store: { ...foreign, shared: true } }),
    ).toThrow(SealRequiredError);
    withResultCache(new CountingExecutor(), { store: { ...foreign, shared: false } });
    withResultCache(new CountingExecutor(), { store: new MemoryCacheStore() });
  });
});

describe('two tiers, sealed: opened entries in memory, sealed ones in Redis', () => {
  const stores: TwoTierCacheStore[] = [];
  const caches: CachedExecutor[] = [];
  afterEach(async () => {
    for (const cache of caches.splice(0)) expect(cache.inFlight).toBe(0);
    for (const store of stores.splice(0)) await store.close();
    await deleteKeys(raw, prefix);
  });

  async function setup(now?: () => number, values?: 'shared' | 'cloned') {
    const store = new TwoTierCacheStore({ redis: url, prefix });
    await store.invalidation.whenConfirmed();
    stores.push(store);
    const inner = new CountingExecutor((job) => ({
      viewer: job.perms.endUserEmail,
      rows: [{ patient: `record of ${job.perms.endUserEmail}` }],
    }));
    const cache = withResultCache(inner, {
      store,
      seal: { secretKey },
      ...(now ? { now } : {}),
      ...(values ? { values } : {}),
    });
    caches.push(cache);
    const rejected: RejectionReason[] = [];
    cache.events.on('cache:rejected', (e) => rejected.push(e.reason));
    return { store, inner, cache, rejected };
  }

  const job = (viewer: string, cacheTtlS = 3600) =>
    makeJob({ viewer, args: { region: 'eu' }, cacheTtlS });
  const viewerOf = (value: unknown) => (value as { viewer: string }).viewer;
  /** The one cache key in Redis (without the prefix). */
  const redisKeys = async () =>
    (await raw.keys(`${prefix}*`))
      .map((k) => k.slice(prefix.length))
      .filter((k) => k.includes('/cache/'));

  it('a written entry: opened in memory, sealed in Redis, each form in one tier only', async () => {
    const { store, cache } = await setup();
    await cache.run(job(alice));
    const [key] = await redisKeys();
    expect(key).toBeDefined();
    const inMemory = store.memory.getNow(key!)!;
    const inRedis = (await raw.getBuffer(prefix + key!))!;
    expect(inMemory[2]).toBe(2); // the plain envelope: the opened form
    expect(inRedis[2]).toBe(3); // sealed
    expect(Buffer.from(inMemory).toString()).toContain(`record of ${alice}`);
    expect(inRedis.toString('latin1')).not.toContain('record of');
    // Its real bytes, counted: bytes of its own (not a slice of a shared pool).
    expect(inMemory.byteOffset).toBe(0);
    expect(inMemory.buffer.byteLength).toBe(inMemory.byteLength);
    // Tagged with its runnable (the store invalidates by path): its index slots count too.
    expect(store.memory.bytes).toBe(entryCost(key!, inMemory) + TAG_OVERHEAD);
    expect((await cache.run(job(alice))).fromCache).toBe(true);
  });

  it('an entry read from Redis is kept opened in memory, and the next hit opens nothing', async () => {
    const a = await setup();
    await a.cache.run(job(alice));
    const [key] = await redisKeys();
    // Another process: its memory tier is empty, Redis has the sealed entry.
    const b = await setup();
    expect(b.store.memory.getNow(key!)).toBeNull();
    const first = await b.cache.run(job(alice));
    expect(first.fromCache).toBe(true);
    expect(viewerOf(first.value)).toBe(alice);
    expect(b.store.memory.getNow(key!)![2]).toBe(2);
    // Redis loses it: served opened from memory, no Redis read needed.
    await raw.del(prefix + key!);
    const second = await b.cache.run(job(alice));
    expect(second.fromCache).toBe(true);
    expect(viewerOf(second.value)).toBe(alice);
    expect(b.inner.calls).toBe(0);
  });

  it("a memory-tier hit never skips the key binding: alice's opened entry under bob's key is not served", async () => {
    const { store, cache, inner, rejected } = await setup();
    await cache.run(job(alice));
    const [aliceKey] = await redisKeys();
    await cache.run(job(bob));
    const bobKey = (await redisKeys()).find((k) => k !== aliceKey)!;
    // Someone inside the process (or a bug) puts alice's opened entry under bob's name.
    await store.memory.set(bobKey, store.memory.getNow(aliceKey!)!, HOUR);
    const result = await cache.run(job(bob));
    expect(viewerOf(result.value)).toBe(bob);
    expect(rejected).toEqual(['foreign-key']);
    // Bob's own sealed entry in Redis answered; nothing was executed again.
    expect(result.fromCache).toBe(true);
    expect(inner.calls).toBe(2);
    // The foreign entry was dropped from memory; bob's own opened one replaced it.
    expect(store.memory.getNow(bobKey)).not.toEqual(store.memory.getNow(aliceKey!));
  });

  it('a memory-tier hit never skips the expiry: an entry the tier still holds is not served late', async () => {
    const clock = new ManualClock(Date.now());
    const { store, cache, inner, rejected } = await setup(clock.now);
    await cache.run(job(alice, 60));
    const [key] = await redisKeys();
    // The memory tier reads the real clock, so it still holds the entry; the cache's clock says
    // the entry expired. Keep it in memory for an hour to make sure the tier would serve it.
    await store.memory.set(key!, store.memory.getNow(key!)!, HOUR);
    clock.advance(60_000);
    const result = await cache.run(job(alice, 60));
    expect(result.fromCache).toBe(false);
    // Rejected in memory, then in Redis (which still holds it: its TTL runs on Redis's clock).
    expect(rejected).toEqual(['expired', 'expired']);
    expect(inner.calls).toBe(2);
  });

  it('a sealed envelope in the memory tier is not taken for an opened one', async () => {
    const { store, cache, inner, rejected } = await setup();
    await cache.run(job(alice));
    const [key] = await redisKeys();
    await store.memory.set(key!, (await raw.getBuffer(prefix + key!))!, HOUR);
    const result = await cache.run(job(alice));
    expect(rejected).toEqual(['corrupt']);
    expect(result.fromCache).toBe(true); // from Redis, opened
    expect(store.memory.getNow(key!)![2]).toBe(2);
    expect(inner.calls).toBe(1);
  });

  it("values: 'shared' — memory-tier hits of one key share one frozen value; alice's never reaches bob", async () => {
    const { store, cache, inner, rejected } = await setup(undefined, 'shared');
    await cache.run(job(alice));
    const [aliceKey] = await redisKeys();
    const first = await cache.run(job(alice));
    const second = await cache.run(job(alice));
    expect(second.value).toBe(first.value);
    expect(Object.isFrozen((first.value as { rows: object[] }).rows[0])).toBe(true);
    expect(() => {
      (first.value as { viewer: string }).viewer = bob;
    }).toThrow(TypeError);
    expect(viewerOf((await cache.run(job(alice))).value)).toBe(alice);
    await cache.run(job(bob));
    const bobKey = (await redisKeys()).find((k) => k !== aliceKey)!;
    // Alice's very entry object (whose value is remembered) put under bob's name: not opened.
    await store.memory.set(bobKey, store.memory.getNow(aliceKey!)!, HOUR);
    const forBob = await cache.run(job(bob));
    expect(rejected).toEqual(['foreign-key']);
    expect(viewerOf(forBob.value)).toBe(bob);
    expect(forBob.value).not.toBe(first.value);
    expect(inner.calls).toBe(2);
  });

  it("values: 'cloned' — memory-tier hits each get a copy of their key's value; alice's never reaches bob", async () => {
    const { store, cache, inner, rejected } = await setup(undefined, 'cloned');
    await cache.run(job(alice));
    const [aliceKey] = await redisKeys();
    const first = await cache.run(job(alice));
    const second = await cache.run(job(alice));
    expect(first.fromCache && second.fromCache).toBe(true);
    const mine = first.value as { viewer: string; rows: { patient: string }[] };
    expect(second.value).not.toBe(mine);
    expect(Object.isFrozen(mine.rows[0])).toBe(false);
    mine.viewer = bob;
    mine.rows[0]!.patient = 'changed';
    expect(second.value).toEqual({ viewer: alice, rows: [{ patient: `record of ${alice}` }] });
    expect((await cache.run(job(alice))).value).toEqual(second.value);
    await cache.run(job(bob));
    const bobKey = (await redisKeys()).find((k) => k !== aliceKey)!;
    // Alice's very entry object (whose value is kept) put under bob's name: not opened.
    await store.memory.set(bobKey, store.memory.getNow(aliceKey!)!, HOUR);
    const forBob = await cache.run(job(bob));
    expect(rejected).toEqual(['foreign-key']);
    expect(viewerOf(forBob.value)).toBe(bob);
    expect(inner.calls).toBe(2);
  });
});
