import { afterEach, describe, expect, it, vi } from 'vitest';
import { settleWithin } from '../../src/util/settle_within.js';
import { deferred } from '../helpers/deferred.js';

// What close() waits for its background work with: everything under way, then and added while
// waiting, but never longer than the bound, and never by spinning on what already settled.

afterEach(() => {
  vi.useRealTimers();
});

describe('settleWithin', () => {
  it('waits for every promise, including one added while it waits, and rejections', async () => {
    const pending = new Set<Promise<unknown>>();
    const first = deferred<void>();
    const second = deferred<void>();
    const track = (promise: Promise<unknown>) => {
      pending.add(promise);
      const forget = () => pending.delete(promise);
      promise.then(forget, forget);
    };
    track(first.promise);
    let done = false;
    const waiting = settleWithin(pending, 60_000).then(() => {
      done = true;
    });
    // Settling work starts more work: it is waited for too.
    void first.promise.then(() => track(second.promise));
    first.resolve();
    await new Promise((resolve) => setImmediate(resolve));
    expect(done).toBe(false);
    second.reject(new Error('failed quietly'));
    await waiting;
    expect(done).toBe(true);
  });

  it('a settled promise left in the set is awaited once, not spun on', async () => {
    const settled = Promise.resolve();
    await settleWithin(new Set([settled]), 60_000);
  });

  it('resolves after the bound when a promise never settles', async () => {
    vi.useFakeTimers();
    const never = new Promise<void>(() => {});
    let done = false;
    const waiting = settleWithin(new Set([never]), 2000).then(() => {
      done = true;
    });
    await vi.advanceTimersByTimeAsync(1999);
    expect(done).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    await waiting;
    expect(done).toBe(true);
  });
});
