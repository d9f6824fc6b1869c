// Over 450 lines on purpose: one class, one method per admin command, each a few lines around
// the shared #change/#commit (generation bump, NOTIFY, propagation wait); split by entity, each
// part would need those private helpers made public.
/*
 * datatable/admin/ — the catalog's admin commands (datatables.admin): data tables, roles,
 * tenants, memberships, governing tables. Each commits with a generation bump and NOTIFY. They
 * sit above logins/: creating a role makes its managed login, disabling one retires the set
 * logins holding it.
 */
// Over ~300 lines on purpose: one method per admin command, all sharing one transaction
// helper (#change: generation bump + NOTIFY) and one role lookup; split, each half would repeat them.
import pg from 'pg';
import { datatableRefOf, validateRoleName } from '../../connector/datatable_ref.js';
import { CatalogError, UnknownDatatableError, UnknownRoleError } from '../../errors.js';
import { WORKSPACE_RE } from '../../job.js';
import { type Logger, silentLogger } from '../../logger.js';
import { withClient, withPooledClient } from '../../pg/pg_clients.js';
import { isRoleNameTaken } from '../../pg/sqlstate.js';
import { withTransaction } from '../../pg/transaction.js';
import { type MembershipKind, validateTenant } from '../catalog/directory.js';
import {
  addGoverningTable,
  type GoverningTableInfo,
  listGoverningTables,
  removeGoverningTable,
} from '../catalog/governing.js';
import type { PropagationWatch } from '../catalog/propagation_acks.js';
import { LIST_DATATABLES, LIST_MEMBERS } from '../catalog/sql/catalog_reads.js';
import * as sql from '../catalog/sql/catalog_writes.js';
import { BUMP_RULES_VERSION } from '../catalog/sql/rules.js';
import { PasswordDeriver, scramVerifier } from '../logins/passwords.js';
import type { RoleSetProtocol } from '../logins/role_set_protocol.js';
import { LOGIN_ATTRIBUTES, READ_ROLE_OID, TERMINATE_BACKENDS } from '../logins/sql/logins.js';

/** What every change returns: the catalog generation it produced. */
export interface CatalogChange {
  readonly generation: number;
}

/** A data table as `listDatatables` reports it. */
export interface DatatableInfo {
  readonly name: string;
  /** The Postgres database it lives in. */
  readonly database: string;
  /** The role plain `datatable://NAME` connects as; null refuses such references. */
  readonly defaultRole: string | null;
}

export interface RoleInfo {
  readonly oid: number;
  readonly datatable: string;
  readonly name: string;
  readonly enabled: boolean;
  readonly tenants: readonly string[];
  /** False when the Postgres role was dropped behind the catalog's back. */
  readonly exists: boolean;
}

export interface CatalogAdminOptions {
  pool: pg.Pool;
  adminConfig: pg.ClientConfig;
  passwords: PasswordDeriver;
  setLogins: RoleSetProtocol;
  /** Called when a login must not be used any more in this process (pools closed). */
  onLoginGone: (login: string) => void;
  /**
   * Called as soon as a change has committed, with its generation, so this process stops
   * serving its in-memory catalog before its own NOTIFY comes back.
   */
  onCommitted?: (generation: number) => void;
  /**
   * When given, each change waits after its commit until every other process acknowledged it
   * (catalog.awaitPropagation; propagation_acks.ts).
   */
  watchPropagation?: () => Promise<PropagationWatch | null>;
  /** Called after a data table is registered, to install what policies may call there. */
  onDatatableCreated?: (database: string) => Promise<void> | undefined;
  logger?: Logger;
}

interface FoundRole {
  oid: number;
  datatable: string;
  name: string;
  enabled: boolean;
  secret: Buffer;
  database: string;
}

/**
 * Changes to the catalog: data tables, roles, tenants, memberships. Each change commits with a
 * generation bump and a NOTIFY, so every process's snapshot — and every cache key built from it —
 * moves on the next run. Role names are validated and always quoted as identifiers.
 */
export class CatalogAdmin {
  readonly #pool: pg.Pool;
  readonly #options: CatalogAdminOptions;
  readonly #logger: Logger;

  constructor(options: CatalogAdminOptions) {
    this.#pool = options.pool;
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
  }

