import { describe, expect, it } from 'vitest';
import type { CacheStore } from '../../src/index.js';
import { errors, MemoryCacheStore, withResultCache } from '../../src/index.js';
import { ManualClock } from '../helpers/clock.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';
import { captureLogger } from '../helpers/log_capture.js';

const alice = 'alice@example.com';

/** A chaos store (a seam): a memory store that throws on demand, and counts what reached it. */
class FailingStore implements CacheStore {
  /** In process, like the memory store it wraps: unsealed by default. */
  readonly shared = false;
  failGet = false;
  failSet = false;
  gets = 0;
  sets = 0;
  constructor(readonly inner: CacheStore) {}
  async get(key: string): Promise<Uint8Array | null> {
    this.gets++;
    if (this.failGet) {
      throw new errors.E_STORE_UNAVAILABLE('redis get failed', {
        // ioredis errors carry the command (key and value) in fields beside the message
        cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), {
          command: { name: 'get', args: [key] },
        }),
      });
    }
    return this.inner.get(key);
  }
  async set(key: string, value: Uint8Array, ttlMs: number): Promise<void> {
    this.sets++;
    if (this.failSet) throw new Error('READONLY You cannot write against a read only replica.');
    return this.inner.set(key, value, ttlMs);
  }
  async delete(key: string): Promise<void> {
    return this.inner.delete(key);
  }
  set failing(on: boolean) {
    this.failGet = on;
    this.failSet = on;
  }
}

function setup(storeRestAfterFailure = 1000) {
  const clock = new ManualClock();
  const store = new FailingStore(new MemoryCacheStore({ now: clock.now }));
  const inner = new CountingExecutor();
  const { logger, lines } = captureLogger();
  const cache = withResultCache(inner, { store, now: clock.now, logger, storeRestAfterFailure });
  const warnings = () => lines().filter((line) => line['level'] === 40);
  const infos = () => lines().filter((line) => line['level'] === 30);
  const errorEvents: unknown[] = [];
  cache.events.on('store:error', (e) => errorEvents.push(e));
  const job = (args: Record<string, unknown> = { q: 1 }) =>
    makeJob({ viewer: alice, args, cacheTtlS: 60 });
  return { clock, store, inner, cache, lines, warnings, infos, errorEvents, job };
}

describe('a store that throws', () => {
  it('degrades to uncached runs, counts, logs once per burst, rests, and recovers', async () => {
    const { clock, store, inner, cache, lines, warnings, infos, errorEvents, job } = setup(1000);
    await cache.run(job());
    expect((await cache.run(job())).fromCache).toBe(true);

    store.failing = true;
    const failed = await cache.run(job());
    expect(failed.fromCache).toBe(false);
    expect((failed.value as { viewer: unknown }).viewer).toBe(alice);
    expect(cache.stats.storeErrors).toBe(1);
    expect(warnings()).toHaveLength(1);
    expect(errorEvents).toEqual([
      { op: 'get', code: 'E_STORE_UNAVAILABLE', message: expect.any(String) },
    ]);

    // resting: the store is not even asked, runs go uncached
    const gets = store.gets;
    for (let i = 0; i < 20; i++) expect((await cache.run(job())).fromCache).toBe(false);
    expect(store.gets).toBe(gets);
    expect(store.sets).toBe(1);
    expect(cache.stats.bypasses).toBe(20);

    // after the rest it is asked again; still failing is the same burst (no new warning)
    clock.advance(1001);
    expect((await cache.run(job())).fromCache).toBe(false);
    expect(cache.stats.storeErrors).toBe(2);
    expect(warnings()).toHaveLength(1);

    // it answers again: no run failed, and the cache works once the rest is over
    store.failing = false;
    expect((await cache.run(job())).fromCache).toBe(false); // still resting
    clock.advance(1001);
    expect((await cache.run(job())).fromCache).toBe(true); // the entry from before survived
    expect(infos()).toHaveLength(1);
    expect((await cache.run(job({ q: 2 }))).fromCache).toBe(false);
    expect((await cache.run(job({ q: 2 }))).fromCache).toBe(true);
    expect(inner.calls).toBe(1 + 1 + 20 + 1 + 1 + 1);

    // a new burst logs again
    store.failing = true;
    await cache.run(job({ q: 3 }));
    expect(warnings()).toHaveLength(2);

    // nothing logged names the viewer, the key or the args
    const text = JSON.stringify(lines());
    expect(text).not.toContain(alice);
    expect(text).not.toContain('/cache/');
    expect(warnings()[0]).toMatchObject({ op: 'get', code: 'E_STORE_UNAVAILABLE' });
  });

  it('a failing write still returns the result, counts, and rests', async () => {
    const { store, cache, clock, job, warnings } = setup(1000);
    store.failSet = true;
    const notStored: string[] = [];
    cache.events.on('cache:not-stored', (e) => notStored.push(e.reason));
    const result = await cache.run(job());
    expect(result.fromCache).toBe(false);
    expect(cache.stats).toMatchObject({ storeErrors: 1, stored: 0, notStored: 1 });
    expect(notStored).toEqual(['store-failed']);
    expect(warnings()).toHaveLength(1);
    store.failSet = false;
    clock.advance(1001);
    await cache.run(job());
    expect((await cache.run(job())).fromCache).toBe(true);
  });

  it('with storeRestAfterFailure 0 the store is tried on every call, logged once', async () => {
    const { store, inner, cache, warnings, infos } = setup(0);
    store.failing = true;
    for (let i = 0; i < 5; i++)
      expect((await cache.run(makeJob({ viewer: alice }))).fromCache).toBe(false);
    expect(inner.calls).toBe(5);
    expect(store.gets).toBe(5);
    expect(store.sets).toBe(5);
    expect(cache.stats.storeErrors).toBe(10);
    expect(warnings()).toHaveLength(1);
    store.failing = false;
    await cache.run(makeJob({ viewer: alice }));
    expect((await cache.run(makeJob({ viewer: alice }))).fromCache).toBe(true);
    expect(infos()).toHaveLength(1);
  });

  it('never fails a coalesced run either', async () => {
    const { store, cache, job, inner } = setup(1000);
    store.failing = true;
    const results = await Promise.all(Array.from({ length: 5 }, () => cache.run(job())));
    expect(results.every((r) => !r.fromCache)).toBe(true);
    expect(inner.calls).toBeGreaterThanOrEqual(1);
    expect(cache.stats.storeErrors).toBeGreaterThanOrEqual(1);
  });
});
