import type { Cluster, Redis } from 'ioredis';
import { type Duration, resolveDuration } from '../duration.js';
import { claimedExpiry } from './entry_header.js';
import { RedisInvalidationBus } from './invalidation_bus.js';
import { MemoryCacheStore, type RawMemoryCacheStoreOptions } from './memory_store.js';
import { pathTag } from './path_tag.js';
import { RedisCacheStore } from './redis_store.js';
import type { InvalidatingCacheStore, StoreTiers } from './store.js';

export interface RawTwoTierCacheStoreOptions {
  /** A `redis://` URL (the store owns the connections) or an ioredis client (borrowed). */
  redis: string | Redis | Cluster;
  /** Prefix of every key in Redis (entries, epochs, the invalidation channel). @default 'vc:' */
  prefix?: string;
  /** Longest a Redis command may take; see `RedisCacheStore`. @default 200 (ms) */
  commandTimeout?: Duration;
  /** The memory tier: bounded by bytes like `MemoryCacheStore`. @default { maxBytes: '64mb' } */
  memory?: Pick<RawMemoryCacheStoreOptions, 'maxBytes' | 'maxEntryBytes' | 'now'>;
  /**
   * How often the invalidation bus's connection is pinged. A connection that stops answering
   * for this long plus `commandTimeout` is treated as lost: lookups read epochs from Redis
   * until it is back. @default 1000 (ms)
   */
  heartbeat?: Duration;
}

export interface OpenTwoTierStoreOptions extends RawTwoTierCacheStoreOptions {
  /**
   * Longest `openTwoTierStore` waits for the invalidation bus to be confirmed (Redis reached,
   * subscribed, epochs loaded) before it closes the store and rejects with `E_STORE_NOT_READY`.
   * @default 5000 (ms)
   */
  openTimeout?: Duration;
}

/**
 * Recent entries in process (an LRU bounded by bytes) in front of Redis, plus invalidation shared
 * by every process on the Redis ({@link RedisInvalidationBus}).
 *
 * - A memory hit costs no round trip. A memory miss reads Redis and keeps what it found in
 *   memory, never past the expiry the entry itself carries (nor past the TTL it was set with).
 * - Writes go to both tiers. An entry the memory tier refuses (too large) is still in Redis.
 * - An invalidation drops what it invalidates from memory in every process (correctness does not
 *   depend on that: new runs use new keys; it frees the memory at once). A workspace's drops all
 *   its entries; a path's only the entries tagged with that runnable's {@link pathTag} (the
 *   result cache tags what it writes and reads), plus the workspace's untagged entries, whose
 *   runnable the store cannot know. The tag is computed in each process from the workspace and
 *   path the bus message already carries: nothing more about the path goes to Redis.
 * - Until its bus is confirmed for the first time (Redis reached, subscribed, epochs loaded),
 *   the store is *opening*: a lookup or `invalidate` waits for that (within `commandTimeout`),
 *   then refuses with `E_STORE_NOT_READY` (a lookup so refused runs uncached, counted as the
 *   bypass `store-not-ready`). {@link openTwoTierStore} resolves only once it is confirmed.
 */
export class TwoTierCacheStore implements InvalidatingCacheStore {
  readonly memory: MemoryCacheStore;
  readonly redis: RedisCacheStore;
  readonly invalidation: RedisInvalidationBus;
  /** Redis is reachable by other processes: used sealed by default. */
  readonly shared = true;
  /** A sealed cache keeps opened entries in `memory` and sealed ones in Redis (see `tiers`). */
  readonly tiers: StoreTiers;
  readonly #now: () => number;

