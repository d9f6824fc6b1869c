import type pg from 'pg';
import { CatalogError, UnknownDatatableError } from '../../errors.js';

/**
 * Governing tables: tables whose rows govern who sees what — the entitlements table of the RLS
 * guide, a row per person per health system. Row-level policies read them, so a change to their
 * rows changes what a viewer may see without any catalog change. Declared here, each gets
 * statement-level triggers (insert, update, delete, truncate) that record a stamp (the writing
 * transaction's id, never reused) for the table and for each viewer named in the changed rows,
 * bump the catalog generation and NOTIFY, in the writer's own transaction — whoever writes,
 * through whatever connection. Every process reloads, and the stamps are part of the grants,
 * hence of the fingerprint: the affected viewers miss on their next run; others keep hitting.
 *
 * The triggers write to the catalog, so a governing table must live in the catalog's database.
 */

export interface GoverningTableInfo {
  readonly datatable: string;
  /** The table, as Postgres names it (`public.entitlements`). */
  readonly table: string;
  /** The column holding the viewer's email, or null (any change concerns every viewer). */
  readonly viewerColumn: string | null;
}

const TRIGGERS = [
  ['viewer_cache_governing_insert', 'insert', 'referencing new table as new_rows', 'new'],
  [
    'viewer_cache_governing_update',
    'update',
    'referencing old table as old_rows new table as new_rows',
    'both',
  ],
  ['viewer_cache_governing_delete', 'delete', 'referencing old table as old_rows', 'old'],
  ['viewer_cache_governing_truncate', 'truncate', '', 'none'],
] as const;

/** Declares `table` governing for `datatable` (idempotent: a repeat updates the column). */
export async function addGoverningTable(
  client: pg.ClientBase,
  workspace: string,
  datatable: string,
  table: string,
  viewerColumn: string | null,
): Promise<void> {
  const found = await client.query<{ database: string; here: string }>(
    `select d.database, current_database() as here from viewer_cache.datatable d
      where d.workspace = $1 and d.name = $2`,
    [workspace, datatable],
  );
  const row = found.rows[0];
  if (row === undefined) throw new UnknownDatatableError(undefined, { datatable });
  if (row.database !== row.here) {
    throw new CatalogError(
      `governing tables must live in the catalog's database (${row.here}); data table ${datatable} is in ${row.database}`,
      { datatable },
    );
  }
  const relation = await relationOf(client, table, datatable);
  if (viewerColumn !== null) {
    const column = await client.query(
      `select 1 from pg_catalog.pg_attribute
        where attrelid = $1 and attname = $2 and attnum > 0 and not attisdropped`,
      [relation.oid, viewerColumn],
    );
    if (column.rowCount === 0) {
      throw new CatalogError(
        `table ${relation.name} has no column ${JSON.stringify(viewerColumn)}`,
        {
          datatable,
        },
      );
    }
  }
  const argument = client.escapeLiteral(viewerColumn ?? '');
  for (const [name, event, referencing, rowsFrom] of TRIGGERS) {
    await client.query(`drop trigger if exists ${name} on ${relation.name}`);
    await client.query(
      `create trigger ${name} after ${event} on ${relation.name} ${referencing}
         for each statement execute function viewer_cache.governing_changed(${argument}, '${rowsFrom}')`,
    );
  }
  await client.query(
    `insert into viewer_cache.governing_table (workspace, datatable, relation, viewer_column)
     values ($1, $2, $3, $4)
     on conflict (workspace, datatable, relation) do update set viewer_column = excluded.viewer_column`,
    [workspace, datatable, relation.oid, viewerColumn],
  );
  // A fresh stamp: entries computed before the declaration never match after it.
  await client.query(
    `insert into viewer_cache.governing_version (relation, viewer, version)
     values ($1, '', pg_current_xact_id()::text)
     on conflict (relation, viewer) do update set version = excluded.version`,
    [relation.oid],
  );
}

/** Removes the declaration and its triggers (idempotent). */
export async function removeGoverningTable(
  client: pg.ClientBase,
  workspace: string,
  datatable: string,
  table: string,
): Promise<void> {
  const relation = await relationOf(client, table, datatable);
  const others = await client.query(
    `select 1 from viewer_cache.governing_table
      where relation = $1 and not (workspace = $2 and datatable = $3)`,
    [relation.oid, workspace, datatable],
  );
  if (others.rowCount === 0) {
    for (const [name] of TRIGGERS) {
      await client.query(`drop trigger if exists ${name} on ${relation.name}`);
    }
    await client.query('delete from viewer_cache.governing_version where relation = $1', [
      relation.oid,
    ]);
  }
  await client.query(
    'delete from viewer_cache.governing_table where workspace = $1 and datatable = $2 and relation = $3',
    [workspace, datatable, relation.oid],
  );
}

export async function listGoverningTables(
  pool: pg.Pool,
  workspace: string,
): Promise<GoverningTableInfo[]> {
  const { rows } = await pool.query<{
    datatable: string;
    table: string;
    viewer_column: string | null;
  }>(
    `select datatable, relation::regclass::text as table, viewer_column
       from viewer_cache.governing_table where workspace = $1 order by datatable, 2`,
    [workspace],
  );
  return rows.map((row) => ({
    datatable: row.datatable,
    table: row.table,
    viewerColumn: row.viewer_column,
  }));
}

async function relationOf(
  client: pg.ClientBase,
  table: string,
  datatable: string,
): Promise<{ oid: number; name: string }> {
  if (typeof table !== 'string' || table.length === 0 || table.length > 200) {
    throw new CatalogError('table must name a table (e.g. public.entitlements)', { datatable });
  }
  const { rows } = await client.query<{ oid: number; name: string; kind: string }>(
    `select c.oid, c.oid::regclass::text as name, c.relkind as kind
       from pg_catalog.pg_class c where c.oid = to_regclass($1)`,
    [table],
  );
  const row = rows[0];
  if (row === undefined || (row.kind !== 'r' && row.kind !== 'p')) {
    throw new CatalogError(`no table ${JSON.stringify(table)} in the catalog's database`, {
      datatable,
    });
  }
  return { oid: Number(row.oid), name: row.name };
}
