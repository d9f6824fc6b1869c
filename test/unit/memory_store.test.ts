import { hash } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { MemoryCacheStore } from '../../src/index.js';
import { ENTRY_OVERHEAD, entryCost, TAG_OVERHEAD } from '../../src/stores/memory_store.js';
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

  it('counts a tagged entry with its index slots', async () => {
    const store = new MemoryCacheStore({ maxBytes: 10_000 });
    await store.set('k'.repeat(50), new Uint8Array(10), 60_000, 't');
    expect(store.bytes).toBe(ENTRY_OVERHEAD + TAG_OVERHEAD + 60);
  });

  it.each([
    [100, false],
    [1024, false],
    [10_000, false],
    [100, true],
    [1024, true],
  ])(
    'holds no more memory than maxBytes says, measured (%i-byte entries, tagged: %s)',
    async (valueBytes, tagged) => {
      const maxBytes = 24 << 20;
      const before = measuredBytes();
      const store = new MemoryCacheStore({ maxBytes });
      // Tags as the result cache makes them (22 characters), a few hundred runnables.
      const tags = Array.from({ length: 300 }, (_, i) => `${i}`.padStart(22, 't'));
      // Fill to the bound and past it (evictions), with values allocated as entries are.
      for (let i = 0; i < (2 * maxBytes) / (valueBytes + 200); i++) {
        const value = Buffer.allocUnsafe(valueBytes).fill(i & 0xff);
        // Named as the result cache names entries (a key built from many pieces costs more:
        // see ENTRY_OVERHEAD).
        const key = `ws/cache/${hash('sha256', String(i), 'hex')}`;
        await store.set(key, value, 60_000, tagged ? tags[i % tags.length] : undefined);
      }
      const held = measuredBytes() - before;
      expect(store.bytes).toBeGreaterThan(maxBytes * 0.95);
      // The count is what entries cost (± 10 %), not a margin: `memory_store_accounting.test.ts`
      // measures it in a process of its own, where nothing else allocates.
      expect(held).toBeLessThanOrEqual(maxBytes * 1.1);
      // …and not by a wide margin either: the bound is a budget, not a guess.
      expect(held).toBeGreaterThan(maxBytes * 0.5);
      await store.close();
    },
    // Filling 24 MB of 100-byte entries takes seconds on the shared 2-core machine.
    30_000,
  );

  it('refuses bad options with a TypeError naming them', () => {
    expect(() => new MemoryCacheStore({ maxBytes: 0 })).toThrow(/maxBytes/);
    expect(() => new MemoryCacheStore({ maxBytes: 10, maxEntryBytes: 20 })).toThrow(
      /maxEntryBytes/,
    );
    expect(() => new MemoryCacheStore({ now: 5 as unknown as () => number })).toThrow(/now/);
  });
});

describe('MemoryCacheStore tags (what a path invalidation drops by)', () => {
  const v = new Uint8Array(8);

  it('deleteTag drops that tag’s entries, and only the prefix’s untagged ones besides', async () => {
    const store = new MemoryCacheStore();
    await store.set('ws/cache/a1', v, 60_000, 'A');
    await store.set('ws/cache/a2', v, 60_000, 'A');
    await store.set('ws/cache/b1', v, 60_000, 'B');
    await store.set('ws/cache/foreign', v, 60_000); // untagged: its runnable is unknown
    await store.set('other/cache/foreign', v, 60_000);
    store.deleteTag('A', 'ws/');
    expect(store.getNow('ws/cache/a1')).toBeNull();
    expect(store.getNow('ws/cache/a2')).toBeNull();
    expect(store.getNow('ws/cache/foreign')).toBeNull();
    expect(store.getNow('ws/cache/b1')).not.toBeNull();
    expect(store.getNow('other/cache/foreign')).not.toBeNull();
    store.deleteTag('B');
    expect(store.size).toBe(1);
  });

  it('the index follows entries out: replaced, evicted, expired, deleted', async () => {
    const clock = new ManualClock();
    const maxBytes = 3 * (entryCost('ws/cache/x', v) + TAG_OVERHEAD) + 10;
    const store = new MemoryCacheStore({ maxBytes, now: clock.now });
    // Replaced under another tag: the old tag no longer reaches it.
    await store.set('ws/cache/r', v, 60_000, 'OLD');
    await store.set('ws/cache/r', new Uint8Array(8), 60_000, 'NEW');
    store.deleteTag('OLD');
    expect(store.getNow('ws/cache/r')).not.toBeNull();
    store.deleteTag('NEW');
    expect(store.getNow('ws/cache/r')).toBeNull();
    // Evicted, then set again untagged: the evicted entry's tag must not reach the new one.
    await store.set('ws/cache/e', v, 60_000, 'E');
    for (const k of ['1', '2', '3']) await store.set(`ws/cache/${k}`, v, 60_000, 'F');
    expect(store.getNow('ws/cache/e')).toBeNull();
    await store.set('ws/cache/e', v, 60_000);
    store.deleteTag('E');
    expect(store.getNow('ws/cache/e')).not.toBeNull();
    // Expired (dropped on read), then set again untagged.
    await store.set('ws/cache/t', v, 10, 'T');
    clock.advance(20);
    expect(store.getNow('ws/cache/t')).toBeNull();
    await store.set('ws/cache/t', v, 60_000);
    store.deleteTag('T');
    expect(store.getNow('ws/cache/t')).not.toBeNull();
    // Deleted, then set again untagged.
    await store.set('ws/cache/d', v, 60_000, 'D');
    await store.delete('ws/cache/d');
    await store.set('ws/cache/d', v, 60_000);
    store.deleteTag('D');
    expect(store.getNow('ws/cache/d')).not.toBeNull();
  });
});
