// Just over ~300 lines: the pools, the connection cap and the lease queue share one map of
// pools and its bookkeeping; the lent connection itself lives in pooled_lease.ts.
import pg from 'pg';
import { ConnectionLostError } from '../../errors.js';
import { type Logger, silentLogger } from '../../logger.js';
import { GuardedClient } from '../../pg/pg_clients.js';
import { isAuthFailure } from '../../pg/sqlstate.js';
import { PooledLease, type StaleSessions } from './pooled_lease.js';

export interface LoginPoolsOptions {
  /** Host, port, TLS… of the data-table cluster; user, password and database are filled in. */
  base: pg.ClientConfig;
  /** Pools kept open at most; the least recently used idle pool is closed beyond it. */
  maxPools: number;
  /** Connections per login pool. */
  poolSize: number;
  /**
   * Connections open at most across every login pool of the process. A lease that would open
   * one more first closes the least recently used pool with nothing lent, then waits for a
   * connection to come back (which is then closed rather than kept idle).
   */
  maxConnections: number;
  /** Longest a lease waits for room under `maxConnections`. */
  acquireTimeoutMs: number;
  /** An idle connection is closed after this long. */
  idleTimeoutMs: number;
  /** `statement_timeout` of every login connection; 0 = none. */
  statementTimeoutMs: number;
  /** Called when a connection of `login` has been given back (for the login checks). */
  onRelease?: (login: string) => void;
  /**
   * Whether a backend's login no longer exists (asked on the admin side when a statement is
   * refused a privilege). A lease that finds its session so orphaned fails with
   * E_CONNECTION_LOST, the login's pools are closed and `onLoginGone` is told.
   */
  sessionLoginGone?: (pid: number) => Promise<boolean>;
  onLoginGone?: (login: string) => void;
  logger?: Logger;
}

/** No room under `pools.maxConnections` within `pools.acquireTimeout`. */
export class PoolsExhausted extends Error {
  constructor(max: number) {
    super(`all ${max} data-table connections of this process are in use (pools.maxConnections)`);
  }
}

/** The login's password was refused (rotated or retired elsewhere); the caller re-resolves. */
export class LoginAuthFailed extends Error {
  constructor(cause: unknown) {
    super('login authentication failed', { cause });
  }
}

interface Entry {
  readonly pool: pg.Pool;
  readonly password: string;
  /** Resolves once the pool has ended after {@link end}: nothing it has not answered will be. */
  readonly ended: Promise<void>;
  /** Ends the pool (once); leases waiting in its queue give up (see {@link checkout}). */
  end(): Promise<void>;
}

function newEntry(pool: pg.Pool, password: string): Entry {
  let signal!: () => void;
  const ended = new Promise<void>((resolve) => {
    signal = resolve;
  });
  let ending: Promise<void> | undefined;
  return {
    pool,
    password,
    ended,
    end() {
      // Signalled once the pool has really ended (every client gone): until then a caller whose
      // connection is being opened, or who waits for a lent one, may still be answered.
      ending ??= pool
        .end()
        .catch(() => {})
        .then(signal);
      return ending;
    },
  };
}

/**
 * A client of the entry's pool, or null when the pool has ended first: pg-pool never answers a
 * `connect()` still queued (pool full) when `end()` is called, so without this a run waiting
 * for a connection of a login whose pool was rotated or evicted would hang until its timeout.
 * The pool ends when its last lent client comes back, so such a run waits no longer than that.
 * A client that arrives after all is destroyed.
 */
function checkout(entry: Entry): Promise<pg.PoolClient | null> {
  // Ended while the lease waited for room: pg-pool would throw "Cannot use a pool after calling
  // end"; answer as for a queued lease (the caller retries once on a fresh pool).
  if ((entry.pool as unknown as { ending?: boolean }).ending === true) return Promise.resolve(null);
  const connecting = entry.pool.connect();
  return Promise.race([connecting, entry.ended.then(() => null)]).then((client) => {
    if (client === null)
      connecting.then(
        (late) => late.release(true),
        () => {},
      );
    return client;
  });
}

