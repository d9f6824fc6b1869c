import { hash } from 'node:crypto';
import pg from 'pg';
import { SingleFlight } from '../cache/single_flight.js';
import { RoleResolutionFailedError } from '../errors.js';
import type { TypedEmitter } from '../events.js';
import type { DatatableLease } from '../executor/datatable_connector.js';
import { type Logger, silentLogger } from '../logger.js';
import { ROLE_SET_LOGIN_PREFIX } from './datatable_ref.js';
import type { DatatablesEvents } from './datatables_events.js';
import { PasswordDeriver, scramVerifier } from './passwords.js';
import * as sql from './sql/role_set.js';

/** Where a set login is in its protocol; a test hook can fail at any of them. */
export type RoleSetStep =
  | 'lock'
  | 'read-row'
  | 'read-login'
  | 'create-login'
  | 'alter-login'
  | 'terminate-backends'
  | 'sync-memberships'
  | 'drop-owned'
  | 'verify-login'
  | 'insert-row'
  | 'delete-row'
  | 'nologin'
  | 'drop-login';

export interface LoginCredentials {
  readonly login: string;
  readonly password: string;
}

export interface RoleSetLoginsOptions {
  /** Privileged pool on the catalog database (CREATEROLE, admin of the data-table roles). */
  admin: pg.Pool;
  /** The same privileged connection, for statements that must run in a data-table database. */
  adminConfig: pg.ClientConfig;
  /** Host, port and TLS for connecting as logins (user and password are filled in). */
  loginConfig: pg.ClientConfig;
  passwords: PasswordDeriver;
  events: TypedEmitter<DatatablesEvents>;
  logger?: Logger;
  /** Called before each protocol step; throwing simulates a crash there (tests). */
  beforeStep?: (step: RoleSetStep, login: string) => void | Promise<void>;
}

/**
 * `wm_set_<hash>`: one login per distinct *set* of roles (SPEC invariants 6–8). The hash is over
 * the sorted catalog ids, so a rename moves nothing and a change in someone's groups resolves
 * them to another login rather than editing one. The login is `INHERIT` and a member of exactly
 * those roles; it has no privileges of its own, so `SET ROLE` can only narrow.
 *
 * Protocol, each step its own statement and commit, under a per-login advisory lock:
 * - create: the login is created (or, found without a row, taken back: attributes reset, a fresh
 *   password, other sessions terminated), memberships are made exact, the login is proven to
 *   authenticate, and only then is the `role_set` row written;
 * - retire: the row is deleted first, then the login is made NOLOGIN, its sessions ended, and it
 *   is dropped.
 * So a row always names a login that can authenticate with the password derived from the row.
 */
export class RoleSetLogins {
  readonly #options: RoleSetLoginsOptions;
  readonly #logger: Logger;
  /** Passwords of rows this process has seen; dropped on auth failure or retirement. */
  readonly #known = new Map<string, string>();
  readonly #flights = new SingleFlight<LoginCredentials>();

  constructor(options: RoleSetLoginsOptions) {
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
  }

  /** The set login's name for these catalog ids (order does not matter). */
  static loginName(oids: readonly number[]): string {
    const sorted = [...new Set(oids)].sort((a, b) => a - b);
    return ROLE_SET_LOGIN_PREFIX + hash('sha256', sorted.join(','), 'hex').slice(0, 32);
  }

  /**
   * Credentials of the set login for `oids` (≥ 2 roles), creating or taking it back if needed.
   * Concurrent callers in this process share one attempt; other processes wait on the lock.
   * @param database the data-table database the login is proven against.
   */
  ensure(
    oids: readonly number[],
    database: string,
    open?: (credentials: LoginCredentials) => Promise<DatatableLease>,
  ): Promise<LoginCredentials & { lease?: DatatableLease }> {
    const sorted = [...new Set(oids)].sort((a, b) => a - b);
    if (sorted.length < 2) throw new RangeError('a set login holds at least two roles');
    const login = RoleSetLogins.loginName(sorted);
    const password = this.#known.get(login);
    if (password !== undefined) return Promise.resolve({ login, password });
    const running = this.#flights.get(login);
    // Joiners get the credentials; the connection that proved the login is the leader's alone.
    if (running !== undefined)
      return running.then((c) => ({ login: c.login, password: c.password }));
    return this.#flights.run(login, () => this.#ensure(login, sorted, database, open));
  }

  /** Forgets a login's cached password (after an authentication failure). */
  forget(login: string): void {
    this.#known.delete(login);
  }

