import pg from 'pg';
import { RoleResolutionFailedError } from '../../errors.js';
import type { TypedEmitter } from '../../events.js';
import { type Logger, silentLogger } from '../../logger.js';
import { withPooledClient } from '../../pg/pg_clients.js';
import { withTransaction } from '../../pg/transaction.js';
import type { CatalogRole } from '../catalog/catalog_state.js';
import { type PasswordDeriver, scramVerifier, verifierMatches } from './passwords.js';
import { type LoginEvents, resetSettings } from './role_set_protocol.js';
import * as sql from './sql/logins.js';

/** What a managed login must be for the library to keep lending it. */
export interface ExpectedLogin {
  readonly login: string;
  /** The password the library derives for it. */
  readonly password: string;
  /** For a set login: exactly these plain memberships. A role's own login: not checked. */
  readonly memberships?: readonly number[];
}

export interface LoginRepairOptions {
  admin: pg.Pool;
  passwords: PasswordDeriver;
  events: TypedEmitter<LoginEvents>;
  logger?: Logger;
}

/**
 * Detects and repairs what a runnable (or an operator) changed about a managed login behind the
 * library's back (SPEC invariant 15): its password (`ALTER ROLE current_user PASSWORD`), its
 * per-role settings (`ALTER ROLE current_user SET …`, which `DISCARD ALL` does not reset), its
 * attributes (NOLOGIN, …) or its memberships. Postgres has no privilege that forbids a role to
 * change its own password or settings, so the library checks instead:
 * - {@link inspect} on the admin side, after each release (off the request path) and when a
 *   pool opens;
 * - a role's own login refused at connect is taken back ({@link takeBackRole}) and retried once.
 */
export class LoginRepair {
  readonly #options: LoginRepairOptions;
  readonly #logger: Logger;
  /** Verifiers already proven to match the managed password, by login (no PBKDF2 twice). */
  readonly #verified = new Map<string, string>();
  #canReadVerifiers: Promise<boolean> | null = null;

  constructor(options: LoginRepairOptions) {
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
  }

  /**
   * Whether the login is as the library left it: can log in with exactly the managed attributes,
   * has no per-role settings, holds exactly its set's memberships, and (where the library's
   * connection may read pg_authid) still has the managed password.
   */
  async inspect(expected: ExpectedLogin): Promise<boolean> {
    const readVerifier = await this.#mayReadVerifiers();
    const { rows } = await this.#options.admin.query<{
      managed: boolean;
      settings: number;
      verifier: string | null;
      plain_memberships: number[];
      memberships: number;
    }>({
      name: 'viewer_cache_inspect',
      text: sql.INSPECT_LOGIN,
      values: [expected.login, readVerifier],
    });
    const row = rows[0];
    if (row === undefined || !row.managed || row.settings > 0) return false;
    if (expected.memberships !== undefined) {
      const plain = row.plain_memberships.map(Number);
      if (
        row.memberships !== expected.memberships.length ||
        plain.join(',') !== [...expected.memberships].sort((a, b) => a - b).join(',')
      ) {
        return false;
      }
    }
    return !readVerifier || this.#verifierIsManaged(expected, row.verifier);
  }

  async #verifierIsManaged(expected: ExpectedLogin, verifier: string | null): Promise<boolean> {
    if (verifier === null) return false;
    if (this.#verified.get(expected.login) === verifier) return true;
    if (!(await verifierMatches(verifier, expected.password))) return false;
    this.#verified.set(expected.login, verifier);
    return true;
  }

  /**
   * Resets a data-table role's own login to what the catalog says — managed attributes, the
   * derived password, no per-role settings — and ends its other sessions. Refuses (fail closed)
   * when the role was disabled meanwhile: its row is locked against a concurrent disable.
   * @throws {RoleResolutionFailedError}
   */
  async takeBackRole(role: CatalogRole): Promise<void> {
    const started = performance.now();
    const password = this.#options.passwords.forRole(role.oid, role.secret);
    const verifier = pg.escapeLiteral(await scramVerifier(password));
    const ident = pg.escapeIdentifier(role.name);
    try {
      await withPooledClient(this.#options.admin, async (client) => {
        await client.query(sql.LOCK_LOGIN, [role.name]);
        try {
          await withTransaction(client, async () => {
            const { rows } = await client.query(sql.LOCK_ENABLED_ROLE, [role.oid]);
            if (rows.length === 0) {
              throw new RoleResolutionFailedError('that role was disabled or dropped meanwhile', {
                role: role.name,
              });
            }
            await client.query(
              `alter role ${ident} with ${sql.LOGIN_ATTRIBUTES} password ${verifier}`,
            );
            await resetSettings(client, role.name);
          });
          await client.query(sql.TERMINATE_BACKENDS, [role.name]);
        } finally {
          await client.query(sql.UNLOCK_LOGIN, [role.name]).catch(() => {});
        }
      });
    } catch (err) {
      if (err instanceof RoleResolutionFailedError) throw err;
      throw new RoleResolutionFailedError('could not repair the login of this role', {
        cause: err,
        role: role.name,
      });
    }
    this.#verified.delete(role.name);
    this.#options.events.emit('login:taken-back', { ms: performance.now() - started });
    this.#logger.warn(
      { role: role.name },
      'role login was changed outside the library; taken back',
    );
  }

  /** Forgets what was verified about `login` (it was retired or taken back). */
  forget(login: string): void {
    this.#verified.delete(login);
  }

  #mayReadVerifiers(): Promise<boolean> {
    this.#canReadVerifiers ??= this.#options.admin
      .query<{ rolsuper: boolean }>(sql.CAN_READ_VERIFIERS)
      .then(
        (result) => result.rows[0]?.rolsuper === true,
        () => {
          this.#canReadVerifiers = null; // ask again next time
          return false;
        },
      );
    return this.#canReadVerifiers;
  }
}
