import { LRUCache } from 'lru-cache';
import type pg from 'pg';
import { DatabaseUnreachableError, type Logger, unreachableReason } from '../../index.js';
import { BackoffPoller } from '../process/poll_backoff.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';

export interface RevocableCacheOptions {
  /**
   * Longest a revoked credential may still be accepted by this process (ms). Lookups are cached;
   * a poll of the revocation generation clears the cache when it moves, and when no poll has
   * confirmed the generation for this long the cache is not trusted (every lookup goes to
   * Postgres, and fails closed if Postgres does not answer). @default 1000
   */
  maxStaleMs?: number;
  logger?: Logger;
  /** What is cached, for the log line when the poll fails ("tokens", "embed keys"). */
  what: string;
}

/**
 * Credential lookups (API tokens, embed keys) cached in process, cleared when the server's
 * shared revocation generation (`token_generation`, bumped by every revoke) moves. One poller
 * shape for both, so a revocation reaches every process within `maxStaleMs` for either.
 *
 * While Postgres does not answer, the poll backs off: each failure doubles the pause (from a
 * quarter of `maxStaleMs`, capped at `MAX_POLL_BACKOFF_MS`) and logs one warning saying
 * when it tries again; the first poll that answers logs one info line. Lookups meanwhile go to
 * Postgres (the cache is stale), so the backoff delays nothing but the log.
 */
export class RevocableCache<V extends object> {
  readonly #pool: pg.Pool;
  readonly #cache = new LRUCache<string, V | false>({ max: 10_000, ttl: 300_000 });
  readonly #maxStaleMs: number;
  readonly #logger: Logger | undefined;
  readonly #what: string;
  #generation: string | null = null;
  /** When the last poll that confirmed the generation was sent (performance.now()). */
  #confirmedAt = Number.NEGATIVE_INFINITY;
  /** Bumped whenever the cache is cleared: a lookup that straddles a clear does not cache. */
  #epoch = 0;
  readonly #poller: BackoffPoller;

  constructor(pool: pg.Pool, options: RevocableCacheOptions) {
    this.#pool = pool;
    this.#maxStaleMs = options.maxStaleMs ?? 1000;
    this.#logger = options.logger;
    this.#what = options.what;
    this.#poller = new BackoffPoller({
      periodMs: Math.max(50, this.#maxStaleMs / 4),
      poll: () => this.#poll(),
      answeredAgain: (failedPolls) =>
        this.#logger?.info(
          { failedPolls },
          `revocation poll answering again; ${this.#what} cached again`,
        ),
      // One line per backoff step, not per period: an outage must not flood the log.
      failed: (err, { failedPolls, retryInMs }) =>
        this.#logger?.warn(
          { err: (err as Error).message, failedPolls, retryInMs },
          `revocation poll failed; ${this.#what} are checked in Postgres until it answers`,
        ),
    });
  }

  /** Starts polling the revocation generation (a quarter of `maxStaleMs` apart). */
  start(): Promise<void> {
    return this.#poller.start();
  }

  stop(): void {
    this.#poller.stop();
  }

  /** The value cached for `key`, or what `load` finds in Postgres (cached unless a clear raced). */
  async get(key: string, load: () => Promise<V | null>): Promise<V | null> {
    if (performance.now() - this.#confirmedAt > this.#maxStaleMs) {
      // Revocations could have happened unseen: trust only Postgres until a poll confirms.
      this.#clear();
    } else {
      const cached = this.#cache.get(key);
      if (cached !== undefined) return cached === false ? null : cached;
    }
    const epoch = this.#epoch;
    let found: V | null;
    try {
      found = await load();
    } catch (err) {
      // Fail closed, and say why: the credential cannot be checked while Postgres is away.
      if (unreachableReason(err) === null) throw err;
      throw new DatabaseUnreachableError(undefined, { cause: err });
    }
    if (epoch === this.#epoch) this.#cache.set(key, found ?? false);
    return found;
  }

  #clear(): void {
    if (this.#cache.size > 0) this.#cache.clear();
    this.#epoch++;
  }

  async #poll(): Promise<void> {
    const sentAt = performance.now();
    const { rows } = await this.#pool.query<{ value: string }>(
      `select value from ${SERVER_SCHEMA}.token_generation`,
    );
    const value = rows[0]?.value ?? null;
    if (value !== this.#generation) {
      this.#generation = value;
      this.#clear();
    }
    this.#confirmedAt = sentAt;
  }
}
