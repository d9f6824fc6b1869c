// One file over ~300 lines on purpose: the protocol's correctness argument is the order of its
// steps (lock, row, login, proof, row again), and it reads best top to bottom in one place.
import { hash } from 'node:crypto';
import pg from 'pg';
import { ROLE_SET_LOGIN_PREFIX } from '../../connector/datatable_ref.js';
import { RoleResolutionFailedError } from '../../errors.js';
import type { TypedEmitter } from '../../events.js';
import { type Logger, silentLogger } from '../../logger.js';
import { withClient, withPooledClient } from '../../pg/pg_clients.js';
import { sqlstateOf } from '../../pg/sqlstate.js';
import { withTransaction } from '../../pg/transaction.js';
import { PasswordDeriver, scramVerifier } from './passwords.js';
import {
  LOGIN_ATTRIBUTES,
  READ_ROLE_OID,
  ROLE_SETTINGS,
  TERMINATE_BACKENDS,
  TERMINATE_BACKENDS_OF_OID,
} from './sql/logins.js';
import * as sql from './sql/role_set.js';

/** What the logins room emits (part of `DatatablesEvents`). */
export interface LoginEvents {
  'login:created': { ms: number };
  'login:taken-back': { ms: number };
  'login:retired': { login: string };
  /** A check of a login's connections after a release finished (`repaired`: it took it back). */
  'login:checked': { repaired: boolean };
}

/** Where a set login is in its protocol; a test hook can fail or pause at any of them. */
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

/** Test hook: called before each step; throwing simulates a crash there. */
export type RoleSetStepHook = (step: RoleSetStep, login: string) => void | Promise<void>;

export interface RoleSetProtocolOptions {
  /** Privileged pool on the catalog database (CREATEROLE, admin of the data-table roles). */
  admin: pg.Pool;
  /** The same privileged connection, for statements that must run in a data-table database. */
  adminConfig: pg.ClientConfig;
  passwords: PasswordDeriver;
  events: TypedEmitter<LoginEvents>;
  logger?: Logger;
  beforeStep?: RoleSetStepHook;
}

/** How {@link RoleSetProtocol.prepare} proves a login it created or took back. */
export interface PrepareOptions {
  /**
   * Opens the first connection as the login: the proof that it authenticates, and (kept by the
   * caller) the first lease, so first use costs one handshake. Throws if the login cannot log in.
   */
  prove(password: string): Promise<void>;
  /**
   * A password that was just refused: if the row still derives it, the login was changed behind
   * the library's back (password, NOLOGIN, dropped), so the row is removed and the login taken
   * back rather than trusted.
   */
  refused?: string;
  /**
   * Repair only: when the login has no row (it was retired, or is being), leave it alone and
   * return null rather than create it again — a post-release check must never resurrect a
   * login that someone retired.
   */
  onlyIfRecorded?: boolean;
}

/**
 * `wm_set_<hash>`: one login per distinct *set* of roles (SPEC invariants 6–8). The hash is over
 * the sorted catalog ids, so a rename moves nothing and a change in someone's groups resolves
 * them to another login rather than editing one. The login is `INHERIT` and a member of exactly
 * those roles; it has no privileges of its own, so `SET ROLE` can only narrow.
 *
 * Every step holds a per-login session advisory lock on a privileged connection:
 * - create: in one transaction that first locks the set's catalog rows against a concurrent
 *   disable, the login is created *with* its memberships and marked as this catalog's; then it is
 *   proven to authenticate, and only then, re-checking the roles under the same row locks, is the
 *   `role_set` row written;
 * - take back (a login found without a row, or with a row whose password was refused): attributes,
 *   settings and password reset and memberships made exact in one transaction, sessions ended,
 *   directly granted privileges dropped, proven, row written;
 * - retire: the row is deleted first, then the login is made NOLOGIN, its sessions ended, and it
 *   is dropped.
 * So a row always names a login that can authenticate with the password derived from the row,
 * and no login holding a disabled role is left able to log in, whatever the interleaving.
 */
export class RoleSetProtocol {
  readonly #options: RoleSetProtocolOptions;
  readonly #logger: Logger;

  constructor(options: RoleSetProtocolOptions) {
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
  }

  /** The set login's name for these catalog ids (order does not matter). */
  static loginName(oids: readonly number[]): string {
    const sorted = [...new Set(oids)].sort((a, b) => a - b);
    return ROLE_SET_LOGIN_PREFIX + hash('sha256', sorted.join(','), 'hex').slice(0, 32);
  }

