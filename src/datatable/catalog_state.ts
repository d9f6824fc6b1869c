import type pg from 'pg';
import type { MembershipKind, Principals } from './directory.js';
import { NO_PRINCIPALS } from './directory.js';
import * as sql from './sql/catalog_reads.js';

/** One data-table role as the catalog knows it. */
export interface CatalogRole {
  /** Catalog id: the Postgres role's OID. */
  readonly oid: number;
  readonly workspace: string;
  readonly datatable: string;
  /** Current name (from pg_roles, so a rename shows at once). */
  readonly name: string;
  readonly enabled: boolean;
  /** Bumped on every disable and enable (part of every grant of the role). */
  readonly version: number;
  readonly tenants: readonly string[];
  /** Nonce of the role's login password. */
  readonly secret: Buffer;
  /**
   * False when the Postgres role is gone, or has SUPERUSER or BYPASSRLS (someone altered it
   * outside the catalog): such a role is never handed out.
   */
  readonly safe: boolean;
}

export interface CatalogDatatable {
  readonly workspace: string;
  readonly name: string;
  readonly database: string;
  readonly defaultRole: number | null;
}

/** An immutable, consistent read of the whole catalog at one generation. */
export class CatalogState {
  readonly #datatables = new Map<string, CatalogDatatable>();
  readonly #datatablesByWorkspace = new Map<string, CatalogDatatable[]>();
  readonly #rolesByWorkspace = new Map<string, CatalogRole[]>();
  readonly #roleByOid = new Map<number, CatalogRole>();
  readonly #roleByName = new Map<string, CatalogRole>();
  readonly #principals = new Map<
    string,
    { groups: string[]; folders: string[]; isAdmin: boolean }
  >();

  constructor(
    readonly generation: number,
    datatables: readonly CatalogDatatable[],
    roles: readonly CatalogRole[],
    memberships: readonly {
      workspace: string;
      email: string;
      kind: MembershipKind;
      name: string;
    }[],
    /** Random id of this catalog (migration 3), so fingerprints of two catalogs never meet. */
    readonly catalogId = '',
  ) {
    for (const datatable of [...datatables].sort((a, b) => (a.name < b.name ? -1 : 1))) {
      this.#datatables.set(`${datatable.workspace}\0${datatable.name}`, datatable);
      const list = this.#datatablesByWorkspace.get(datatable.workspace) ?? [];
      list.push(datatable);
      this.#datatablesByWorkspace.set(datatable.workspace, list);
    }
    for (const role of roles) {
      this.#roleByOid.set(role.oid, role);
      this.#roleByName.set(`${role.workspace}\0${role.name}`, role);
      const list = this.#rolesByWorkspace.get(role.workspace) ?? [];
      list.push(role);
      this.#rolesByWorkspace.set(role.workspace, list);
    }
    for (const { workspace, email, kind, name } of memberships) {
      const key = `${workspace}\0${email}`;
      let entry = this.#principals.get(key);
      if (entry === undefined) {
        entry = { groups: [], folders: [], isAdmin: false };
        this.#principals.set(key, entry);
      }
      if (kind === 'group') entry.groups.push(name);
      else if (kind === 'folder') entry.folders.push(name);
      else entry.isAdmin = true;
    }
  }

  /** The data tables of `workspace`, by name. */
  datatables(workspace: string): readonly CatalogDatatable[] {
    return this.#datatablesByWorkspace.get(workspace) ?? [];
  }

  datatable(workspace: string, name: string): CatalogDatatable | undefined {
    return this.#datatables.get(`${workspace}\0${name}`);
  }

  roles(workspace: string): readonly CatalogRole[] {
    return this.#rolesByWorkspace.get(workspace) ?? [];
  }

  role(oid: number): CatalogRole | undefined {
    return this.#roleByOid.get(oid);
  }

  roleByName(workspace: string, name: string): CatalogRole | undefined {
    return this.#roleByName.get(`${workspace}\0${name}`);
  }

  /** Memberships from the built-in directory. */
  principals(workspace: string, email: string): Principals {
    return this.#principals.get(`${workspace}\0${email}`) ?? NO_PRINCIPALS;
  }

  /** Every email the built-in directory or a `user:` tenant mentions in `workspace`. */
  knownEmails(workspace: string): Set<string> {
    const emails = new Set<string>();
    const prefix = `${workspace}\0`;
    for (const key of this.#principals.keys()) {
      if (key.startsWith(prefix)) emails.add(key.slice(prefix.length));
    }
    for (const role of this.roles(workspace)) {
      for (const tenant of role.tenants)
        if (tenant.startsWith('user:')) emails.add(tenant.slice(5));
    }
    return emails;
  }

  workspaces(): Set<string> {
    return new Set(this.#datatablesByWorkspace.keys());
  }
}

/**
 * Reads the whole catalog in one repeatable-read snapshot, so the generation and the contents
 * agree.
 */
export async function loadCatalogState(pool: pg.Pool): Promise<CatalogState> {
  const client = await pool.connect();
  try {
    // One snapshot for all four reads, so generation and contents agree.
    await client.query('begin transaction isolation level repeatable read read only');
    const generation = await client.query<{ value: string; catalog_id: string }>(
      sql.READ_GENERATION,
    );
    const datatables = await client.query<{
      workspace: string;
      name: string;
      database: string;
      default_role: number | null;
    }>(sql.READ_DATATABLES);
    const roles = await client.query<{
      oid: number;
      workspace: string;
      datatable: string;
      name: string;
      enabled: boolean;
      version: string;
      tenants: string[];
      secret: Buffer;
      safe: boolean;
    }>(sql.READ_ROLES);
    const memberships = await client.query<{
      workspace: string;
      email: string;
      kind: MembershipKind;
      name: string;
    }>(sql.READ_MEMBERSHIPS);
    await client.query('commit');
    return new CatalogState(
      Number(generation.rows[0]?.value ?? 0),
      datatables.rows.map((row) => ({
        workspace: row.workspace,
        name: row.name,
        database: row.database,
        defaultRole: row.default_role === null ? null : Number(row.default_role),
      })),
      roles.rows.map((row) => ({ ...row, oid: Number(row.oid), version: Number(row.version) })),
      memberships.rows,
      generation.rows[0]?.catalog_id ?? '',
    );
  } catch (err) {
    await client.query('rollback').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}
