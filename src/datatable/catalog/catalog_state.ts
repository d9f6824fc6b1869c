/*
 * datatable/catalog/ — what the catalog says, and how each process keeps it fresh: the
 * immutable state read at one generation (this file), the snapshot that keeps it fresh through
 * LISTEN/NOTIFY and heartbeats (catalog_snapshot.ts) with its propagation acknowledgements
 * (propagation_acks.ts), the schema and its migrations (migrations.ts), governing tables
 * (governing.ts), group and folder memberships (directory.ts), and its statements (sql/).
 * Beneath every other room but pg/.
 */
import type pg from 'pg';
import { withPooledClient } from '../../pg/pg_clients.js';
import { withTransaction } from '../../pg/transaction.js';
import type { MembershipKind, Principals } from './directory.js';
import { NO_PRINCIPALS } from './directory.js';
import * as sql from './sql/catalog_reads.js';
import { READ_RULES } from './sql/rules.js';

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

/** One governing table of a data table, with its change stamps (see governing.ts). */
export interface GoverningStamps {
  readonly relation: number;
  /** Stamp of changes that concern every viewer ('' row): truncate, no viewer column, null. */
  readonly wide: string;
  /** Stamp of the table's latest change of any kind. */
  readonly latest: string;
  readonly byViewer: ReadonlyMap<string, string>;
}

/** An immutable, consistent read of the whole catalog at one generation. */
export class CatalogState {
  readonly #datatables = new Map<string, CatalogDatatable>();
  readonly #datatablesByWorkspace = new Map<string, CatalogDatatable[]>();
  readonly #rolesByWorkspace = new Map<string, CatalogRole[]>();
  readonly #roleByOid = new Map<number, CatalogRole>();
  readonly #roleByName = new Map<string, CatalogRole>();
  readonly #governing = new Map<string, GoverningStamps[]>();
  readonly #rules = new Map<string, string>();
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
    governing: readonly GoverningRow[] = [],
    rules: readonly RulesRow[] = [],
  ) {
    this.#indexGoverning(governing);
    for (const row of rules) this.#rules.set(`${row.workspace}\0${row.datatable}`, row.version);
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

  /**
   * The version of what roles may read in the data table's database (policies, grants, views,
   * functions): '' until a change stamped it. Part of every grant (rules_watch.ts).
   */
  rulesVersion(workspace: string, datatable: string): string {
    return this.#rules.get(`${workspace}\0${datatable}`) ?? '';
  }

  /** Governing tables of a data table, by relation id. */
  governing(workspace: string, datatable: string): readonly GoverningStamps[] {
    return this.#governing.get(`${workspace}\0${datatable}`) ?? [];
  }

  #indexGoverning(rows: readonly GoverningRow[]): void {
    const tables = new Map<
      string,
      Map<number, { wide: string; latest: string; byViewer: Map<string, string> }>
    >();
    for (const row of rows) {
      const key = `${row.workspace}\0${row.datatable}`;
      let byRelation = tables.get(key);
      if (byRelation === undefined) {
        byRelation = new Map();
        tables.set(key, byRelation);
      }
      let table = byRelation.get(row.relation);
      if (table === undefined) {
        table = { wide: '', latest: '', byViewer: new Map() };
        byRelation.set(row.relation, table);
      }
      if (row.viewer === null || row.version === null) continue;
      if (row.viewer === '') table.wide = row.version;
      else table.byViewer.set(row.viewer, row.version);
      // Stamps are transaction ids: numerically larger is later.
      if (table.latest === '' || BigInt(row.version) > BigInt(table.latest))
        table.latest = row.version;
    }
    for (const [key, byRelation] of tables) {
      this.#governing.set(
        key,
        [...byRelation].sort(([a], [b]) => a - b).map(([relation, t]) => ({ relation, ...t })),
      );
    }
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
/** A row of READ_GOVERNING. */
export interface GoverningRow {
  readonly workspace: string;
  readonly datatable: string;
  readonly relation: number;
  readonly viewer: string | null;
  readonly version: string | null;
}

/** A row of READ_RULES. */
export interface RulesRow {
  readonly workspace: string;
  readonly datatable: string;
  readonly version: string;
}

export function loadCatalogState(pool: pg.Pool): Promise<CatalogState> {
  return withPooledClient(pool, (client) =>
    // One snapshot for every read, so generation and contents agree.
    withTransaction(
      client,
      async () => {
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
        const governing = await client.query<GoverningRow>(sql.READ_GOVERNING);
        const rules = await client.query<RulesRow>(READ_RULES);
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
          governing.rows.map((row) => ({ ...row, relation: Number(row.relation) })),
          rules.rows,
        );
      },
      { snapshot: true },
    ),
  );
}