/**
 * One `pg.Pool` per (database, login) — never shared between logins (SPEC invariant 12). A
 * connection goes back to its pool only after the session reset (DISCARD ALL's statements, see
 * RESET_SESSION) succeeded, so a runnable's `SET ROLE`, settings, temp tables, prepared
 * statements or advisory locks never reach the next job; if a transaction was left open or the
 * reset fails, the connection is closed instead.
 */
export class LoginPools {
  readonly #options: LoginPoolsOptions;
  readonly #logger: Logger;
  /** Insertion order is recency: used entries are moved to the end. */
  readonly #pools = new Map<string, Entry>();
  /** Leases not yet given back, so close() can end them instead of waiting forever. */
  readonly #lent = new Set<PooledLease>();
  readonly #onReleased = (lease: PooledLease, login: string) => {
    this.#lent.delete(lease);
    this.#wake();
    this.#options.onRelease?.(login);
  };
  /** Orphaned sessions (their login dropped under them): see `sessionLoginGone`. */
  readonly #stale: StaleSessions | null;
  /** Whether a connection coming back should be closed: someone is waiting for room. */
  readonly #shed = () => this.#waiters.size > 0 && this.#open() >= this.#options.maxConnections;
  /** Leases waiting for room under maxConnections. */
  readonly #waiters = new Set<() => void>();
  /** Connections being opened (counted before they show in a pool's totalCount). */
  #opening = 0;
  #closed = false;

  constructor(options: LoginPoolsOptions) {
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
    const { sessionLoginGone, onLoginGone } = options;
    this.#stale =
      sessionLoginGone === undefined
        ? null
        : {
            gone: sessionLoginGone,
            onGone: (login) => {
              this.#logger.warn({ login }, 'a session outlived its login; its pools are closed');
              this.evict(login);
              onLoginGone?.(login);
            },
          };
  }

  get size(): number {
    return this.#pools.size;
  }

  /**
   * A connection as `login` on `database`.
   * @throws {LoginAuthFailed} when the password is refused (the pool is dropped).
   */
  lease(database: string, login: string, password: string): Promise<PooledLease> {
    return this.#lease(database, login, password, false);
  }

  async #lease(
    database: string,
    login: string,
    password: string,
    retried: boolean,
  ): Promise<PooledLease> {
    if (this.#closed) throw new Error('login pools are closed');
    const key = `${database}\0${login}`;
    let entry = this.#pools.get(key);
    if (entry !== undefined && entry.password !== password) {
      // Rotated (taken back with a new password): the old pool can only fail.
      this.#drop(key, entry);
      entry = undefined;
    }
    if (entry === undefined) {
      entry = newEntry(this.#newPool(database, login, password), password);
      this.#pools.set(key, entry);
      this.#evictIdle(key);
    } else {
      this.#pools.delete(key);
      this.#pools.set(key, entry);
    }
    const opens = await this.#roomFor(key, entry.pool);
    let client: pg.PoolClient | null;
    try {
      client = await checkout(entry);
    } catch (err) {
      if (isAuthFailure(err)) {
        this.#drop(key, entry);
        throw new LoginAuthFailed(err);
      }
      throw err;
    } finally {
      if (opens) this.#opening--;
    }
    if (client === null) {
      // The pool was ended (rotated, evicted, closing) while this lease waited in its queue.
      if (retried || this.#closed) {
        throw new ConnectionLostError(
          'the login’s connections were closed while this run waited for one; retry',
        );
      }
      return this.#lease(database, login, password, true);
    }
    if (this.#closed) {
      client.release(true);
      throw new Error('login pools are closed');
    }
    const lease = new PooledLease(
      client,
      login,
      this.#logger,
      this.#onReleased,
      this.#shed,
      this.#stale,
    );
    this.#lent.add(lease);
    return lease;
  }

  /** Connections open across every pool (and being opened), lent, and leases waiting for room. */
  get usage(): { open: number; lent: number; waiting: number } {
    return { open: this.#open(), lent: this.#lent.size, waiting: this.#waiters.size };
  }

  #open(): number {
    let open = this.#opening;
    for (const { pool } of this.#pools.values()) open += pool.totalCount;
    return open;
  }

  /**
   * Makes room under maxConnections for a lease of `pool` that would open a connection.
   * Returns whether this lease counts as opening one (the caller decrements when done).
   * @throws {PoolsExhausted} after acquireTimeout.
   */
  async #roomFor(key: string, pool: pg.Pool): Promise<boolean> {
    const { maxConnections, poolSize, acquireTimeoutMs } = this.#options;
    const deadline = performance.now() + acquireTimeoutMs;
    for (;;) {
      // An idle connection of its own, or a full pool (it waits on its own connections).
      if (pool.idleCount > 0 || pool.totalCount >= poolSize) return false;
      if (this.#open() < maxConnections) {
        this.#opening++; // synchronously after the check: concurrent leases cannot overshoot
        return true;
      }
      if (this.#closeIdlePool(key)) continue;
      const left = deadline - performance.now();
      if (left <= 0 || this.#closed) throw new PoolsExhausted(maxConnections);
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.#waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, left);
        this.#waiters.add(wake);
      });
    }
  }

  /** Closes the least recently used pool other than `keep` whose connections are all idle. */
  #closeIdlePool(keep: string): boolean {
    for (const [key, entry] of this.#pools) {
      if (key === keep) continue;
      const { pool } = entry;
      if (pool.totalCount > 0 && pool.totalCount === pool.idleCount) {
        this.#drop(key, entry);
        return true;
      }
    }
    return false;
  }

  #wake(): void {
    for (const wake of [...this.#waiters]) wake();
  }

  /** Closes every pool of `login` (after it was retired or disabled). */
  evict(login: string): void {
    for (const [key, entry] of this.#pools) {
      if (key.endsWith(`\0${login}`)) this.#drop(key, entry);
    }
  }

  /** Whether any pool of `login` is open in this process. */
  has(database: string, login: string): boolean {
    return this.#pools.has(`${database}\0${login}`);
  }

  /** Connections lent and not yet released (for leak checks and close). */
  get lent(): number {
    return this.#lent.size;
  }

  /** Ends every pool; connections still lent are destroyed (their jobs fail), so this resolves. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#wake();
    for (const lease of [...this.#lent]) lease.abandon();
    const entries = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.allSettled(entries.map((entry) => entry.end()));
  }

  #newPool(database: string, login: string, password: string): pg.Pool {
    const { base, poolSize, idleTimeoutMs, statementTimeoutMs } = this.#options;
    const pool = new pg.Pool({
      Client: GuardedClient,
      ...base,
      database,
      user: login,
      password,
      max: poolSize,
      idleTimeoutMillis: idleTimeoutMs,
      allowExitOnIdle: true,
      application_name: 'viewer-cache',
      ...(statementTimeoutMs > 0 ? { statement_timeout: statementTimeoutMs } : {}),
    });
    // An idle connection can be terminated under us (login retired): the pool drops it.
    pool.on('error', (err) => {
      this.#logger.debug({ login, err: err.message }, 'idle data-table connection closed');
    });
    return pool;
  }

  #drop(key: string, entry: Entry): void {
    if (this.#pools.get(key) === entry) this.#pools.delete(key);
    entry.end();
  }

  /**
   * Closes least recently used pools with nothing checked out while over `maxPools`. Never
   * `keep`, the pool just created for this lease: it has no connection yet, so it looks idle.
   */
  #evictIdle(keep: string): void {
    for (const [key, entry] of this.#pools) {
      if (this.#pools.size <= this.#options.maxPools) return;
      if (key === keep) continue;
      const { pool } = entry;
      if (pool.totalCount === pool.idleCount) this.#drop(key, entry);
    }
  }
}
