import type { DatatableLease } from '../../connector/datatable_connector.js';
import type { DatatableRef } from '../../connector/datatable_ref.js';
import {
  DuckdbRefusedError,
  DuckdbUnavailableError,
  ExecutorFailedError,
  ResultTooLargeError,
  ViewerCacheError,
} from '../../errors.js';
import type { DuckdbScript, DuckdbTable } from './duckdb_script.js';

/** The part of `@duckdb/node-api` a run uses (so a test can count instances it creates). */
export interface DuckdbModule {
  DuckDBInstance: {
    create(path: string, options: Record<string, string>): Promise<DuckdbInstanceLike>;
  };
}
/** A DuckDB instance, as a run uses it. */
export interface DuckdbInstanceLike {
  connect(): Promise<DuckdbConnectionLike>;
  closeSync(): void;
}
/** A connection to a DuckDB instance, as a run uses it. */
export interface DuckdbConnectionLike {
  run(sql: string): Promise<unknown>;
  runAndReadAll(sql: string): Promise<{ getRowObjectsJS(): Record<string, unknown>[] }>;
  createAppender(table: string, schema: string, catalog: string): Promise<DuckdbAppenderLike>;
  closeSync(): void;
}
/** A DuckDB appender, as a run copies rows in with it. */
export interface DuckdbAppenderLike {
  appendVarchar(value: string): void;
  appendNull(): void;
  endRow(): void;
  flushSync(): void;
  closeSync(): void;
}

/** Bounds of one DuckDB run, resolved by the executor. */
export interface DuckdbLimits {
  /** Rows copied in, over every table of the run. */
  readonly maxRows: number;
  /** Bytes copied in (the UTF-8 text of every value), over every table of the run. */
  readonly maxBytes: number;
  /** DuckDB's own `memory_limit`, e.g. `'256MB'`. */
  readonly memoryLimit: string;
  readonly load: () => Promise<DuckdbModule>;
}

/**
 * The locks the instance is created with and then frozen by `lock_configuration`: no file,
 * network or extension (the script reads only what was copied in), no way to lift them.
 */
const SANDBOX: Record<string, string> = {
  enable_external_access: 'false',
  autoload_known_extensions: 'false',
  autoinstall_known_extensions: 'false',
  allow_community_extensions: 'false',
  allow_unsigned_extensions: 'false',
  threads: '1',
};

/** Loads `@duckdb/node-api` once per process; its absence is a coded refusal, not a crash. */
let loaded: Promise<DuckdbModule> | undefined;
export function loadDuckdb(): Promise<DuckdbModule> {
  loaded ??= importDuckdb('@duckdb/node-api').catch((err: unknown) => {
    loaded = undefined; // installed later: the next run finds it
    throw err;
  });
  return loaded;
}

/** `import(specifier)` as a DuckDB module, or {@link DuckdbUnavailableError}. */
export async function importDuckdb(specifier: string): Promise<DuckdbModule> {
  try {
    return (await import(specifier)) as DuckdbModule;
  } catch (err) {
    throw new DuckdbUnavailableError(undefined, { cause: err });
  }
}

/**
 * Runs `script`: each named table read through its alias's lease (the viewer's connection, so
 * RLS and the identity apply) into a fresh in-memory DuckDB, typed as Postgres reports it;
 * then the locks, then the statements. The last statement's rows are the result.
 */
export async function runDuckdbScript(
  script: DuckdbScript,
  connect: (ref: DatatableRef) => Promise<DatatableLease>,
  limits: DuckdbLimits,
): Promise<unknown[]> {
  const leases = new Map<string, Promise<DatatableLease>>();
  const leaseOf = (alias: string) => {
    let lease = leases.get(alias);
    if (lease === undefined) {
      lease = connect(script.attachments.get(alias)!);
      leases.set(alias, lease);
    }
    return lease;
  };
  // Read everything first: no DuckDB instance exists while a refusal (E_NO_VIEWER, …) is possible.
  const budget = { rows: limits.maxRows, bytes: limits.maxBytes };
  const copies: Copy[] = [];
  for (const table of script.tables)
    copies.push(await readTable(await leaseOf(table.alias), table, budget));
  // An attached data table whose tables the script never names still asks for its connection:
  // the refusal (no viewer, no role) is the same as if it had read one.
  for (const alias of script.attachments.keys()) await leaseOf(alias);

  const duckdb = await limits.load();
  const instance = await duckdb.DuckDBInstance.create(':memory:', {
    ...SANDBOX,
    memory_limit: limits.memoryLimit,
  });
  try {
    const db = await instance.connect();
    try {
      for (const alias of script.attachments.keys())
        await db.run(`ATTACH ':memory:' AS ${q(alias)}`);
      const schemas = new Set<string>();
      for (const copy of copies) {
        const { alias, schema, table } = copy.table;
        if (!schemas.has(`${alias}.${schema}`)) {
          await db.run(`CREATE SCHEMA ${q(alias)}.${q(schema)}`);
          schemas.add(`${alias}.${schema}`);
        }
        const columns = copy.columns.map((c) => `${q(c.name)} ${c.type}`).join(', ');
        await db.run(`CREATE TABLE ${q(alias)}.${q(schema)}.${q(table)} (${columns})`);
        // The appender casts each value from the text Postgres sent to the column's type.
        const appender = await db.createAppender(table, schema, alias);
        try {
          for (const row of copy.rows) {
            for (const value of row) {
              if (value === null) appender.appendNull();
              else appender.appendVarchar(value);
            }
            appender.endRow();
          }
          appender.flushSync();
        } finally {
          appender.closeSync();
        }
      }
      await db.run('SET lock_configuration = true');
      let last: Record<string, unknown>[] = [];
      for (const statement of script.statements) {
        last = (await db.runAndReadAll(statement)).getRowObjectsJS();
      }
      return last.map(jsonRow);
    } catch (err) {
      throw duckdbError(err);
    } finally {
      db.closeSync();
    }
  } finally {
    instance.closeSync();
  }
}

