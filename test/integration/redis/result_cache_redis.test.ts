import { AsyncLocalStorage } from 'node:async_hooks';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { decodeEntry } from '../../../src/cache/cache_entry.js';
import { canonicalKeyInput, keyDigest } from '../../../src/cache/cache_key.js';
import type { CachedExecutor, JobResult } from '../../../src/index.js';
import { cachedResultPath, RedisCacheStore, withResultCache } from '../../../src/index.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { countdown, deferred } from '../../helpers/deferred.js';
import { makeJob } from '../../helpers/jobs.js';
import { deleteKeys, rawClient, uniquePrefix } from '../../helpers/redis.js';

const url = inject('redisUrl');
const prefix = uniquePrefix('result_cache_redis');
const alice = 'alice@example.com';
const bob = 'bob@example.com';
const args = { region: 'eu', rows: 200 };
let raw: Redis;
let client: Redis;
const caches: CachedExecutor[] = [];

beforeAll(async () => {
  raw = await rawClient(url);
  client = await rawClient(url, { enableOfflineQueue: false, maxRetriesPerRequest: 0 });
});

afterEach(async () => {
  for (const cache of caches.splice(0)) expect(cache.inFlight).toBe(0);
  await deleteKeys(raw, prefix);
});

afterAll(async () => {
  await client.quit();
  await raw.quit();
});

function setup(inner = new CountingExecutor()) {
  const clock = new ManualClock();
  const store = new RedisCacheStore({ redis: client, prefix });
  // In clear: these tests read entries under their `cachedResultPath` names.
  const cache = withResultCache(inner, { store, now: clock.now, seal: false });
  caches.push(cache);
  return { cache, inner, clock, store };
}

const job = (viewer: string | null, extra: Parameters<typeof makeJob>[0] = {}) =>
  makeJob({ viewer, args, cacheTtlS: 60, ...extra });
const viewerOf = (result: JobResult) => (result.value as { viewer: unknown }).viewer;

