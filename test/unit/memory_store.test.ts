import { describe, expect, it } from 'vitest';
import { MemoryCacheStore } from '../../src/index.js';
import { ManualClock } from '../helpers/clock.js';
import { registerStoreConformance } from '../store_conformance.js';

let clock = new ManualClock();

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
    const store = new MemoryCacheStore({ maxBytes: 1000, maxEntryBytes: 400 });
    const value = new Uint8Array(300);
    await store.set('a', value, 60_000);
    await store.set('b', value, 60_000);
    await store.get('a'); // a is now more recent than b
    await store.set('c', value, 60_000);
    await store.set('d', value, 60_000);
    expect(store.bytes).toBeLessThanOrEqual(1000);
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

  it('counts keys against the bound', async () => {
    const store = new MemoryCacheStore({ maxBytes: 1000 });
    await store.set('k'.repeat(50), new Uint8Array(10), 60_000);
    expect(store.bytes).toBe(60);
  });

  it('refuses bad options with a TypeError naming them', () => {
    expect(() => new MemoryCacheStore({ maxBytes: 0 })).toThrow(/maxBytes/);
    expect(() => new MemoryCacheStore({ maxBytes: 10, maxEntryBytes: 20 })).toThrow(
      /maxEntryBytes/,
    );
    expect(() => new MemoryCacheStore({ now: 5 as unknown as () => number })).toThrow(/now/);
  });
});
