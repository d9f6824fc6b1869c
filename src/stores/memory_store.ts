import { LRUCache } from 'lru-cache';
import { type ByteSize, resolveByteSize } from '../duration.js';
import type { CacheStore } from './store.js';

export interface RawMemoryCacheStoreOptions {
  /**
   * Upper bound on the bytes held (keys plus values). The least recently used entries are
   * evicted to stay under it.
   * @default '64mb'
   */
  maxBytes?: ByteSize;
  /**
   * Largest single entry accepted; larger ones are not stored (the run still succeeds).
   * @default maxBytes / 8
   */
  maxEntryBytes?: ByteSize;
  /** Milliseconds clock, for tests. @default Date.now */
  now?: () => number;
}

/**
 * The in-process store, the embedded default when no Redis is configured: an LRU bounded by
 * bytes, with per-entry TTL. Each process has its own, so it is a per-process tier, not a shared
 * cache.
 */
export class MemoryCacheStore implements CacheStore {
  readonly #lru: LRUCache<string, Uint8Array>;

  constructor(options: RawMemoryCacheStoreOptions = {}) {
    const maxSize = resolveByteSize(options.maxBytes ?? '64mb', 'maxBytes');
    const maxEntrySize = resolveByteSize(
      options.maxEntryBytes ?? Math.max(1, Math.floor(maxSize / 8)),
      'maxEntryBytes',
    );
    if (maxEntrySize > maxSize) throw new TypeError('maxEntryBytes must not exceed maxBytes');
    const now = options.now;
    if (now !== undefined && typeof now !== 'function')
      throw new TypeError('now must be a function');
    // lru-cache treats a start time of 0 as "no TTL" and, with its default ttlResolution, reuses
    // one clock reading for 1 ms of *real* time. With an injected clock both would keep entries
    // past their TTL: rebase the clock so it reads ≥ 1, and read it on every check.
    const offset = now === undefined ? 0 : 1 - now();
    this.#lru = new LRUCache<string, Uint8Array>({
      maxSize,
      maxEntrySize,
      // Keys count too: 100 k viewers' small entries are mostly key.
      sizeCalculation: (value, key) => value.byteLength + key.length,
      // TTLs are checked lazily on read; no timer per entry.
      ttlAutopurge: false,
      ...(now ? { perf: { now: () => now() + offset }, ttlResolution: 0 } : {}),
    });
  }

  async get(key: string): Promise<Uint8Array | null> {
    return this.#lru.get(key) ?? null;
  }

  async set(key: string, value: Uint8Array, ttlMs: number): Promise<void> {
    this.#lru.set(key, value, { ttl: Math.max(1, Math.ceil(ttlMs)) });
  }

  async delete(key: string): Promise<void> {
    this.#lru.delete(key);
  }

  /** Entries currently held (expired ones are dropped as they are read). */
  get size(): number {
    return this.#lru.size;
  }

  /** Bytes currently held, as counted against `maxBytes`. */
  get bytes(): number {
    return this.#lru.calculatedSize;
  }

  async close(): Promise<void> {
    this.#lru.clear();
  }
}
