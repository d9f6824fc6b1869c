/**
 * Where cached results live: a byte store with per-entry TTL. The middleware owns the envelope
 * (see `cache_entry.ts`); a store only moves bytes. Implementations must not interpret, log or
 * label keys or values: keys identify a viewer's entry and values hold their rows.
 */
export interface CacheStore {
  /** The bytes stored under `key`, or `null`. Rejects when the store is unreachable. */
  get(key: string): Promise<Uint8Array | null>;
  /** Stores `value` under `key` for `ttlMs` milliseconds (> 0). */
  set(key: string, value: Uint8Array, ttlMs: number): Promise<void>;
  /** Removes `key`; resolves whether or not it existed. */
  delete(key: string): Promise<void>;
  /** Releases connections the store opened itself (never an injected client). */
  close?(): Promise<void>;
}