  constructor(options: RawTwoTierCacheStoreOptions) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('TwoTierCacheStore needs options with a `redis` URL or client');
    }
    const memory = options.memory ?? {};
    this.memory = new MemoryCacheStore(memory);
    this.#now = memory.now ?? Date.now;
    const prefix = options.prefix ?? 'vc:';
    const commandTimeout = options.commandTimeout ?? 200;
    this.redis = new RedisCacheStore({ redis: options.redis, prefix, commandTimeout });
    this.invalidation = new RedisInvalidationBus({
      client: this.redis.client,
      prefix,
      timeoutMs: resolveDuration(commandTimeout, 'commandTimeout'),
      heartbeatMs: resolveDuration(options.heartbeat ?? 1000, 'heartbeat'),
      dropped: (workspace, path) => {
        if (path === undefined) this.memory.deletePrefix(`${workspace}/`);
        else this.memory.deleteTag(pathTag(workspace, path), `${workspace}/`);
      },
    });
    this.tiers = Object.freeze({ memory: this.memory, shared: this.redis });
  }

  /**
   * Resolves to this store once its invalidation bus is confirmed (at once, if it is); rejects
   * with `E_STORE_NOT_READY` after `timeout` (the store stays open and keeps trying).
   */
  async ready(options: { timeout?: Duration } = {}): Promise<this> {
    await this.invalidation.ready(resolveDuration(options.timeout ?? 5000, 'timeout'));
    return this;
  }

  /** The memory tier's entry under `key`, or `null` (see `CacheStore.getNow`). */
  getNow(key: string): Uint8Array | null {
    return this.memory.getNow(key);
  }

  /** `tag` (see `CacheStore.get`) indexes what a memory miss keeps from Redis. */
  get(key: string, tag?: string): Promise<Uint8Array | null> {
    const local = this.memory.getNow(key);
    if (local !== null) return Promise.resolve(local);
    return this.redis.get(key).then((value) => {
      if (value !== null) this.#keep(key, value, Number.POSITIVE_INFINITY, tag);
      return value;
    });
  }

  async set(key: string, value: Uint8Array, ttlMs: number, tag?: string): Promise<void> {
    this.#keep(key, value, ttlMs, tag);
    try {
      await this.redis.set(key, value, ttlMs);
    } catch (err) {
      // Neither tier keeps what the shared one refused: processes must not disagree for a TTL.
      this.memory.delete(key);
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    await this.memory.delete(key);
    await this.redis.delete(key);
  }

  async close(): Promise<void> {
    await this.invalidation.close();
    await this.redis.close();
    await this.memory.close();
  }

  /** Keeps `value` in memory until the earlier of `ttlMs` from now and its own claimed expiry. */
  #keep(key: string, value: Uint8Array, ttlMs: number, tag: string | undefined): void {
    const expiresAt = claimedExpiry(value);
    // The memory tier drops an entry once *more* than its TTL has passed; the entry itself is
    // expired from `expiresAt` on. One millisecond less keeps the two in step.
    const ttl = Math.floor(Math.min(ttlMs, expiresAt === null ? 0 : expiresAt - this.#now())) - 1;
    // Not an envelope, or already expired: not kept (an older copy must not outlive it either).
    if (!(ttl >= 1)) {
      void this.memory.delete(key);
      return;
    }
    // A reply from Redis may be a view into a larger socket buffer: the memory store keeps a
    // copy of exactly its bytes (`ownBytes`), never the view.
    void this.memory.set(key, value, ttl, tag);
  }
}

/**
 * `new TwoTierCacheStore(options)`, returned at once: the store is opening until its bus is
 * confirmed (see {@link TwoTierCacheStore}); prefer {@link openTwoTierStore}.
 */
export function createTwoTierStore(options: RawTwoTierCacheStoreOptions): TwoTierCacheStore {
  return new TwoTierCacheStore(options);
}

/**
 * A two-tier store, resolved once it is usable: Redis reached, the invalidation bus subscribed
 * and the epochs loaded, so the first run after it resolves is cached and `invalidate` works.
 * Not confirmed within `openTimeout` (Redis unreachable, wrong URL): the store is closed and the
 * promise rejects with `E_STORE_NOT_READY`, the last connection failure as its `cause`.
 */
export async function openTwoTierStore(
  options: OpenTwoTierStoreOptions,
): Promise<TwoTierCacheStore> {
  if (options === null || typeof options !== 'object') {
    throw new TypeError('openTwoTierStore needs options with a `redis` URL or client');
  }
  const timeout = resolveDuration(options.openTimeout ?? 5000, 'openTimeout');
  if (!(timeout > 0)) throw new TypeError('openTimeout must be greater than 0');
  const store = new TwoTierCacheStore(options);
  try {
    return await store.ready({ timeout });
  } catch (err) {
    await store.close();
    throw err;
  }
}
