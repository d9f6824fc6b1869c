import { LRUCache } from 'lru-cache';
import { type ByteSize, resolveByteSize } from '../duration.js';
import type { CacheStore } from './store.js';

/**
 * Bytes one entry costs beyond its key's characters and its value's bytes: lru-cache's map
 * entry and list slots, the key string's header, the value's `Uint8Array` and `ArrayBuffer`
 * objects (each value in memory of its own: see {@link ownBytes}). Measured on Node 20
 * (V8 11.3) as heap + external growth after full GCs, filling 40–130 k entries
 * (`bench/memory_entry_process.ts`, and the store alone with values of 100 B to 64 KiB):
 * 328–362 bytes per entry under keys named as the cache names them (`<workspace>/cache/` and
 * a hex digest), 1 KiB results through `createViewerCache(...).run` held 1.51 KB each against
 * 1.55 KB counted. A key the caller built from many pieces (`padStart`, nested templates) can
 * cost up to ~160 bytes more than its characters: V8 keeps its concatenation nodes.
 * Not counted: the allocator's own bookkeeping of each value's memory, which shows in RSS
 * only (RSS grew ≈ 1.3× heap + external at 1 KiB, ≈ 1.0× from 10 KiB up): size a container
 * with that margin (`docs/memory-store.md`).
 */
export const ENTRY_OVERHEAD = 400;

/**
 * Bytes a tagged entry costs beyond {@link ENTRY_OVERHEAD}: its slot in the key → tag map and
 * in its tag's key set (two hash-table entries, the set itself shared by the tag's entries).
 * Measured as above, tagged minus untagged over 300 tags: 57–161 bytes (100 B to 64 KiB).
 */
export const TAG_OVERHEAD = 96;

/**
 * `bytes` itself when it is the whole of its memory, else a copy in memory of its own. A small
 * `Buffer` is usually a slice of Node's shared 8 KiB pool (`Buffer.from`, `allocUnsafe`), and a
 * reply from a socket a view into a larger read buffer: held as is, an entry would keep the
 * whole slab alive while counting only its own bytes. Measured through
 * `createViewerCache(...).run` (100 k entries of 1 KiB JSON): 2.72 KB held per entry against
 * 1.68 KB counted when entries were pool slices.
 */
export function ownBytes(bytes: Uint8Array): Uint8Array {
  if (bytes.byteOffset === 0 && bytes.buffer.byteLength === bytes.byteLength) return bytes;
  const own = Buffer.allocUnsafeSlow(bytes.byteLength);
  own.set(bytes);
  return own;
}

/** What an entry counts against `maxBytes`. */
export function entryCost(key: string, value: Uint8Array): number {
  return ENTRY_OVERHEAD + key.length + value.byteLength;
}

export interface RawMemoryCacheStoreOptions {
  /**
   * Upper bound on the memory held: keys, values and a fixed per-entry overhead
   * (`ENTRY_OVERHEAD`). The least recently used entries are evicted to stay under it.
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
  /** Private to this process: needs no sealing (the process holds the secret anyway). */
  readonly shared = false;
  readonly #lru: LRUCache<string, Uint8Array>;
  readonly #maxEntryBytes: number;
  /**
   * The tag each tagged entry was set with, and the entries of each tag: what a path
   * invalidation drops by ({@link deleteTag}). Kept in step by the LRU's `dispose`, which runs
   * whenever an entry leaves (evicted, expired on read, replaced, deleted, cleared). Reads never
   * touch them: the hit path is the LRU lookup alone.
   */
  readonly #tagOf = new Map<string, string>();
  readonly #byTag = new Map<string, Set<string>>();

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
    this.#maxEntryBytes = maxEntrySize;
    this.#lru = new LRUCache<string, Uint8Array>({
      maxSize,
      // maxEntryBytes bounds key and value (checked in set); the overhead only counts to maxSize.
      maxEntrySize: maxSize,
      // Keys count too (100 k viewers' small entries are mostly key), and so does what holding
      // an entry costs beyond its bytes: see ENTRY_OVERHEAD.
      sizeCalculation: (value, key) => entryCost(key, value),
      // TTLs are checked lazily on read; no timer per entry.
      ttlAutopurge: false,
      dispose: (_value, key) => this.#untag(key),
      ...(now ? { perf: { now: () => now() + offset }, ttlResolution: 0 } : {}),
    });
  }

  async get(key: string): Promise<Uint8Array | null> {
    return this.#lru.get(key) ?? null;
  }

  /** The entry under `key` now, without a promise (the two-tier store's hit path). */
  getNow(key: string): Uint8Array | null {
    return this.#lru.get(key) ?? null;
  }

  /** Drops every entry whose key starts with `prefix` (one pass over the keys). */
  deletePrefix(prefix: string): void {
    const doomed: string[] = [];
    for (const key of this.#lru.keys()) if (key.startsWith(prefix)) doomed.push(key);
    for (const key of doomed) this.#lru.delete(key);
  }

  /**
   * Drops every entry set with `tag`, and, when `untaggedPrefix` is given, every entry set
   * *without* a tag whose key starts with it (a writer that did not say which runnable an entry
   * is of: dropped as its whole workspace would be). Tagged entries cost no pass over the keys;
   * the pass is made only while untagged entries are held.
   */
  deleteTag(tag: string, untaggedPrefix?: string): void {
    const keys = this.#byTag.get(tag);
    // Each delete disposes, which edits the set: iterate a copy.
    if (keys !== undefined) for (const key of [...keys]) this.#lru.delete(key);
    if (untaggedPrefix === undefined || this.#lru.size <= this.#tagOf.size) return;
    const doomed: string[] = [];
    for (const key of this.#lru.keys()) {
      if (key.startsWith(untaggedPrefix) && !this.#tagOf.has(key)) doomed.push(key);
    }
    for (const key of doomed) this.#lru.delete(key);
  }

  async set(key: string, input: Uint8Array, ttlMs: number, tag?: string): Promise<void> {
    if (key.length + input.byteLength > this.#maxEntryBytes) {
      // Not stored, and an older value under the key must not outlive the newer result.
      this.#lru.delete(key);
      return;
    }
    const value = ownBytes(input);
    const ttl = Math.max(1, Math.ceil(ttlMs));
    if (tag === undefined) {
      this.#lru.set(key, value, { ttl });
      return;
    }
    // Replacing an entry disposes the old one (and its tag) before this returns.
    this.#lru.set(key, value, { ttl, size: entryCost(key, value) + TAG_OVERHEAD });
    if (!this.#lru.has(key)) return; // refused by the LRU itself: nothing to index
    this.#tagOf.set(key, tag);
    let keys = this.#byTag.get(tag);
    if (keys === undefined) {
      keys = new Set();
      this.#byTag.set(tag, keys);
    }
    keys.add(key);
  }

  /** Forgets `key`'s tag (the entry is leaving). */
  #untag(key: string): void {
    const tag = this.#tagOf.get(key);
    if (tag === undefined) return;
    this.#tagOf.delete(key);
    const keys = this.#byTag.get(tag);
    if (keys === undefined) return;
    keys.delete(key);
    if (keys.size === 0) this.#byTag.delete(tag);
  }

  async delete(key: string): Promise<void> {
    this.#lru.delete(key);
  }

  /** Entries currently held (expired ones are dropped as they are read). */
  get size(): number {
    return this.#lru.size;
  }

  /** Bytes currently held, as counted against `maxBytes` (overhead included). */
  get bytes(): number {
    return this.#lru.calculatedSize;
  }

  async close(): Promise<void> {
    this.#lru.clear();
  }
}