describe('withResultCache on RedisCacheStore', () => {
  it('two viewers, sequentially: each gets only its own value, each executes once', async () => {
    const { cache, inner } = setup();
    const results = [];
    for (const viewer of [alice, bob, null, alice, bob, null])
      results.push(await cache.run(job(viewer)));
    expect(results.map(viewerOf)).toEqual([alice, bob, null, alice, bob, null]);
    expect(results.map((r) => r.fromCache)).toEqual([false, false, false, true, true, true]);
    expect(inner.callsFor(alice)).toBe(1);
    expect(inner.callsFor(bob)).toBe(1);
    expect(inner.callsFor(null)).toBe(1);
    expect(await raw.keys(`${prefix}*`)).toHaveLength(3);
  });

  it('two viewers, concurrently: never coalesced across viewers; 50 of one viewer run once', async () => {
    const gate = deferred();
    const inner = new CountingExecutor(async (j) => {
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache } = setup(inner);
    const joined = countdown(98);
    cache.events.on('cache:coalesced', () => joined.arrive());
    const runs = [alice, bob].flatMap((viewer) =>
      Array.from({ length: 50 }, () => cache.run(job(viewer)).then((r) => [viewer, r] as const)),
    );
    await joined.done;
    expect(inner.calls).toBe(2);
    gate.resolve();
    for (const [viewer, result] of await Promise.all(runs)) expect(viewerOf(result)).toBe(viewer);
    expect(inner.callsFor(alice)).toBe(1);
    expect(inner.callsFor(bob)).toBe(1);
    expect(cache.stats).toMatchObject({ misses: 2, coalesced: 98, stored: 2 });
  });

  it('a hit hands back bytes identical to the payload of a raw GET', async () => {
    const payload = { rows: Array.from({ length: 500 }, (_, i) => ({ i, name: `row ${i} é 😀` })) };
    const { cache, clock } = setup(new CountingExecutor(() => payload));
    const first = await cache.run(job(alice));
    const j = job(alice);
    const key = cachedResultPath(j);
    const entry = await raw.getBuffer(prefix + key);
    expect(entry).not.toBeNull();
    const stored = decodeEntry(entry!, keyDigest(canonicalKeyInput(j)), clock.now());
    expect(stored).toBeInstanceOf(Uint8Array);

    const hit = await cache.run(j);
    expect(hit.fromCache).toBe(true);
    expect(Buffer.from(hit.json()).equals(Buffer.from(stored as Uint8Array))).toBe(true);
    expect(Buffer.from(hit.json()).equals(Buffer.from(first.json()))).toBe(true);
    expect(hit.value).toEqual(payload);
  });

  it('an error is not stored; the next call executes again', async () => {
    let fail = true;
    const inner = new CountingExecutor((j) => {
      if (fail) throw new Error('boom');
      return { viewer: j.perms.endUserEmail };
    });
    const { cache } = setup(inner);
    await expect(cache.run(job(alice))).rejects.toThrow('boom');
    expect(await raw.keys(`${prefix}*`)).toEqual([]);
    fail = false;
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    expect((await cache.run(job(alice))).fromCache).toBe(true);
    expect(inner.calls).toBe(2);
  });

  it('TTL expiry re-executes (envelope expiry on the injected clock)', async () => {
    const { cache, clock, inner } = setup();
    await cache.run(job(alice, { cacheTtlS: 30 }));
    clock.advance(30_001);
    expect((await cache.run(job(alice, { cacheTtlS: 30 }))).fromCache).toBe(false);
    expect(inner.calls).toBe(2);
    expect(await raw.pttl(prefix + cachedResultPath(job(alice)))).toBeGreaterThan(29_000);
  });

  it('a corrupted entry is a miss: counted as rejected, re-executed and overwritten', async () => {
    const { cache, inner, clock } = setup();
    const j = job(alice);
    const key = prefix + cachedResultPath(j);
    await raw.set(key, Buffer.from('\x00\x01garbage from somewhere else'), 'PX', 60_000);
    const reasons: string[] = [];
    cache.events.on('cache:rejected', (e) => reasons.push(e.reason));
    const result = await cache.run(j);
    expect(result.fromCache).toBe(false);
    expect(viewerOf(result)).toBe(alice);
    expect(reasons).toEqual(['corrupt']);
    expect(cache.stats.rejected).toBe(1);
    const rewritten = await raw.getBuffer(key);
    expect(decodeEntry(rewritten!, keyDigest(canonicalKeyInput(j)), clock.now())).toBeInstanceOf(
      Uint8Array,
    );
    expect((await cache.run(j)).fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });

  it('a valid entry copied under another key is a miss: rejected, re-executed, overwritten', async () => {
    const { cache, inner } = setup();
    await cache.run(job(bob));
    const bobsKey = prefix + cachedResultPath(job(bob));
    const alicesKey = prefix + cachedResultPath(job(alice));
    await raw.set(alicesKey, (await raw.getBuffer(bobsKey))!, 'PX', 60_000);
    const reasons: string[] = [];
    cache.events.on('cache:rejected', (e) => reasons.push(e.reason));

    const result = await cache.run(job(alice));
    expect(viewerOf(result)).toBe(alice);
    expect(result.fromCache).toBe(false);
    expect(reasons).toEqual(['foreign-key']);
    expect(cache.stats.rejected).toBe(1);
    expect((await raw.getBuffer(alicesKey))!.equals((await raw.getBuffer(bobsKey))!)).toBe(false);
    const again = await cache.run(job(alice));
    expect(again.fromCache).toBe(true);
    expect(viewerOf(again)).toBe(alice);
    expect(inner.callsFor(alice)).toBe(1);
  });
});

// Whoever runs the cache in an async context (a request's, a trace's) keeps it through the
// store's reply: a hit's listeners and a miss's runnable see the caller's context, not the
// context the Redis connection was made in.
describe("the caller's async context", () => {
  it('reaches hit listeners and a miss runnable through a Redis read', async () => {
    const { cache, inner } = setup();
    const als = new AsyncLocalStorage<string>();
    const seen: (string | undefined)[] = [];
    inner.behaviour = (j) => {
      seen.push(`miss:${als.getStore()}`);
      return { viewer: j.perms.endUserEmail };
    };
    cache.events.on('cache:hit', () => seen.push(`hit:${als.getStore()}`));
    await als.run('first', () => cache.run(job(alice)));
    // The hit's GET goes out in a command built during the first run (redis_store.ts): the
    // caller still resumes in its own context.
    await als.run('second', async () => {
      await cache.run(job(alice));
      seen.push(`after:${als.getStore()}`);
    });
    expect(seen).toEqual(['miss:first', 'hit:second', 'after:second']);
  });
});
