/*
 * datatable/logins/ — connections holding exactly the granted roles: the leaser every access
 * kind ends in (this file); the set-login protocol that creates, takes back and retires
 * wm_set_ logins (role_set_protocol.ts); detecting and repairing a login changed behind the
 * library's back (login_repair.ts); one pool per login, under one cap (login_pools.ts); the
 * connection lent to a job (pooled_lease.ts); managed passwords (passwords.ts); which set logins
 * are wanted, for gc and for preparing ahead (login_gc.ts, set_login_warmer.ts); sql/.
 */
import type { TypedEmitter } from '../../events.js';
import { type Logger, silentLogger } from '../../logger.js';
import { CLOSE_WAIT_MS, settleWithin } from '../../util/settle_within.js';
import { SingleFlight } from '../../util/single_flight.js';
import type { CatalogRole } from '../catalog/catalog_state.js';
import { LoginAuthFailed, type LoginPools } from './login_pools.js';
import type { ExpectedLogin, LoginRepair } from './login_repair.js';
import type { PasswordDeriver } from './passwords.js';
import type { PooledLease } from './pooled_lease.js';
import { type LoginEvents, RoleSetProtocol } from './role_set_protocol.js';

export interface LoginLeaserOptions {
  pools: LoginPools;
  protocol: RoleSetProtocol;
  repair: LoginRepair;
  passwords: PasswordDeriver;
  events: TypedEmitter<LoginEvents>;
  logger?: Logger;
}

/** How to check and repair one login after its connections were used. */
interface Watched {
  readonly expected: ExpectedLogin;
  readonly database: string;
  repair(): Promise<void>;
}

/**
 * "Give me a connection holding exactly these roles on this database." Every access kind —
 * viewer, named role, default role — ends here, in {@link lease}; the flow only goes down:
 *
 * 1. one role → its own login, with the password derived from the catalog;
 *    several → their set login, with the password this process learnt from its row;
 * 2. no known password → the set-login protocol creates the login or takes it back, and its
 *    proof of authentication *is* the first connection (one handshake on first use);
 * 3. the password is refused (rotated by another process, or changed behind the library's
 *    back) → the login is re-read or taken back, and leased once more — never a third time;
 * 4. when a connection comes back, the login is checked off the request path (password,
 *    settings, attributes, memberships) and taken back if a runnable changed it.
 */
export class LoginLeaser {
  readonly #pools: LoginPools;
  readonly #protocol: RoleSetProtocol;
  readonly #repair: LoginRepair;
  readonly #passwords: PasswordDeriver;
  readonly #logger: Logger;
  readonly #events: TypedEmitter<LoginEvents>;
  /** Passwords of set-login rows this process has read or written. */
  readonly #known = new Map<string, string>();
  readonly #flights = new SingleFlight<string>();
  /**
   * What to watch of each role's own login (its derived password), by catalog role object: an
   * HMAC (≈ 2 µs here) and an entry saved on every lease. Role objects are readonly and every
   * catalog load makes new ones, so a renamed role (or a new nonce) is never served stale.
   */
  readonly #ownLogins = new WeakMap<CatalogRole, Watched>();
  /**
   * Set logins by the role list a viewer's authorization grants (the same readonly array for
   * every run it answers): their name is a sort and a SHA-256 of the ids (≈ 1 µs) otherwise
   * paid on every lease.
   */
  readonly #sets = new WeakMap<
    readonly CatalogRole[],
    { readonly login: string; readonly oids: readonly number[] }
  >();
  /** Logins lent at least once, by name: what to check when their connections come back. */
  readonly #watched = new Map<string, Watched>();
  /** Logins whose check is running, and whether another release asked for one meanwhile. */
  readonly #checking = new Map<string, { again: boolean }>();
  #closed = false;
  /** Post-release checks under way: close() waits for them before the pools end. */
  readonly #running = new Set<Promise<void>>();

