import { describe, expect, it } from 'vitest';
import type { CacheStore } from '../../src/index.js';
import { MemoryCacheStore, withResultCache } from '../../src/index.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { deferred } from '../helpers/deferred.js';
import { makeJob } from '../helpers/jobs.js';

// `knownMiss`: a queue worker runs a miss the server has just had; it does not read the store
// again, but the run is still coalesced by key and its result stored as on any miss.

/** A store whose reads are counted. */
function countingStore(): { store: CacheStore; reads: () => number } {
  const inner = new MemoryCacheStore();
  let reads = 0;
  const store: CacheStore = {
    get: (key) => {
      reads++;
      return inner.get(key);
    },
    set: (key, value, ttlMs) => inner.set(key, value, ttlMs),
    delete: (key) => inner.delete(key),
    shared: false,
  };
  return { store, reads: () => reads };
}

const job = (n: number) => makeJob({ viewer: 'alice@example.com', args: { n }, cacheTtlS: 60 });

describe('a run the caller already missed (knownMiss)', () => {
  it('executes without reading the store, and stores its result for the next lookup', async () => {
    const { store, reads } = countingStore();
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store });
    const first = await cache.run(job(1), { knownMiss: true });
    expect(first.fromCache).toBe(false);
    expect(reads()).toBe(0);
    expect(inner.calls).toBe(1);
    // Stored as on any miss: an ordinary lookup of the same key is a hit.
    const again = await cache.run(job(1));
    expect(again.fromCache).toBe(true);
    expect(reads()).toBe(1);
    expect(inner.calls).toBe(1);
    expect(cache.stats.misses).toBe(1);
  });

  it('still joins an identical run in flight, and is not passed on to child runs', async () => {
    const { store } = countingStore();
    const gate = deferred<void>();
    const inner = new CountingExecutor(async (j, options) => {
      await gate.promise;
      return { n: j.args['n'], passed: options?.knownMiss ?? null };
    });
    const cache = withResultCache(inner, { store });
    const a = cache.run(job(2), { knownMiss: true });
    const b = cache.run(job(2), { knownMiss: true });
    gate.resolve();
    const [ra, rb] = await Promise.all([a, b]);
    expect(inner.calls).toBe(1);
    expect(ra.value).toEqual({ n: 2, passed: null });
    expect(rb.value).toEqual({ n: 2, passed: null });
  });
});
