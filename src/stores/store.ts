/**
 * Where cached results live: a byte store with per-entry TTL. The middleware owns the envelope
 * (see `cache_entry.ts`); a store only moves bytes, reading at most the clear header of
 * `entry_header.ts`. Implementations must not interpret, log or label keys or values: keys
 * identify a viewer's entry and values hold their rows.
 */
export interface CacheStore {
  /**
   * The bytes stored under `key`, or `null`. Rejects when the store is unreachable.
   *
   * `tag`, when given, is the `pathTag(workspace, path)` of the entry's runnable: a store that keeps what
   * it reads in process may index it by the tag, so that a path invalidation drops only that
   * runnable's entries. It is opaque and keyed per process: keep it in process memory, never in
   * a key name, a log or another process. A store may ignore it.
   */
  get(key: string, tag?: string): Promise<Uint8Array | null>;
  /**
   * The bytes under `key` if this store holds them in process memory now, without a promise;
   * `null` when it holds none *there* (not "absent": the cache then calls {@link get}). Offered
   * by stores that keep entries in process (`MemoryCacheStore`, the memory tier of
   * `TwoTierCacheStore`): a hit then costs no promise of the store's and no extra turn.
   */
  getNow?(key: string): Uint8Array | null;
  /** Stores `value` under `key` for `ttlMs` milliseconds (> 0); `tag` as for {@link get}. */
  set(key: string, value: Uint8Array, ttlMs: number, tag?: string): Promise<void>;
  /** Removes `key`; resolves whether or not it existed. */
  delete(key: string): Promise<void>;
  /** Releases connections the store opened itself (never an injected client). */
  close?(): Promise<void>;
  /** Explicit invalidation, when the store offers it (see {@link CacheInvalidation}). */
  readonly invalidation?: CacheInvalidation;
  /**
   * Whether other processes (or people) can reach what this store holds. A shared store is used
   * sealed unless the cache is told `seal: false` (SPEC invariant 21). Only a store that is
   * private to its process (the in-process {@link MemoryCacheStore}) declares `false`.
   * @default true (a store that does not say is treated as shared)
   */
  readonly shared?: boolean;
  /**
   * The tiers of a store that keeps recent entries in process in front of a shared one. A sealed
   * cache then keeps *opened* entries in `memory` (still named and bound by the keyed digest,
   * never also the sealed form) and only sealed ones in `shared`: sealing protects what other
   * processes can reach, and the process itself holds the secret.
   */
  readonly tiers?: StoreTiers;
}

/** See {@link CacheStore.tiers}. */
export interface StoreTiers {
  /** In process: synchronous reads, bounded by bytes. */
  readonly memory: MemoryTier;
  /** What other processes reach. */
  readonly shared: CacheStore;
}

/** The in-process tier of a {@link StoreTiers}. */
export interface MemoryTier {
  /** The bytes under `key` now, without a promise, or `null`. */
  getNow(key: string): Uint8Array | null;
  /**
   * Keeps `value` (its real bytes counted against the tier's bound) for `ttlMs`, indexed by
   * `tag` (see {@link CacheStore.get}) when given.
   */
  set(key: string, value: Uint8Array, ttlMs: number, tag?: string): Promise<void>;
  delete(key: string): Promise<void>;
}

/** What `invalidate` drops: a whole workspace, or one runnable's entries in it. */
export interface InvalidationScope {
  workspace: string;
  /** A runnable's path: only entries of runs of this runnable (not of runnables calling it). */
  path?: string;
}

/**
 * Explicit invalidation, offered by stores that can keep it (see `TwoTierCacheStore`). The result
 * cache puts the tag current when a run starts into its key: after `invalidate`, new runs look up
 * new keys, and whatever a run that started earlier writes is never read.
 */
export interface CacheInvalidation {
  /**
   * The epochs current for runs of `path` in `workspace`, as text. A string when known in
   * memory; otherwise a promise read from the source of truth, which rejects when that cannot
   * be reached (the run then goes uncached).
   */
  tag(workspace: string, path: string): string | Promise<string>;
  /** Bumps the scope's epoch everywhere; resolves once it is in effect in this process. */
  invalidate(scope: InvalidationScope): Promise<void>;
}

/** A store that can invalidate explicitly. */
export interface InvalidatingCacheStore extends CacheStore {
  readonly invalidation: CacheInvalidation;
}
