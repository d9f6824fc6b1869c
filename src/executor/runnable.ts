import { hash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { DatatableClient } from '../connector/datatable_connector.js';
import {
  type DatatableRequest,
  datatableRefOf,
  parseDatatableRef,
} from '../connector/datatable_ref.js';
import { InvalidDatatableRefError } from '../errors.js';
import { parseDuckdbScript } from './duckdb/duckdb_script.js';

/** What a TypeScript runnable receives beside its args. */
export interface RunContext {
  readonly jobId: string;
  readonly workspace: string;
  /**
   * The recorded viewer (`perms.endUserEmail`), `null` when the run has none — and for an embed
   * viewer (`perms.embed`), who is never a signed-in user; policies read its signed attributes.
   */
  readonly viewer: string | null;
  /** Aborted when the job times out; pass it to anything long-running. */
  readonly signal: AbortSignal;
  /**
   * A token that starts child jobs through a server's API as this job (a job-token origin), when
   * the executor was given {@link RawExecutorOptions.jobTokens}; valid only while the job runs.
   */
  readonly jobToken: string | null;
  /**
   * Runs another registered runnable as a child job: it runs as this job's runner, for this
   * job's viewer (a job-token origin), and goes through the same cache.
   * @returns the child's result value.
   */
  runChild(
    path: string,
    args?: Record<string, unknown>,
    options?: { cacheTtlS?: number },
  ): Promise<unknown>;
  /**
   * A connection to data table `name`, lent for the rest of this job: `{ as: 'viewer' }` holds
   * exactly the viewer's roles, `{ role }` one named role, `{}` the data table's default role.
   * `{ as: 'viewer', roles: ['provider'] }` narrows the viewer's connection to those of their
   * roles that it names (the viewer's identity still bound): only those roles' privileges and
   * policies apply, the runnable cannot widen back (`SET ROLE`, `RESET ROLE`), a viewer holding
   * none of them is refused with `E_ROLE_REQUIRED` before any query, and a name that is no role
   * of the data table with `E_UNKNOWN_ROLE`. The same as `datatable://NAME?as=viewer&roles=…`.
   */
  datatable(name: string, request?: DatatableRequest): Promise<DatatableClient>;
  /**
   * Whether the viewer holds data-table role `role` of data table `datatable` (aggregate-only
   * runnables check this before computing anything). `false` when the run has no viewer. An
   * embed viewer holds no roles of their own: true only for roles with an `embed:` tenant.
   */
  hasRole(datatable: string, role: string): Promise<boolean>;
  /**
   * Refuses the run with `E_ROLE_REQUIRED` unless the viewer holds the role. A refusal is an
   * error, so it is never cached.
   */
  requireRole(datatable: string, role: string): Promise<void>;
}

/** A data-table role a runnable requires of its viewer, checked before any of its code runs. */
export interface RequiredRole {
  readonly datatable: string;
  readonly role: string;
}

/** A runnable written in TypeScript. */
export interface TsRunnable {
  readonly kind?: 'ts';
  readonly fn: (args: Record<string, unknown>, ctx: RunContext) => unknown;
  /** Content version; defaults to a hash of the function's source. */
  readonly hash?: string;
  /** Default cache TTL of jobs created for it with {@link Executor.createJob}. */
  readonly cacheTtlS?: number;
  /** Refuse (`E_ROLE_REQUIRED`) before running unless the viewer holds this role. */
  readonly requiresRole?: RequiredRole;
}

/** A SQL script whose `database` argument is a data-table reference. Its result is the rows. */
export interface SqlRunnable {
  readonly kind: 'sql';
  /** e.g. `datatable://main?as=viewer`, or `datatable://main?as=viewer&roles=provider`. */
  readonly database: string;
  /** One statement, with `$1…$n` placeholders. */
  readonly sql: string;
  /** The arg names bound to `$1…$n`, in order. @default [] */
  readonly params?: readonly string[];
  /** Content version; defaults to a hash of database, sql and params. */
  readonly hash?: string;
  readonly cacheTtlS?: number;
  /** Refuse (`E_ROLE_REQUIRED`) before running unless the viewer holds this role. */
  readonly requiresRole?: RequiredRole;
}

/**
 * A DuckDB script run as the viewer: `ATTACH 'datatable://NAME?as=viewer' AS dt` (or `?role=R`,
 * `&roles=…`), then queries reading `dt.schema.table`. Each table the script names is read through
 * that reference's connection (RLS and the identity apply) into an in-memory DuckDB with no file,
 * network or extension access and its configuration locked; the last statement's rows are the
 * result. Needs the optional peer `@duckdb/node-api`.
 */
export interface DuckdbRunnable {
  readonly kind: 'duckdb';
  readonly sql: string;
  /** Content version; defaults to a hash of the script. */
  readonly hash?: string;
  readonly cacheTtlS?: number;
  /** Refuse (`E_ROLE_REQUIRED`) before running unless the viewer holds this role. */
  readonly requiresRole?: RequiredRole;
}

/**
 * Python run as `main(**args)` in a `python3 -I` subprocess; `from viewer_cache import datatable`
 * gives `datatable(name, as_viewer=True)` / `datatable(name, role=R)` with `.query(sql, *params)`.
 * Give `code`, or `file` (read once, when the executor is created).
 */
export type PythonRunnable = {
  readonly kind: 'python';
  /** Content version; defaults to a hash of the code. */
  readonly hash?: string;
  readonly cacheTtlS?: number;
  /** Refuse (`E_ROLE_REQUIRED`) before running unless the viewer holds this role. */
  readonly requiresRole?: RequiredRole;
} & (
  | { readonly code: string; readonly file?: never }
  | { readonly file: string; readonly code?: never }
);

export type RunnableDefinition = TsRunnable | SqlRunnable | DuckdbRunnable | PythonRunnable;

export function versionOf(path: string, definition: RunnableDefinition): string {
  if (definition === null || typeof definition !== 'object') {
    throw new TypeError(`runnable ${path} must be an object`);
  }
  const required = definition.requiresRole;
  if (required !== undefined) {
    if (typeof required?.datatable !== 'string' || typeof required.role !== 'string') {
      throw new TypeError(`runnable ${path}: requiresRole is { datatable, role }`);
    }
    datatableRefOf(required.datatable, { role: required.role }); // same grammar as a reference
  }
  if (definition.hash !== undefined) {
    if (typeof definition.hash !== 'string' || definition.hash.length === 0) {
      throw new TypeError(`runnable ${path}: hash must be a non-empty string`);
    }
    return definition.hash;
  }
  if (definition.kind === 'sql') {
    if (typeof definition.sql !== 'string' || typeof definition.database !== 'string') {
      throw new TypeError(`runnable ${path}: a SQL runnable needs sql and database strings`);
    }
    // Refuse a bad reference at registration, not at run, naming the runnable that has it.
    try {
      parseDatatableRef(definition.database);
    } catch (err) {
      if (err instanceof InvalidDatatableRefError)
        throw new InvalidDatatableRefError(`runnable ${path}: ${err.message}`, { cause: err });
      throw err;
    }
    return hash(
      'sha256',
      JSON.stringify([definition.database, definition.sql, definition.params ?? []]),
      'hex',
    ).slice(0, 16);
  }
  if (definition.kind === 'duckdb') {
    if (typeof definition.sql !== 'string')
      throw new TypeError(`runnable ${path}: a DuckDB runnable needs an sql string`);
    parseDuckdbScript(definition.sql); // refuse an escape or a bad reference at registration
    return hash('sha256', JSON.stringify(['duckdb', definition.sql]), 'hex').slice(0, 16);
  }
  if (definition.kind === 'python') {
    return hash('sha256', JSON.stringify(['python', pythonCodeOf(path, definition)]), 'hex').slice(
      0,
      16,
    );
  }
  if (typeof definition.fn !== 'function')
    throw new TypeError(`runnable ${path} needs fn or kind: 'sql'`);
  return hash('sha256', definition.fn.toString(), 'hex').slice(0, 16);
}

/** A Python runnable's code: given, or read from its file (once, at registration). */
export function pythonCodeOf(path: string, definition: PythonRunnable): string {
  const { code, file } = definition as { code?: unknown; file?: unknown };
  if ((code === undefined) === (file === undefined))
    throw new TypeError(`runnable ${path}: a Python runnable needs exactly one of code or file`);
  if (typeof code === 'string') return code;
  if (typeof file !== 'string') throw new TypeError(`runnable ${path}: file must be a path`);
  return readFileSync(file, 'utf8');
}