interface Column {
  readonly name: string;
  readonly type: string;
}
interface Copy {
  readonly table: DuckdbTable;
  readonly columns: readonly Column[];
  readonly rows: readonly (string | null)[][];
}

interface ColumnRow {
  column_name: string;
  data_type: string;
  numeric_precision: number | null;
  numeric_scale: number | null;
}

/** The columns the viewer may read (information_schema shows only those), then their rows as text. */
async function readTable(
  lease: DatatableLease,
  table: DuckdbTable,
  budget: { rows: number; bytes: number },
): Promise<Copy> {
  const { rows: described } = await lease.query(
    `select column_name::text, data_type::text, numeric_precision::int, numeric_scale::int
       from information_schema.columns
      where table_schema = $1 and table_name = $2 order by ordinal_position`,
    [table.schema, table.table],
  );
  const relation = `${q(table.schema)}.${q(table.table)}`;
  if (described.length === 0) {
    // No such table, or nothing the viewer may read: let Postgres say which, in its own words.
    await lease.query(`select * from ${relation} limit 0`);
    throw new DuckdbRefusedError(`the viewer can read no column of ${table.schema}.${table.table}`);
  }
  const columns = (described as unknown as ColumnRow[]).map((c) => ({
    name: c.column_name,
    type: duckdbType(c),
  }));
  const select = columns.map((c) => `${q(c.name)}::text`).join(', ');
  const text = `select ${select} from ${relation} limit ${budget.rows + 1}`;
  // Through the query proxy (an agent) the copy asks for its own bound, the one in force here:
  // one row more than is left, so that the count past it is ours to refuse, as in process.
  const { rows } =
    lease.copy === undefined
      ? await lease.query(text)
      : await lease.copy(text, [], { maxRows: budget.rows + 1, maxBytes: budget.bytes });
  if (rows.length > budget.rows) throw tooLarge('rows');
  budget.rows -= rows.length;
  const names = columns.map((c) => c.name);
  const values: (string | null)[][] = [];
  for (const row of rows) {
    const out: (string | null)[] = [];
    for (const name of names) {
      const value = row[name] as string | null;
      if (value !== null) budget.bytes -= Buffer.byteLength(value);
      out.push(value);
    }
    if (budget.bytes < 0) throw tooLarge('bytes');
    values.push(out);
  }
  return { table, columns, rows: values };
}

/** Postgres type (as information_schema spells it) → DuckDB type; anything else is text. */
function duckdbType(column: ColumnRow): string {
  switch (column.data_type) {
    case 'smallint':
      return 'SMALLINT';
    case 'integer':
      return 'INTEGER';
    case 'bigint':
      return 'BIGINT';
    case 'real':
      return 'REAL';
    case 'double precision':
      return 'DOUBLE';
    case 'numeric': {
      const p = column.numeric_precision;
      return p !== null && p <= 38 ? `DECIMAL(${p}, ${column.numeric_scale ?? 0})` : 'DOUBLE';
    }
    case 'boolean':
      return 'BOOLEAN';
    case 'date':
      return 'DATE';
    case 'timestamp without time zone':
      return 'TIMESTAMP';
    case 'timestamp with time zone':
      return 'TIMESTAMPTZ';
    case 'time without time zone':
      return 'TIME';
    case 'uuid':
      return 'UUID';
    default:
      return 'VARCHAR';
  }
}

/** A DuckDB row as JSON carries it: BIGINT as a number when exact (else text), dates as ISO text. */
function jsonRow(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(row)) {
    if (typeof value === 'bigint')
      out[key] = Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
    else if (value instanceof Date) out[key] = value.toISOString();
    else out[key] = value;
  }
  return out;
}

/** DuckDB's own refusals (a file, a locked setting, an extension) keep a code of ours. */
function duckdbError(err: unknown): Error {
  if (err instanceof ViewerCacheError) return err;
  const message = err instanceof Error ? err.message : String(err);
  if (/^(Permission Error|Invalid Input Error: Cannot change configuration)/.test(message))
    return new DuckdbRefusedError(`DuckDB refused: ${firstLine(message)}`, { cause: err });
  return new ExecutorFailedError(`the DuckDB script failed: ${firstLine(message)}`, { cause: err });
}

const firstLine = (text: string) => text.split('\n', 1)[0]!;
const q = (name: string) => `"${name.replaceAll('"', '""')}"`;
const tooLarge = (what: string) =>
  new ResultTooLargeError(
    `the data tables this DuckDB script reads hold more ${what} than its bound (duckdb.maxRows / duckdb.maxBytes)`,
  );
