import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { MemoryCacheStore } from '../../src/index.js';
import { ENTRY_OVERHEAD, entryCost } from '../../src/stores/memory_store.js';
import { ManualClock } from '../helpers/clock.js';
import { registerStoreConformance } from '../store_conformance.js';

let clock = new ManualClock();

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/** Heap and ArrayBuffer bytes in use after full collections. */
function measuredBytes(): number {
  gc();
  gc();
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  return heapUsed + arrayBuffers;
}

registerStoreConformance('MemoryCacheStore', {
  create() {
    clock = new ManualClock();
    return new MemoryCacheStore({ now: clock.now });
  },
  async elapse(ms) {
    clock.advance(ms);
  },
  async cleanup(store) {
    await store.close?.();
  },
});

registerStoreConformance('MemoryCacheStore on a clock starting at 0', {
  create() {
    clock = new ManualClock(0);
    return new MemoryCacheStore({ now: clock.now });
  },
  async elapse(ms) {
    clock.advance(ms);
  },
  async cleanup(store) {
    await store.close?.();
  },
});

describe('MemoryCacheStore bounds', () => {
  it('evicts the least recently used entries to stay under maxBytes', async () => {
    // three entries fit, a fourth does not
    const maxBytes = 3 * entryCost('a', new Uint8Array(300)) + 100;
    const store = new MemoryCacheStore({ maxBytes, maxEntryBytes: 400 });
    const value = new Uint8Array(300);
    await store.set('a', value, 60_000);
    await store.set('b', value, 60_000);
    await store.get('a'); // a is now more recent than b
    await store.set('c', value, 60_000);
    await store.set('d', value, 60_000);
    expect(store.bytes).toBeLessThanOrEqual(maxBytes);
    expect(await store.get('b')).toBeNull();
    expect(await store.get('d')).not.toBeNull();
  });

  it('does not store an entry above maxEntryBytes (and drops the old value)', async () => {
    const store = new MemoryCacheStore({ maxBytes: 1000, maxEntryBytes: 100 });
    await store.set('k', new Uint8Array(10), 60_000);
    await store.set('k', new Uint8Array(200), 60_000);
    expect(await store.get('k')).toBeNull();
    expect(store.size).toBe(0);
  });

  it('counts keys and the per-entry overhead against the bound', async () => {
    const store = new MemoryCacheStore({ maxBytes: 10_000 });
    await store.set('k'.repeat(50), new Uint8Array(10), 60_000);
    expect(store.bytes).toBe(ENTRY_OVERHEAD + 60);
  });

  it.each([100, 1024, 10_000])(
    'holds no more memory than maxBytes says, measured (%i-byte entries)',
    async (valueBytes) => {
      const maxBytes = 24 << 20;
      const before = measuredBytes();
      const store = new MemoryCacheStore({ maxBytes });
      // Fill to the bound and past it (evictions), with values allocated as entries are.
      for (let i = 0; i < (2 * maxBytes) / (valueBytes + 200); i++) {
        const value = Buffer.allocUnsafe(valueBytes).fill(i & 0xff);
        await store.set(`ws/cache/${i.toString(16).padStart(64, '0')}`, value, 60_000);
      }
      const held = measuredBytes() - before;
      expect(store.bytes).toBeGreaterThan(maxBytes * 0.95);
      expect(held).toBeLessThanOrEqual(maxBytes);
      // …and not by a wide margin either: the bound is a budget, not a guess.
      expect(held).toBeGreaterThan(maxBytes * 0.5);
      await store.close();
    },
  );

  it('refuses bad options with a TypeError naming them', () => {
    expect(() => new MemoryCacheStore({ maxBytes: 0 })).toThrow(/maxBytes/);
    expect(() => new MemoryCacheStore({ maxBytes: 10, maxEntryBytes: 20 })).toThrow(
      /maxEntryBytes/,
    );
    expect(() => new MemoryCacheStore({ now: 5 as unknown as () => number })).toThrow(/now/);
  });
});
