import { describe, expect, it } from 'vitest';
import type { CacheStore } from '../../src/index.js';
import { MemoryCacheStore, withResultCache } from '../../src/index.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { type Deferred, deferred } from '../helpers/deferred.js';
import { makeJob } from '../helpers/jobs.js';

// `writeBehind`: a queue worker hands its answer back once the entry's write is sent, not once
// the store acknowledged it. The write still happens (or is counted as failed); only the wait
// for its reply goes.

/**
 * A memory store whose writes are answered only when the test says. `holds`: a write is kept at
 * once, as Redis keeps a write it has read (answered later); otherwise only once acknowledged,
 * so a refused write leaves nothing behind.
 */
function gatedStore(holds = true): { store: CacheStore; acks: Deferred<void>[] } {
  const inner = new MemoryCacheStore();
  const acks: Deferred<void>[] = [];
  const store: CacheStore = {
    get: (key) => inner.get(key),
    set: (key, value, ttlMs) => {
      const ack = deferred<void>();
      acks.push(ack);
      return holds
        ? inner.set(key, value, ttlMs).then(() => ack.promise)
        : ack.promise.then(() => inner.set(key, value, ttlMs));
    },
    delete: (key) => inner.delete(key),
    shared: false,
  };
  return { store, acks };
}

/** Whether `promise` has settled after the turns already queued have run (no timer involved). */
async function settledNow(promise: Promise<unknown>): Promise<boolean> {
  let settled = false;
  promise.then(
    () => {
      settled = true;
    },
    () => {
      settled = true;
    },
  );
  await new Promise<void>((resolve) => setImmediate(resolve));
  return settled;
}

const job = (n: number) => makeJob({ viewer: 'alice@example.com', args: { n }, cacheTtlS: 60 });

describe('a run whose entry is written behind it (writeBehind)', () => {
  it('is answered before the store acknowledges the write, and its entry is stored', async () => {
    const { store, acks } = gatedStore();
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store });
    const first = await cache.run(job(1), { knownMiss: true, writeBehind: true });
    expect(first.fromCache).toBe(false);
    expect(acks).toHaveLength(1);
    acks[0]!.resolve();
    await acks[0]!.promise;
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(cache.stats.stored).toBe(1);
    const again = await cache.run(job(1));
    expect(again.fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });

  it('without it, a miss waits for the acknowledgement', async () => {
    const { store, acks } = gatedStore();
    const cache = withResultCache(new CountingExecutor(), { store });
    const run = cache.run(job(2));
    expect(await settledNow(run)).toBe(false);
    expect(acks).toHaveLength(1);
    acks[0]!.resolve();
    expect((await run).fromCache).toBe(false);
  });

  it('a write that fails is counted and never fails the run; the next lookup misses', async () => {
    const { store, acks } = gatedStore(false);
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store });
    const result = await cache.run(job(3), { writeBehind: true });
    expect(result.value).toBeDefined();
    acks[0]!.reject(new Error('redis went away'));
    await acks[0]!.promise.catch(() => {});
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(cache.stats.notStored).toBe(1);
    expect(cache.stats.storeErrors).toBe(1);
    expect(cache.stats.stored).toBe(0);
    expect((await cache.run(job(3))).fromCache).toBe(false);
    expect(inner.calls).toBe(2);
  });
});