  /**
   * The password of the set login for `oids` (sorted, ≥ 2), from its row; creating the login or
   * taking it back first when there is no trustworthy row.
   * @throws {RoleResolutionFailedError}
   */
  prepare(
    login: string,
    oids: readonly number[],
    database: string,
    options: PrepareOptions & { onlyIfRecorded?: false },
  ): Promise<string>;
  prepare(
    login: string,
    oids: readonly number[],
    database: string,
    options: PrepareOptions,
  ): Promise<string | null>;
  async prepare(
    login: string,
    oids: readonly number[],
    database: string,
    options: PrepareOptions,
  ): Promise<string | null> {
    const started = performance.now();
    try {
      return await this.#underLock(login, async (client) => {
        await this.#step('read-row', login);
        const { rows } = await client.query<{
          role_oids: number[] | null;
          secret: Buffer | null;
          login_exists: boolean;
        }>(sql.READ_ROW_AND_LOGIN, [login]);
        const row = rows[0]!;
        if (row.role_oids !== null && row.secret !== null) {
          const stored = row.role_oids.map(Number).sort((a, b) => a - b);
          if (stored.join(',') !== oids.join(',')) {
            // A hash collision or a hand-edited row: refuse rather than hand out other roles.
            throw new RoleResolutionFailedError(
              `set login ${login} is recorded for another role set`,
            );
          }
          const password = this.#options.passwords.forSet(login, row.secret);
          if (password !== options.refused) return password;
          // The row's own password was refused: the login was changed behind our back.
          await this.#step('delete-row', login);
          await client.query(sql.DELETE_ROW, [login]);
        } else if (options.onlyIfRecorded === true) {
          return null;
        }
        return this.#createOrTakeBack(client, login, oids, database, options, {
          started,
          takeBack: row.login_exists,
        });
      });
    } catch (err) {
      if (err instanceof RoleResolutionFailedError) throw err;
      throw new RoleResolutionFailedError('could not prepare the login for this role set', {
        cause: err,
      });
    }
  }

  async #createOrTakeBack(
    client: pg.PoolClient,
    login: string,
    oids: readonly number[],
    database: string,
    options: PrepareOptions,
    { started, takeBack }: { started: number; takeBack: boolean },
  ): Promise<string> {
    await this.#step('read-login', login);
    const secret = PasswordDeriver.newNonce();
    const password = this.#options.passwords.forSet(login, secret);
    const verifier = pg.escapeLiteral(await scramVerifier(password));
    const ident = pg.escapeIdentifier(login);

    if (takeBack) {
      await withTransaction(client, async () => {
        const roles = await this.#lockEnabledRoles(client, oids);
        await this.#step('alter-login', login);
        await client.query(`alter role ${ident} with ${LOGIN_ATTRIBUTES} password ${verifier}`);
        await resetSettings(client, login);
        await this.#step('sync-memberships', login);
        await this.#syncMemberships(client, login, roles);
        const { rows } = await client.query<{ catalog_id: string }>(sql.READ_CATALOG_ID);
        await client.query(sql.MARK(ident, rows[0]?.catalog_id ?? ''));
      });
      // After the commit: sessions opened with the old password or privileges end now.
      await this.#step('terminate-backends', login);
      await client.query(TERMINATE_BACKENDS, [login]);
      // Anything granted to the login directly is revoked: its privileges are its memberships.
      await this.#step('drop-owned', login);
      await this.#inDatabase(database, `drop owned by ${ident}`);
    } else {
      await this.#step('create-login', login);
      try {
        await client.query(sql.CREATE_LOGIN(oids, pg.escapeLiteral(login), verifier));
      } catch (err) {
        if (sqlstateOf(err) === sql.ROLES_GONE) {
          throw new RoleResolutionFailedError(
            'a role of this set was disabled or dropped meanwhile',
          );
        }
        throw err;
      }
    }

    await this.#step('verify-login', login);
    await options.prove(password);

    await this.#step('insert-row', login);
    // Re-checked under the row locks: a role disabled since the login was made refuses here,
    // and the login, left without a row, is retired by the disable (or gc).
    const inserted = await client.query(sql.INSERT_ROW_IF_ENABLED, [login, oids, secret]);
    if (inserted.rowCount !== 1) {
      throw new RoleResolutionFailedError('a role of this set was disabled or dropped meanwhile');
    }

    const ms = performance.now() - started;
    this.#options.events.emit(takeBack ? 'login:taken-back' : 'login:created', { ms });
    this.#logger.info(
      { login, roles: oids.length, ms, takeBack },
      takeBack ? 'set login taken back' : 'set login created',
    );
    return password;
  }

  /**
   * Locks the set's catalog rows (FOR SHARE) and returns their role names by OID.
   * @throws {RoleResolutionFailedError} when one of them is disabled, dropped or unsafe.
   */
  async #lockEnabledRoles(
    client: pg.PoolClient,
    oids: readonly number[],
  ): Promise<Map<number, string>> {
    const { rows } = await client.query<{ oid: number; rolname: string }>(sql.LOCK_ENABLED_ROLES, [
      oids,
    ]);
    if (rows.length !== oids.length) {
      throw new RoleResolutionFailedError('a role of this set was disabled or dropped meanwhile');
    }
    return new Map(rows.map((row) => [Number(row.oid), row.rolname]));
  }

  /**
   * Runs `fn` holding the login's session advisory lock on a privileged connection. The lock
   * dies with the session, so a crashed process (or a terminated lock connection) never leaves
   * it held; a connection that died is destroyed, not pooled.
   */
  #underLock<T>(login: string, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return withPooledClient(this.#options.admin, async (client) => {
      await this.#step('lock', login);
      await client.query(sql.LOCK_LOGIN, [login]);
      try {
        return await fn(client);
      } finally {
        // Awaited, so the connection goes back idle: after a failed statement its answer is
        // not complete yet, and an unlock sent then would sit queued on the connection when the
        // next borrower sends its own (pg deprecates that; pg 9 refuses it). A connection that
        // died took the lock with it.
        await client.query(sql.UNLOCK_LOGIN, [login]).catch(() => {});
      }
    });
  }

  /**
   * Makes the login a plain, inheriting member of exactly `roles`: extra memberships (and admin
   * option, or PG16's inherit/set options turned off) are revoked, missing ones granted, and the
   * result is checked.
   */
  async #syncMemberships(
    client: pg.PoolClient,
    login: string,
    roles: ReadonlyMap<number, string>,
  ): Promise<void> {
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
      if (roles.has(oid) && membership.plain && !kept.has(oid)) {
        kept.add(oid);
        continue;
      }
      await client.query(
        `revoke ${pg.escapeIdentifier(membership.rolname)} from ${ident} granted by ${pg.escapeIdentifier(membership.grantor)} cascade`,
      );
    }
    const missing = [...roles]
      .filter(([oid]) => !kept.has(oid))
      .map(([, name]) => pg.escapeIdentifier(name));
    if (missing.length > 0) await client.query(`grant ${missing.join(', ')} to ${ident}`);
    const after = await client.query<{ roleid: number; plain: boolean }>(sql.MEMBERSHIPS_OF, [
      login,
    ]);
    const exact =
      after.rows.length === roles.size &&
      after.rows.every((m) => m.plain && roles.has(Number(m.roleid)));
    if (!exact)
      throw new RoleResolutionFailedError(`set login ${login} memberships could not be made exact`);
  }

  /** Runs one statement in a data-table database with the privileged connection. */
  async #inDatabase(database: string, statement: string): Promise<void> {
    await withClient({ ...this.#options.adminConfig, database }, (client) =>
      client.query(statement),
    );
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
      const found = (await client.query<{ oid: number }>(READ_ROLE_OID, [login])).rows[0];
      if (found !== undefined) {
        const ident = pg.escapeIdentifier(login);
        await this.#step('nologin', login);
        await client.query(`alter role ${ident} with nologin`);
        await this.#step('terminate-backends', login);
        await client.query(TERMINATE_BACKENDS, [login]);
        await this.#step('drop-owned', login);
        for (const database of new Set(databases))
          await this.#inDatabase(database, `drop owned by ${ident}`);
        await this.#step('drop-login', login);
        await client.query(`drop role if exists ${ident}`);
        // A session that was still starting when the sessions were ended (authenticated before
        // NOLOGIN, not yet listed) would live on without its login: found by OID, ended too.
        await client.query(TERMINATE_BACKENDS_OF_OID, [found.oid]);
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

  /** Rows, and logins of this catalog without one (whatever they hold), for `logins list`. */
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

/** Clears every per-role setting of `login` (all databases): `DISCARD ALL` does not. */
export async function resetSettings(client: pg.ClientBase, login: string): Promise<void> {
  const ident = pg.escapeIdentifier(login);
  const { rows } = await client.query<{ database: string | null }>(ROLE_SETTINGS, [login]);
  for (const { database } of rows) {
    await client.query(
      database === null
        ? `alter role ${ident} reset all`
        : `alter role ${ident} in database ${pg.escapeIdentifier(database)} reset all`,
    );
  }
}
