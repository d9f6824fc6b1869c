import pg from 'pg';
import { lintPolicies, type PolicyFinding, readsViewerIdentity } from './policy_lints.js';

/** What {@link lintDatatables} needs of the catalog: `datatables.admin` has it. */
export interface LintCatalog {
  listDatatables(workspace: string): Promise<ReadonlyArray<{ name: string; database: string }>>;
  listRoles(
    workspace: string,
  ): Promise<ReadonlyArray<{ datatable: string; name: string; enabled: boolean }>>;
}

/** What {@link lintDatatables} found: the findings, and which data tables read the viewer. */
export interface DatatablesLint {
  readonly findings: readonly PolicyFinding[];
  /** Data tables whose policies or views read `viewer_cache.viewer_email()`/`viewer_attribute()`. */
  readonly readIdentity: readonly string[];
}

/**
 * Lints every data table of `workspace` registered in the catalog ({@link lintPolicies}), each in
 * its own database, reached as `connection` with the database swapped (the catalog's connection
 * is a role that reads every data table's system catalogs). One connection at a time, always
 * closed.
 */
export async function lintDatatables(options: {
  readonly catalog: LintCatalog;
  readonly workspace: string;
  readonly connection: string | pg.ClientConfig;
  readonly intended?: Readonly<Record<string, string>>;
}): Promise<DatatablesLint> {
  const base: pg.ClientConfig =
    typeof options.connection === 'string'
      ? { connectionString: options.connection }
      : options.connection;
  const roles = await options.catalog.listRoles(options.workspace);
  const findings: PolicyFinding[] = [];
  const readIdentity: string[] = [];
  for (const datatable of await options.catalog.listDatatables(options.workspace)) {
    const client = new pg.Client(inDatabase(base, datatable.database));
    // A connection dying mid-lint fails the query in flight; without a listener it would also
    // be an unhandled 'error' event.
    client.on('error', () => {});
    await client.connect();
    try {
      findings.push(
        ...(await lintPolicies({
          client,
          datatable: datatable.name,
          roles: roles.filter((r) => r.datatable === datatable.name).map((r) => r.name),
          ...(options.intended ? { intended: options.intended } : {}),
        })),
      );
      if (await readsViewerIdentity(client)) readIdentity.push(datatable.name);
    } finally {
      await client.end().catch(() => {});
    }
  }
  return { findings, readIdentity };
}

/** `config` pointed at `database` (a connection string's path wins over `database` in pg). */
function inDatabase(config: pg.ClientConfig, database: string): pg.ClientConfig {
  if (config.connectionString === undefined) return { ...config, database };
  const url = new URL(config.connectionString);
  url.pathname = `/${encodeURIComponent(database)}`;
  return { ...config, connectionString: url.toString() };
}