  async #ensure(
    login: string,
    oids: number[],
    database: string,
    open: ((credentials: LoginCredentials) => Promise<DatatableLease>) | undefined,
  ): Promise<LoginCredentials & { lease?: DatatableLease }> {
    const started = performance.now();
    try {
      return await this.#underLock(login, (client) =>
        this.#create(client, login, oids, database, open, started),
      );
    } catch (err) {
      if (err instanceof RoleResolutionFailedError) throw err;
      throw new RoleResolutionFailedError('could not prepare the login for this role set', {
        cause: err,
      });
    }
  }

  /** The create / take-back protocol, under the login's lock. */
  async #create(
    client: pg.PoolClient,
    login: string,
    oids: number[],
    database: string,
    open: ((credentials: LoginCredentials) => Promise<DatatableLease>) | undefined,
    started: number,
  ): Promise<LoginCredentials & { lease?: DatatableLease }> {
    await this.#step('read-row', login);
    const { rows } = await client.query<{ role_oids: number[]; secret: Buffer }>(sql.READ_ROW, [
      login,
    ]);
    const row = rows[0];
    if (row !== undefined) {
      const stored = row.role_oids.map(Number).sort((a, b) => a - b);
      if (stored.join(',') !== oids.join(',')) {
        // A hash collision or a hand-edited row: refuse rather than hand out other roles.
        throw new RoleResolutionFailedError(`set login ${login} is recorded for another role set`);
      }
      return this.#remember(login, row.secret);
    }

    await this.#step('read-login', login);
    const existing = await client.query<{ oid: number }>(sql.READ_LOGIN, [login]);
    const takeBack = existing.rows.length > 0;
    const secret = PasswordDeriver.newNonce();
    const password = this.#options.passwords.password(`set:${login}`, secret);
    const verifier = await scramVerifier(password);
    const ident = pg.escapeIdentifier(login);
    if (takeBack) {
      await this.#step('alter-login', login);
      await client.query(
        `alter role ${ident} with ${sql.LOGIN_ATTRIBUTES} password ${pg.escapeLiteral(verifier)}`,
      );
      await this.#step('terminate-backends', login);
      await client.query(sql.TERMINATE_BACKENDS, [login]);
    } else {
      await this.#step('create-login', login);
      await client.query(
        `create role ${ident} with ${sql.LOGIN_ATTRIBUTES} password ${pg.escapeLiteral(verifier)}`,
      );
    }

    await this.#step('sync-memberships', login);
    await this.#syncMemberships(client, login, oids);

    if (takeBack) {
      // Anything granted to the orphan directly is revoked: its privileges are its memberships.
      await this.#step('drop-owned', login);
      await this.#inDatabase(database, `drop owned by ${ident}`);
    }

    await this.#step('verify-login', login);
    // The proof that the login can authenticate is a real connection: given `open`, it is the
    // caller's first pooled connection (one scram handshake instead of two on first use).
    let lease: DatatableLease | undefined;
    if (open === undefined) await this.#verifyLogin(database, login, password);
    else lease = await open({ login, password });

    try {
      await this.#step('insert-row', login);
      await client.query(sql.INSERT_ROW, [login, oids, secret]);
    } catch (err) {
      await lease?.release(true);
      throw err;
    }

    const ms = performance.now() - started;
    this.#options.events.emit(takeBack ? 'login:taken-back' : 'login:created', { ms });
    this.#logger.info(
      { login, roles: oids.length, ms, takeBack },
      takeBack ? 'set login taken back' : 'set login created',
    );
    return { ...this.#remember(login, secret), ...(lease === undefined ? {} : { lease }) };
  }

  /**
   * Runs `fn` holding the login's session advisory lock on a privileged connection. The lock
   * dies with the session, so a crashed process never leaves it held.
   */
  async #underLock<T>(login: string, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.#options.admin.connect();
    let locked = false;
    try {
      await this.#step('lock', login);
      await client.query(sql.LOCK_LOGIN, [login]);
      locked = true;
      return await fn(client);
    } finally {
      if (locked) await client.query(sql.UNLOCK_LOGIN, [login]).catch(() => {});
      client.release();
    }
  }

  #remember(login: string, secret: Buffer): LoginCredentials {
    const password = this.#options.passwords.password(`set:${login}`, secret);
    this.#known.set(login, password);
    return { login, password };
  }

  /**
   * Makes the login a plain, inheriting member of exactly `oids`: extra memberships (and admin
   * option, or PG16's inherit/set options turned off) are revoked, missing ones granted, and the
   * result is checked.
   */
  async #syncMemberships(client: pg.PoolClient, login: string, oids: number[]): Promise<void> {
    const names = await client.query<{ oid: number; rolname: string }>(sql.ROLE_NAMES, [oids]);
    if (names.rows.length !== oids.length) {
      throw new RoleResolutionFailedError('a role of this set no longer exists');
    }
    const wanted = new Map(names.rows.map((row) => [Number(row.oid), row.rolname]));
    const current = await client.query<{
      roleid: number;
      rolname: string;
      grantor: string;
      plain: boolean;
    }>(sql.MEMBERSHIPS_OF, [login]);
    const ident = pg.escapeIdentifier(login);
    const kept = new Set<number>();
    for (const membership of current.rows) {
      const oid = Number(membership.roleid);
      if (wanted.has(oid) && membership.plain && !kept.has(oid)) {
        kept.add(oid);
        continue;
      }
      await client.query(
        `revoke ${pg.escapeIdentifier(membership.rolname)} from ${ident} granted by ${pg.escapeIdentifier(membership.grantor)} cascade`,
      );
    }
    const missing = [...wanted]
      .filter(([oid]) => !kept.has(oid))
      .map(([, name]) => pg.escapeIdentifier(name));
    if (missing.length > 0) await client.query(`grant ${missing.join(', ')} to ${ident}`);
    const after = await client.query<{ roleid: number; plain: boolean }>(sql.MEMBERSHIPS_OF, [
      login,
    ]);
    const exact =
      after.rows.length === oids.length &&
      after.rows.every((m) => m.plain && wanted.has(Number(m.roleid)));
    if (!exact)
      throw new RoleResolutionFailedError(`set login ${login} memberships could not be made exact`);
  }

  async #verifyLogin(database: string, login: string, password: string): Promise<void> {
    const probe = new pg.Client({ ...this.#options.loginConfig, database, user: login, password });
    try {
      await probe.connect();
    } finally {
      await probe.end().catch(() => {});
    }
  }

  /** Runs one statement in a data-table database with the privileged connection. */
  async #inDatabase(database: string, statement: string): Promise<void> {
    const client = new pg.Client({ ...this.#options.adminConfig, database });
    try {
      await client.connect();
      await client.query(statement);
    } finally {
      await client.end().catch(() => {});
    }
  }

  /**
   * Retires a set login: row deleted (own commit), then NOLOGIN, sessions terminated, owned
   * objects and privileges dropped in each data-table database, login dropped. Safe to repeat;
   * a crash at any step leaves no row naming a login that cannot authenticate.
   */
  async retire(login: string, databases: readonly string[]): Promise<void> {
    if (!login.startsWith(ROLE_SET_LOGIN_PREFIX))
      throw new RangeError('only set logins are retired');
    await this.#underLock(login, async (client) => {
      await this.#step('delete-row', login);
      await client.query(sql.DELETE_ROW, [login]);
      this.#known.delete(login);
      const exists = (await client.query(sql.READ_LOGIN, [login])).rows.length > 0;
      if (exists) {
        const ident = pg.escapeIdentifier(login);
        await this.#step('nologin', login);
        await client.query(`alter role ${ident} with nologin`);
        await this.#step('terminate-backends', login);
        await client.query(sql.TERMINATE_BACKENDS, [login]);
        await this.#step('drop-owned', login);
        for (const database of new Set(databases))
          await this.#inDatabase(database, `drop owned by ${ident}`);
        await this.#step('drop-login', login);
        await client.query(`drop role if exists ${ident}`);
      }
      this.#options.events.emit('login:retired', { login });
      this.#logger.info({ login }, 'set login retired');
    });
  }

  /** Every set login that holds role `oid`, with or without a row. */
  async holding(oid: number): Promise<string[]> {
    const { rows } = await this.#options.admin.query<{ login: string }>(sql.LOGINS_HOLDING, [oid]);
    return rows.map((row) => row.login);
  }

  /** Rows and orphan logins, for `logins list`. */
  async list(): Promise<
    { login: string; roleOids: number[]; hasRow: boolean; canLogin: boolean }[]
  > {
    const { rows } = await this.#options.admin.query<{
      login: string;
      role_oids: number[] | null;
      has_row: boolean;
      can_login: boolean;
    }>(sql.LIST_LOGINS);
    return rows.map((row) => ({
      login: row.login,
      roleOids: (row.role_oids ?? []).map(Number),
      hasRow: row.has_row,
      canLogin: row.can_login,
    }));
  }

  async #step(step: RoleSetStep, login: string): Promise<void> {
    await this.#options.beforeStep?.(step, login);
  }
}