  /** Registers (or repoints) data table `name` of `workspace` at Postgres database `database`. */
  async createDatatable(
    workspace: string,
    name: string,
    options: { database: string },
  ): Promise<CatalogChange> {
    checkWorkspace(workspace);
    datatableRefOf(name);
    if (typeof options?.database !== 'string' || options.database.length === 0) {
      throw new CatalogError('database must name the Postgres database of the data table');
    }
    const change = await this.#change(async (client) => {
      await client.query(sql.INSERT_DATATABLE, [workspace, name, options.database]);
    });
    try {
      await this.#options.onDatatableCreated?.(options.database);
    } catch (err) {
      throw new CatalogError(
        `data table ${name} registered, but the viewer-identity functions could not be installed in its database; grant the library's role CREATE there and retry`,
        { cause: err, datatable: name },
      );
    }
    return change;
  }

  /** The role plain `datatable://NAME` connects as; `null` refuses such references. */
  async setDefaultRole(
    workspace: string,
    datatable: string,
    role: string | null,
  ): Promise<CatalogChange> {
    return this.#change(async (client) => {
      const found = await client.query(sql.READ_DATATABLE, [workspace, datatable]);
      if (found.rows.length === 0) throw new UnknownDatatableError();
      let oid: number | null = null;
      if (role !== null) {
        const target = await this.#findRole(client, workspace, role);
        if (target.datatable !== datatable)
          throw new CatalogError('that role belongs to another data table');
        oid = target.oid;
      }
      await client.query(sql.SET_DEFAULT_ROLE, [workspace, datatable, oid]);
    });
  }

  /**
   * Creates data-table role `name`: a Postgres role that can log in with a managed password,
   * usable by the listed tenants. Grant it table privileges and write RLS policies yourself.
   */
  async createRole(
    workspace: string,
    datatable: string,
    name: string,
    options: { tenants?: readonly string[] } = {},
  ): Promise<CatalogChange & { oid: number }> {
    validateRoleName(name);
    const tenants = (options.tenants ?? []).map(validateTenant);
    const secret = PasswordDeriver.newNonce();
    let oid = 0;
    const change = await this.#change(async (client) => {
      const found = await client.query(sql.READ_DATATABLE, [workspace, datatable]);
      if (found.rows.length === 0) throw new UnknownDatatableError();
      const ident = pg.escapeIdentifier(name);
      try {
        await client.query(`create role ${ident} with nologin`);
      } catch (err) {
        if (isRoleNameTaken(err)) {
          throw new CatalogError(`a Postgres role named ${name} already exists`);
        }
        throw err;
      }
      oid = Number((await client.query<{ oid: number }>(READ_ROLE_OID, [name])).rows[0]!.oid);
      // The password is tied to the OID, which only exists now; the role is committed with it.
      const verifier = await scramVerifier(this.#options.passwords.forRole(oid, secret));
      await client.query(
        `alter role ${ident} with ${LOGIN_ATTRIBUTES} password ${pg.escapeLiteral(verifier)}`,
      );
      await client.query(sql.INSERT_ROLE, [oid, workspace, datatable, name, tenants, secret]);
    });
    this.#logger.info({ role: name }, 'data-table role created');
    return { ...change, oid };
  }

  /** Renames a role. Its set logins stay as they are (they are keyed by catalog id). */
  async renameRole(workspace: string, name: string, newName: string): Promise<CatalogChange> {
    validateRoleName(newName);
    const change = await this.#change(async (client) => {
      const role = await this.#findRole(client, workspace, name);
      try {
        await client.query(
          `alter role ${pg.escapeIdentifier(role.name)} rename to ${pg.escapeIdentifier(newName)}`,
        );
      } catch (err) {
        if (isRoleNameTaken(err)) {
          throw new CatalogError(`a Postgres role named ${newName} already exists`);
        }
        throw err;
      }
      await client.query(sql.RENAME_ROLE, [role.oid, newName]);
    });
    this.#options.onLoginGone(name);
    return change;
  }

  /**
   * Replaces a role's tenant list (`user:EMAIL`, `group:NAME`, `folder:NAME`, `*`, `embed:*`,
   * `embed:APP`).
   */
  async setTenants(
    workspace: string,
    name: string,
    tenants: readonly string[],
  ): Promise<CatalogChange> {
    const checked = tenants.map(validateTenant);
    return this.#change(async (client) => {
      const role = await this.#findRole(client, workspace, name);
      await client.query(sql.SET_TENANTS, [role.oid, checked]);
    });
  }

  /**
   * Disables a role: the catalog stops resolving it and its own login becomes NOLOGIN (sessions
   * ended), then every set login holding it is retired — NOLOGIN on a role does not reach its
   * members. Safe to repeat; a repeat finishes an interrupted disable.
   */
  async disableRole(workspace: string, name: string): Promise<CatalogChange> {
    let role: FoundRole | undefined;
    const change = await this.#change(async (client) => {
      role = await this.#findRole(client, workspace, name);
      await client.query(sql.SET_ENABLED, [role.oid, false]);
      await client.query(`alter role ${pg.escapeIdentifier(role.name)} with nologin`);
    });
    await this.#pool.query(TERMINATE_BACKENDS, [role!.name]);
    this.#options.onLoginGone(role!.name);
    await this.#retireHolding(role!.oid);
    return change;
  }

  /** Re-enables a role (its login password is reset to the managed one). */
  async enableRole(workspace: string, name: string): Promise<CatalogChange> {
    return this.#change(async (client) => {
      const role = await this.#findRole(client, workspace, name);
      const verifier = await scramVerifier(this.#options.passwords.forRole(role.oid, role.secret));
      // The catalog row first, as disableRole does: its row lock orders the two ALTER ROLEs, which
      // otherwise race ("tuple concurrently updated") when two processes change the same role.
      await client.query(sql.SET_ENABLED, [role.oid, true]);
      await client.query(
        `alter role ${pg.escapeIdentifier(role.name)} with ${LOGIN_ATTRIBUTES} password ${pg.escapeLiteral(verifier)}`,
      );
    });
  }

  /**
   * Drops a role: disabled and its set logins retired first, then its privileges and owned
   * objects in the data-table database and the role itself, then the catalog row. RLS policies
   * that name it as text (`pg_has_role(…, 'name', …)`) are yours to update.
   */
  async dropRole(workspace: string, name: string): Promise<CatalogChange> {
    const role = await this.#findRole(this.#pool, workspace, name);
    await this.disableRole(workspace, name);
    try {
      await withClient({ ...this.#options.adminConfig, database: role.database }, (client) =>
        withTransaction(client, async () => {
          await client.query(`drop owned by ${pg.escapeIdentifier(role.name)}`);
          await client.query(`drop role ${pg.escapeIdentifier(role.name)}`);
        }),
      );
    } catch (err) {
      throw new CatalogError(
        `could not drop role ${role.name}; it may hold privileges in another database (run DROP OWNED there)`,
        { cause: err, role: role.name },
      );
    }
    return this.#change(async (tx) => {
      await tx.query(sql.CLEAR_DEFAULT_ROLE, [role.oid]);
      await tx.query(sql.DELETE_ROLE, [role.oid]);
    });
  }

  /** Adds `email` to group/folder `name` (or makes them a workspace admin: kind `admin`). */
  async addMembership(
    workspace: string,
    email: string,
    kind: MembershipKind,
    name: string,
  ): Promise<CatalogChange> {
    return this.#membership(sql.ADD_MEMBERSHIP, workspace, email, kind, name);
  }

  async removeMembership(
    workspace: string,
    email: string,
    kind: MembershipKind,
    name: string,
  ): Promise<CatalogChange> {
    return this.#membership(sql.REMOVE_MEMBERSHIP, workspace, email, kind, name);
  }

  /**
   * The emails in group/folder `name` (built-in directory), e.g. the recipients of a job that
   * runs once per member. Read from the catalog now, not from this process's snapshot.
   */
  async listMembers(
    workspace: string,
    kind: Exclude<MembershipKind, 'admin'>,
    name: string,
  ): Promise<string[]> {
    checkMembership(workspace, 'member', kind, name);
    const { rows } = await this.#pool.query<{ email: string }>(LIST_MEMBERS, [
      workspace,
      kind,
      name,
    ]);
    return rows.map((row) => row.email);
  }

  #membership(
    statement: string,
    workspace: string,
    email: string,
    kind: MembershipKind,
    name: string,
  ): Promise<CatalogChange> {
    checkMembership(workspace, email, kind, name);
    return this.#change(async (client) => {
      await client.query(statement, [workspace, email, kind, name]);
    });
  }

  /**
   * Declares `table` (in the catalog's database) a governing table of `datatable`: any change
   * to its rows — by anyone, through any connection — makes the affected viewers' next run miss
   * (every viewer's, when `viewerColumn` is not given or a change is a truncate). Idempotent.
   */
  async addGoverningTable(
    workspace: string,
    datatable: string,
    table: string,
    options: { viewerColumn?: string } = {},
  ): Promise<CatalogChange> {
    checkWorkspace(workspace);
    const viewerColumn = options.viewerColumn ?? null;
    if (viewerColumn !== null && (typeof viewerColumn !== 'string' || viewerColumn.length === 0)) {
      throw new CatalogError('viewerColumn must name a column', { datatable });
    }
    return this.#change((client) =>
      addGoverningTable(client, workspace, datatable, table, viewerColumn),
    );
  }

  /** Removes a governing table's declaration and triggers. Idempotent. */
  async removeGoverningTable(
    workspace: string,
    datatable: string,
    table: string,
  ): Promise<CatalogChange> {
    checkWorkspace(workspace);
    return this.#change((client) => removeGoverningTable(client, workspace, datatable, table));
  }

  /**
   * A fresh rules version for `datatable`: every entry whose run depended on it misses from the
   * next run, in every process (`datatables.invalidateDatatable` waits for them).
   */
  async bumpRulesVersion(workspace: string, datatable: string): Promise<CatalogChange> {
    checkWorkspace(workspace);
    return this.#change(async (client) => {
      const found = await client.query(sql.READ_DATATABLE, [workspace, datatable]);
      if (found.rowCount === 0) throw new UnknownDatatableError(undefined, { datatable });
      await client.query(BUMP_RULES_VERSION, [workspace, datatable]);
    });
  }

  listGoverningTables(workspace: string): Promise<GoverningTableInfo[]> {
    return listGoverningTables(this.#pool, workspace);
  }

  /** The workspace's data tables: name, Postgres database, default role (or null). */
  async listDatatables(workspace: string): Promise<DatatableInfo[]> {
    checkWorkspace(workspace);
    const { rows } = await this.#pool.query<{
      name: string;
      database: string;
      default_role: string | null;
    }>(LIST_DATATABLES, [workspace]);
    return rows.map((row) => ({
      name: row.name,
      database: row.database,
      defaultRole: row.default_role,
    }));
  }

  async listRoles(workspace: string): Promise<RoleInfo[]> {
    const { rows } = await this.#pool.query<{
      oid: number;
      datatable: string;
      name: string;
      enabled: boolean;
      tenants: string[];
      exists: boolean;
    }>(sql.LIST_ROLES, [workspace]);
    return rows.map((row) => ({ ...row, oid: Number(row.oid) }));
  }

  /** Data-table databases, for statements that must run in each. */
  async databases(): Promise<string[]> {
    const { rows } = await this.#pool.query<{ database: string }>(sql.LIST_DATABASES);
    return rows.map((row) => row.database);
  }

  async #retireHolding(oid: number): Promise<void> {
    const databases = await this.databases();
    for (const login of await this.#options.setLogins.holding(oid)) {
      await this.#options.setLogins.retire(login, databases);
      this.#options.onLoginGone(login);
    }
  }

  /** Runs `fn` in a transaction that ends with a generation bump + NOTIFY. */
  async #change(fn: (client: pg.PoolClient) => Promise<void>): Promise<CatalogChange> {
    const watch = (await this.#options.watchPropagation?.()) ?? null;
    try {
      const generation = await this.#commit(fn);
      await watch?.wait(generation);
      return { generation };
    } finally {
      watch?.close();
    }
  }

  async #commit(fn: (client: pg.PoolClient) => Promise<void>): Promise<number> {
    const generation = await withPooledClient(this.#pool, (client) =>
      withTransaction(client, async () => {
        await fn(client);
        const { rows } = await client.query<{ value: string }>(sql.BUMP_GENERATION);
        return Number(rows[0]!.value);
      }),
    );
    this.#options.onCommitted?.(generation);
    return generation;
  }

  async #findRole(
    client: pg.Pool | pg.PoolClient,
    workspace: string,
    name: string,
  ): Promise<FoundRole> {
    const { rows } = await client.query<FoundRole>(sql.FIND_ROLE, [workspace, name]);
    const row = rows[0];
    if (row === undefined)
      throw new UnknownRoleError(`no data-table role ${name} in this workspace`);
    return { ...row, oid: Number(row.oid) };
  }
}

function checkWorkspace(workspace: string): void {
  if (typeof workspace !== 'string' || !WORKSPACE_RE.test(workspace)) {
    throw new CatalogError('workspace must be a short identifier ([A-Za-z0-9_.-])');
  }
}

function checkMembership(
  workspace: string,
  email: string,
  kind: MembershipKind,
  name: string,
): void {
  checkWorkspace(workspace);
  if (typeof email !== 'string' || email.length === 0)
    throw new CatalogError('email must be non-empty');
  if (kind !== 'group' && kind !== 'folder' && kind !== 'admin') {
    throw new CatalogError('membership kind is group, folder or admin');
  }
  if (typeof name !== 'string' || name.length === 0 || /[\s\p{C}]/u.test(name)) {
    throw new CatalogError(
      'membership name must be non-empty, without spaces or control characters',
    );
  }
}
