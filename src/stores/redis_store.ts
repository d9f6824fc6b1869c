import { Cluster, Redis } from 'ioredis';
import { type Duration, resolveDuration } from '../duration.js';
import { StoreUnavailableError } from '../errors.js';
import type { CacheStore } from './store.js';

export interface RawRedisCacheStoreOptions {
  /**
   * A `redis://` URL (the store opens and owns the connection), or an existing ioredis `Redis`
   * or `Cluster` client (the store only borrows it, and never closes it).
   */
  redis: string | Redis | Cluster;
  /**
   * Prefix of every key this store writes, so several caches can share a Redis.
   * @default 'vc:'
   */
  prefix?: string;
  /**
   * Longest a command may take before the store gives up on it; the middleware then runs the
   * job uncached. Bounded so that a slow Redis cannot make cached runs slower than uncached ones.
   * @default 200 (ms)
   */
  commandTimeout?: Duration;
}

/**
 * A store on Redis (single node or Cluster) through ioredis. Values are raw bytes (`GET` returns
 * a Buffer, never a decoded string), expiry is Redis's own `PX`.
 *
 * Failure policy: every command either settles within `commandTimeout` or rejects with
 * {@link StoreUnavailableError}; nothing is queued while Redis is unreachable (for clients this
 * store opens, the offline queue is off and retries per request are zero).
 */
export class RedisCacheStore implements CacheStore {
  readonly #client: Redis | Cluster;
  readonly #owned: boolean;
  readonly #prefix: string;
  readonly #timeoutMs: number;

  constructor(options: RawRedisCacheStoreOptions) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('RedisCacheStore needs options with a `redis` URL or client');
    }
    this.#prefix = options.prefix ?? 'vc:';
    if (typeof this.#prefix !== 'string') throw new TypeError('prefix must be a string');
    this.#timeoutMs = resolveDuration(options.commandTimeout ?? 200, 'commandTimeout');
    if (this.#timeoutMs <= 0) throw new TypeError('commandTimeout must be greater than 0');
    const { redis } = options;
    if (typeof redis === 'string') {
      this.#client = new Redis(redis, {
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        commandTimeout: this.#timeoutMs,
        // Reconnect forever with a capped backoff: the cache comes back on its own.
        retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 2000),
      });
      // Connection errors surface as rejected commands; without a listener ioredis would print
      // every reconnect attempt to stderr.
      this.#client.on('error', () => {});
      this.#owned = true;
    } else if (redis instanceof Redis || redis instanceof Cluster) {
      this.#client = redis;
      this.#owned = false;
    } else {
      throw new TypeError('redis must be a redis:// URL, an ioredis Redis or an ioredis Cluster');
    }
  }

  get(key: string): Promise<Uint8Array | null> {
    return this.#bounded(this.#client.getBuffer(this.#prefix + key), 'get');
  }

  async set(key: string, value: Uint8Array, ttlMs: number): Promise<void> {
    const px = Math.max(1, Math.ceil(ttlMs));
    const buffer = Buffer.isBuffer(value)
      ? value
      : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
    await this.#bounded(this.#client.set(this.#prefix + key, buffer, 'PX', px), 'set');
  }

  async delete(key: string): Promise<void> {
    await this.#bounded(this.#client.del(this.#prefix + key), 'delete');
  }

  /** Closes the connection if this store opened it; a borrowed client is left to its owner. */
  async close(): Promise<void> {
    if (this.#owned) await this.#client.quit().catch(() => this.#client.disconnect());
  }

  /**
   * Settles `command` within the timeout, mapping every failure to StoreUnavailableError. The
   * timer matters for borrowed clients, whose own settings may queue commands while offline.
   */
  #bounded<T>(command: Promise<T>, op: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new StoreUnavailableError(`redis ${op} timed out after ${this.#timeoutMs} ms`));
      }, this.#timeoutMs);
      command.then(
        (value) => {
          clearTimeout(timer);
          resolve(value);
        },
        (cause: unknown) => {
          clearTimeout(timer);
          reject(new StoreUnavailableError(`redis ${op} failed`, { cause }));
        },
      );
    });
  }
}
