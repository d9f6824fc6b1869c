import type { FingerprintFn } from '../connector/fingerprint.js';
import { type ByteSize, type Duration, resolveByteSize, resolveDuration } from '../duration.js';
import { SealRequiredError } from '../errors.js';
import { type Logger, silentLogger } from '../logger.js';
import type { CacheStore } from '../stores/store.js';

/** Sealing of entries; see {@link RawResultCacheOptions.seal}. */
export interface RawSealOptions {
  /**
   * The deployment's secret, at least 32 bytes (a string counts its UTF-8 bytes): e.g. 64 hex
   * characters from a secret store. Entry and key-name keys are derived from it (HKDF), so the
   * same secret may also serve `createDatatables({ secretKey })`. Changing it turns every entry
   * into a miss.
   */
  secretKey: string | Uint8Array;
}

export interface RawResultCacheOptions {
  /** Where results are kept: {@link MemoryCacheStore} or {@link RedisCacheStore}. */
  store: CacheStore;
  /**
   * The job's authorization fingerprint, hashed into the key beside the viewer — for data
   * tables, the viewer's resolved role set and the catalog generation. Called before every
   * lookup, and again before storing: a result is not stored if the fingerprint moved while it
   * was computed. When it throws, the run goes on uncached (never served from the cache).
   * @default no fingerprint (`null`)
   */
  fingerprint?: FingerprintFn;
  /**
   * Seal every entry (AES-256-GCM, its key as associated data) and name keys with a keyed hash.
   * Whoever can write to the store can then no longer make a viewer receive forged or moved
   * rows, nor read rows or confirm a guess of (viewer, runnable, args) from key names; an entry
   * that does not open is a miss, counted as `rejected`. `false` stores entries in clear under
   * `cachedResultPath` names. See docs/security-model.md.
   *
   * Required over a shared store (one that does not declare `shared: false`: Redis, two tiers):
   * without it, construction throws `E_SEAL_REQUIRED`. With two tiers, the memory tier keeps
   * opened entries and Redis sealed ones.
   * @default unsealed for the in-process store; none for a shared store
   */
  seal?: RawSealOptions | false;
  /** Longest TTL honoured; longer `cacheTtlS` values are capped. @default '1d' */
  maxTtl?: Duration;
  /** Results whose JSON is larger are returned but not stored. @default '8mb' */
  maxEntryBytes?: ByteSize;
  /**
   * After a store failure, skip the store for this long (runs go uncached) instead of paying a
   * timeout on every call. `0` retries the store on every call.
   * @default '1s'
   */
  storeRestAfterFailure?: Duration;
  /** pino logger; store trouble is logged once per burst. @default silent */
  logger?: Logger;
  /** Milliseconds clock, for expiry and resting. @default Date.now */
  now?: () => number;
  /**
   * What `result.value` is on a hit served from process memory (the in-process store, or the
   * memory tier of two tiers):
   *
   * - `'fresh'`: parsed from the stored JSON on every hit: each caller gets a value of its own,
   *   and may change it.
   * - `'shared'`: parsed once per entry and deep-frozen; every hit *of that same entry* (same
   *   workspace, runnable, args, viewer and fingerprint) gets the same frozen object, never a
   *   hit of another key. A hit then costs no parse (1 KiB: ≈ 3 µs less per hit), but a caller
   *   cannot change what it got (a write throws in strict code), and each entry read keeps its
   *   parsed value alive beside its bytes, outside `maxBytes` (docs/memory-store.md).
   * - `'cloned'`: parsed once per entry and kept as with `'shared'`; every hit gets a deep copy
   *   of it: a value of its own, which the caller may change, for a copy instead of a parse
   *   (1 KiB: ≈ 1.5 µs against ≈ 4 µs). Memory as with `'shared'`.
   *
   * Hits read from Redis are parsed per hit in every mode. `result.json()` is the stored bytes
   * in every mode.
   * @default 'fresh'
   */
  values?: 'fresh' | 'shared' | 'cloned';
}

/** The options after validation and defaults; the hot path reads only these. */
export interface ResolvedResultCacheOptions {
  readonly store: CacheStore;
  readonly fingerprint: FingerprintFn | null;
  /** The secret's bytes, or `null` when entries are not sealed. */
  readonly sealSecret: Buffer | null;
  readonly maxTtlMs: number;
  readonly maxEntryBytes: number;
  readonly storeRestMs: number;
  readonly logger: Logger;
  readonly now: () => number;
  readonly values: 'fresh' | 'shared' | 'cloned';
}

const MIN_SECRET_BYTES = 32;

/** Validates `options` (a `TypeError` naming the option otherwise) and applies defaults. */
export function resolveResultCacheOptions(
  options: RawResultCacheOptions,
): ResolvedResultCacheOptions {
  if (options === null || typeof options !== 'object') throw new TypeError('options are required');
  const { store } = options;
  if (typeof store?.get !== 'function' || typeof store.set !== 'function') {
    throw new TypeError('store must be a CacheStore (MemoryCacheStore, RedisCacheStore, …)');
  }
  if (options.fingerprint !== undefined && typeof options.fingerprint !== 'function') {
    throw new TypeError('fingerprint must be a function (job) => string | null');
  }
  if (options.now !== undefined && typeof options.now !== 'function') {
    throw new TypeError('now must be a function returning milliseconds');
  }
  return Object.freeze({
    store,
    fingerprint: options.fingerprint ?? null,
    sealSecret: resolveSealSecret(options.seal, store),
    maxTtlMs: resolveDuration(options.maxTtl ?? '1d', 'maxTtl'),
    maxEntryBytes: resolveByteSize(options.maxEntryBytes ?? '8mb', 'maxEntryBytes'),
    storeRestMs: resolveDuration(options.storeRestAfterFailure ?? '1s', 'storeRestAfterFailure'),
    logger: options.logger ?? silentLogger,
    now: options.now ?? Date.now,
    values: resolveValues(options.values),
  });
}

function resolveValues(values: unknown): 'fresh' | 'shared' | 'cloned' {
  if (values === undefined) return 'fresh';
  if (values === 'fresh' || values === 'shared' || values === 'cloned') return values;
  throw new TypeError("values must be 'fresh', 'shared' or 'cloned'");
}

function resolveSealSecret(
  seal: RawSealOptions | false | undefined,
  store: CacheStore,
): Buffer | null {
  // Invariant 21: what other processes can reach is sealed unless the caller said otherwise.
  if (seal === undefined) {
    if (store.shared === false) return null;
    throw new SealRequiredError();
  }
  if (seal === false) return null;
  if (seal === null || typeof seal !== 'object') {
    throw new TypeError('seal must be an object { secretKey }');
  }
  const { secretKey } = seal;
  let bytes: Buffer;
  if (typeof secretKey === 'string') bytes = Buffer.from(secretKey, 'utf8');
  else if (secretKey instanceof Uint8Array) bytes = Buffer.from(secretKey);
  else throw new TypeError('seal.secretKey must be a string or a Uint8Array');
  if (bytes.byteLength < MIN_SECRET_BYTES) {
    // Never the value itself: it is a secret, even when it is too short to be a good one.
    throw new TypeError(
      `seal.secretKey must be at least ${MIN_SECRET_BYTES} bytes (e.g. 64 hex characters from a secret store)`,
    );
  }
  return bytes;
}