  constructor(options: LoginLeaserOptions) {
    this.#pools = options.pools;
    this.#protocol = options.protocol;
    this.#repair = options.repair;
    this.#passwords = options.passwords;
    this.#logger = options.logger ?? silentLogger;
    this.#events = options.events;
  }

  /**
   * A connection as the login holding exactly `roles` (≥ 1, sorted by catalog id).
   * @throws {LoginAuthFailed} when the login still refuses after one repair.
   * @throws {RoleResolutionFailedError} when a set login cannot be prepared.
   */
  lease(roles: readonly CatalogRole[], database: string): Promise<PooledLease> {
    if (roles.length === 1) return this.#leaseOwn(roles[0]!, database);
    let set = this.#sets.get(roles);
    if (set === undefined) {
      const oids = roles.map((role) => role.oid);
      set = { oids, login: RoleSetProtocol.loginName(oids) };
      this.#sets.set(roles, set);
    }
    return this.#leaseSet(set.login, set.oids, database);
  }

  /**
   * Prepares the set login for `oids` before anyone asks for it (a membership change made a new
   * combination): created if missing, its proving connection kept warm in the pool. A login that
   * already has a row only has its password remembered (no connection opened).
   */
  async prepareAhead(oids: readonly number[], database: string): Promise<void> {
    const login = RoleSetProtocol.loginName(oids);
    if (this.#known.has(login) || this.#flights.get(login) !== undefined) return;
    let proof: PooledLease | undefined;
    let prepared = false;
    try {
      const password = await this.#flights.run(login, () =>
        this.#protocol.prepare(login, oids, database, {
          prove: async (password) => {
            proof = await this.#pools.lease(database, login, password);
          },
        }),
      );
      this.#remember(login, oids, database, password);
      prepared = true;
    } finally {
      // Kept warm only for a login that was made: one whose preparation failed after the proof
      // (a role disabled meanwhile) has no row, and its connection must not sit in a pool.
      await proof?.release(!prepared);
    }
  }

  /** Forgets a login (retired or disabled): its password and its checks. */
  forget(login: string): void {
    this.#known.delete(login);
    this.#watched.delete(login);
    this.#repair.forget(login);
  }

  /**
   * Stops scheduling checks, and resolves once those running have finished (on open pools), or
   * after {@link CLOSE_WAIT_MS} when one hangs on a dead peer.
   */
  async close(): Promise<void> {
    this.#closed = true;
    await settleWithin(this.#running, CLOSE_WAIT_MS);
  }

  /** Called by the pools when a connection of `login` is given back. */
  released(login: string): void {
    if (this.#closed) return;
    const running = this.#checking.get(login);
    if (running !== undefined) {
      running.again = true;
      return;
    }
    const watched = this.#watched.get(login);
    if (watched === undefined) return;
    const state = { again: false };
    this.#checking.set(login, state);
    const check = this.#check(login, watched, state);
    this.#running.add(check);
    void check.finally(() => this.#running.delete(check));
  }

  async #check(login: string, watched: Watched, state: { again: boolean }): Promise<void> {
    let repaired = false;
    try {
      do {
        state.again = false;
        if (!(await this.#repair.inspect(watched.expected))) {
          repaired = true;
          this.#logger.warn(
            { login },
            'a managed login was changed behind the library; taking it back',
          );
          this.#pools.evict(login);
          await watched.repair();
        }
      } while (state.again && !this.#closed);
    } catch (err) {
      // The next lease goes through the same checks (auth failure, pool open); nothing is lost.
      // After close() nobody leases again: a check cut short by the pools ending is no news.
      if (!this.#closed)
        this.#logger.warn({ login, err: (err as Error).message }, 'login check failed');
    } finally {
      this.#checking.delete(login);
      this.#events.emit('login:checked', { repaired });
    }
  }

  /**
   * A set login's password, and the check of its connections after each release: both or
   * neither. A login known without being watched (one prepared ahead, before this fix) kept
   * whatever a runnable's `ALTER ROLE current_user SET …` left on it.
   */
  #remember(login: string, oids: readonly number[], database: string, password: string): void {
    this.#known.set(login, password);
    this.#watched.set(login, {
      expected: { login, password, memberships: oids },
      database,
      repair: async () => {
        this.#known.delete(login);
        await this.#protocol.prepare(login, oids, database, {
          refused: password,
          onlyIfRecorded: true,
          prove: async (fresh) => {
            await (await this.#pools.lease(database, login, fresh)).release(false);
          },
        });
      },
    });
  }

  async #leaseOwn(role: CatalogRole, database: string): Promise<PooledLease> {
    let watched = this.#ownLogins.get(role);
    if (watched === undefined || watched.database !== database) {
      watched = {
        expected: { login: role.name, password: this.#passwords.forRole(role.oid, role.secret) },
        database,
        repair: () => this.#repair.takeBackRole(role),
      };
      this.#ownLogins.set(role, watched);
    }
    const { password } = watched.expected;
    this.#watched.set(role.name, watched);
    const fresh = !this.#pools.has(database, role.name);
    try {
      if (fresh && !(await this.#repair.inspect({ login: role.name, password }))) {
        await this.#repair.takeBackRole(role);
      }
      return await this.#pools.lease(database, role.name, password);
    } catch (err) {
      if (!(err instanceof LoginAuthFailed)) throw err;
      // Its password or attributes were changed behind our back: take it back, try once more.
      await this.#repair.takeBackRole(role);
      return this.#pools.lease(database, role.name, password);
    }
  }

  async #leaseSet(login: string, oids: readonly number[], database: string): Promise<PooledLease> {
    const known = this.#known.get(login);
    if (known === undefined) return this.#prepareAndLease(login, oids, database, undefined);
    const fresh = !this.#pools.has(database, login);
    if (fresh && !(await this.#repair.inspect({ login, password: known, memberships: oids }))) {
      this.#known.delete(login);
      return this.#prepareAndLease(login, oids, database, known);
    }
    try {
      return await this.#pools.lease(database, login, known);
    } catch (err) {
      if (!(err instanceof LoginAuthFailed)) throw err;
      this.#known.delete(login);
      return this.#prepareAndLease(login, oids, database, known);
    }
  }

  /**
   * Prepares the set login (concurrent callers in this process share one attempt) and leases a
   * connection: the leader keeps the connection that proved the login; joiners open their own.
   * `refused` is a password that just failed; after a second refusal the error propagates.
   */
  async #prepareAndLease(
    login: string,
    oids: readonly number[],
    database: string,
    refused: string | undefined,
  ): Promise<PooledLease> {
    let proof: PooledLease | undefined;
    const flight =
      this.#flights.get(login) ??
      this.#flights.run(login, () =>
        this.#protocol.prepare(login, oids, database, {
          ...(refused === undefined ? {} : { refused }),
          prove: async (password) => {
            proof = await this.#pools.lease(database, login, password);
          },
        }),
      );
    let password: string;
    try {
      password = await flight;
    } catch (err) {
      await proof?.release(true);
      throw err;
    }
    this.#remember(login, oids, database, password);
    if (proof !== undefined) return proof;
    const expected = { login, password, memberships: oids };
    if (
      refused === undefined &&
      !this.#pools.has(database, login) &&
      !(await this.#repair.inspect(expected))
    ) {
      // The row is fine but the login is not what it says (NOLOGIN, a membership revoked…).
      this.#known.delete(login);
      return this.#prepareAndLease(login, oids, database, password);
    }
    try {
      return await this.#pools.lease(database, login, password);
    } catch (err) {
      if (!(err instanceof LoginAuthFailed) || refused !== undefined) throw err;
      this.#known.delete(login);
      return this.#prepareAndLease(login, oids, database, password);
    }
  }
}
