import { describe, expect, it } from 'vitest';
import type { CacheStore } from '../../src/index.js';
import { MemoryCacheStore, withResultCache } from '../../src/index.js';
import { ManualClock } from '../helpers/clock.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';

/** A memory store that counts how it is read. */
function countingStore(clock: ManualClock) {
  const inner = new MemoryCacheStore({ now: clock.now });
  const reads = { get: 0, getNow: 0 };
  const store: CacheStore & { reads: typeof reads } = {
    shared: false,
    reads,
    get: (key) => {
      reads.get++;
      return inner.get(key);
    },
    getNow: (key) => {
      reads.getNow++;
      return inner.getNow(key);
    },
    set: (key, value, ttlMs, tag) => inner.set(key, value, ttlMs, tag),
    delete: (key) => inner.delete(key),
  };
  return store;
}

describe('a store that answers from process memory is read without a promise (getNow)', () => {
  it('a hit is read through getNow alone (no get, no store promise)', async () => {
    const clock = new ManualClock();
    const store = countingStore(clock);
    const cache = withResultCache(new CountingExecutor(), { store, now: clock.now });
    const job = makeJob({ viewer: 'alice@example.com' });
    await cache.run(job); // miss: computed and stored
    store.reads.get = 0;
    store.reads.getNow = 0;
    const hit = await cache.run({ ...job, id: 'again' });
    expect(hit.fromCache).toBe(true);
    expect(hit.jobId).toBe('again');
    expect(store.reads).toEqual({ get: 0, getNow: 1 });
    expect(cache.stats.hits).toBe(1);
  });

  it('anything getNow does not hold goes through get: a miss, an expired entry, a throw', async () => {
    const clock = new ManualClock();
    const store = countingStore(clock);
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store, now: clock.now });
    const job = makeJob({ viewer: 'bob@example.com', cacheTtlS: 10 });
    await cache.run(job);
    expect(store.reads.get).toBe(1); // the first lookup missed in memory, then asked get
    // Expired: getNow may still hold it for a moment; the envelope says no, get decides.
    clock.advance(10_001);
    const after = await cache.run(job);
    expect(after.fromCache).toBe(false);
    expect(inner.calls).toBe(2);
    // A getNow that throws is not a failure of the run: get answers.
    store.getNow = () => {
      throw new Error('boom');
    };
    const hit = await cache.run(job);
    expect(hit.fromCache).toBe(true);
    expect(cache.stats.storeErrors).toBe(0);
  });
});
