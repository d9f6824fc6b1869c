/*
 * proxy/ — the query proxy: data-table statements of a job that runs somewhere without database
 * credentials (an agent worker, a sandboxed Python or DuckDB process), run by the side that has
 * them, as the job's *recorded* viewer. Transport-free: the reference server puts it behind an
 * HTTP route, a local executor behind a unix socket; both hand it the same four things.
 */
import {
  type CopyBound,
  type DatatableConnector,
  type DatatableLease,
  type DatatableQueryResult,
  DEFAULT_COPY_BOUND,
} from '../connector/datatable_connector.js';
import {
  accessFromRoleName,
  type DatatableRef,
  datatableRefOf,
} from '../connector/datatable_ref.js';
import { type ByteSize, type Duration, resolveByteSize, resolveDuration } from '../duration.js';
import {
  AgentProtocolError,
  DatatableUnavailableError,
  InvalidDatatableRefError,
  JobTokenInvalidError,
  QueryTimeoutError,
  ResultTooLargeError,
  StatementRefusedError,
} from '../errors.js';
import type { Job } from '../job.js';
import { statementVerdict } from './statement_allowlist.js';
import { syntaxErrorOf } from './syntax_error.js';

/**
 * The version of the agent protocol this library speaks. A caller that sends none, or another,
 * is refused ({@link AgentProtocolError}): an agent that predates the viewer request could
 * have dropped it, and would otherwise be served as the default role.
 */
export const AGENT_PROTOCOL_VERSION = 1;

/**
 * A data-table reference as it travels: the data table's name and the access spelt as one role
 * name ({@link accessToRoleName}): `DATATABLE_VIEWER_ROLE` for the viewer, `@viewer:a,b` for the
 * viewer narrowed, a role's name, or null for the default role.
 */
export interface ProxiedReference {
  readonly datatable: string;
  readonly role: string | null;
}

/** One statement a job sends through the proxy. */
export interface ProxiedQuery {
  /** Must be {@link AGENT_PROTOCOL_VERSION}. */
  readonly protocol: unknown;
  /** The job's token, as the side that runs the job was given it; valid only while it runs. */
  readonly jobToken: string;
  readonly reference: ProxiedReference;
  readonly sql: string;
  readonly params?: readonly unknown[];
  /**
   * A copy's own bound (a DuckDB runnable on an agent reading a whole table, see
   * {@link DatatableLease.copy}): this statement may answer up to `maxRows` rows and `maxBytes`
   * bytes of value text — never more than the proxy's copy maximum — instead of the
   * per-statement `maxRows`/`maxBytes`. So the copy is bounded by the same `duckdb.maxRows` and
   * `duckdb.maxBytes` wherever the DuckDB runnable runs.
   */
  readonly copy?: CopyBound;
}

/**
 * Which running job a token stands for. The job (its perms, workspace, runnable) is the one the
 * server recorded when it started the run, never anything the caller sends; `null` once the job
 * has ended, for a token never issued, or for a job the caller may not act for.
 */
export interface RunningJobs {
  jobOfToken(token: string): Job | null | Promise<Job | null>;
}

export interface RawQueryProxyLimits {
  /** Most rows one statement may answer. @default 10000 */
  maxRows?: number;
  /** Most bytes of one statement's answer, as JSON. @default '8mb' */
  maxBytes?: ByteSize;
  /** Longest one statement may run (Postgres cancels it: statement_timeout). @default '30s' */
  timeout?: Duration;
  /**
   * Most rows a copy ({@link ProxiedQuery.copy}) may answer, whatever bound it asks for.
   * @default 100000 (DuckDB's own `duckdb.maxRows` default)
   */
  copyMaxRows?: number;
  /**
   * Most bytes of value text a copy may answer, whatever bound it asks for.
   * @default '64mb' (DuckDB's own `duckdb.maxBytes` default)
   */
  copyMaxBytes?: ByteSize;
}

export interface QueryProxyDeps {
  readonly jobs: RunningJobs;
  /** Where connections come from: the same connector an in-process executor would use. */
  readonly connector: DatatableConnector;
  readonly limits?: RawQueryProxyLimits;
}

/** A proxied statement's rows, and the same as the JSON text a transport sends on. */
export interface ProxiedQueryResult extends DatatableQueryResult {
  /** `{"rows":[…],"rowCount":n}`: serialised once, to measure it and to send it. */
  readonly json: string;
}

/** How much longer than `timeout` the proxy waits for Postgres to cancel before closing. */
const CANCEL_GRACE_MS = 1000;

/**
 * Runs one statement for the running job that `jobToken` stands for, as that job's recorded
 * viewer (or the role the reference names, by the same rules as in process): resolves the job,
 * leases a connection through the connector exactly as an in-process run would (identity
 * bound, released and reset after this one statement), and answers rows within the bounds.
 *
 * @throws {AgentProtocolError} no or another protocol version.
 * @throws {JobTokenInvalidError} no running job holds the token.
 * @throws {StatementRefusedError} anything but one statement of the kinds the proxy runs
 *   (statement_allowlist.ts): several statements, a role change, another kind.
 * @throws a pg `DatabaseError` with SQLSTATE 42601 for text Postgres's grammar cannot read, as
 *   Postgres itself would answer it, before any connection.
 * @throws {ResultTooLargeError} more rows or bytes than the limits (a copy: than its bound, or
 *   the copy maximum).
 * @throws {QueryTimeoutError} the statement ran past the time limit.
 * and whatever the connector refuses with (`E_NO_VIEWER`, `E_NO_ROLES`, …).
 */
export async function runProxiedQuery(
  query: ProxiedQuery,
  deps: QueryProxyDeps,
): Promise<ProxiedQueryResult> {
  if (query === null || typeof query !== 'object' || query.protocol !== AGENT_PROTOCOL_VERSION) {
    throw new AgentProtocolError();
  }
  const limits = resolveLimits(deps.limits);
  // Everything about the caller's request is checked before the token is looked up: a
  // malformed request costs no lookup, and a refusal says nothing about whether a token lives.
  const ref = referenceOf(query.reference);
  if (typeof query.sql !== 'string') throw new StatementRefusedError('sql must be a string');
  const verdict = await statementVerdict(query.sql);
  if (verdict !== null) {
    if ('syntaxError' in verdict) throw syntaxErrorOf(verdict);
    throw new StatementRefusedError(
      `${StatementRefusedError.defaultMessage} (${verdict.refusal}: ${verdict.node})`,
    );
  }
  const params = query.params ?? [];
  if (!Array.isArray(params)) throw new StatementRefusedError('params must be an array');
  const copy = copyBoundOf(query.copy, limits);

  const job =
    typeof query.jobToken === 'string' && query.jobToken.length > 0
      ? await deps.jobs.jobOfToken(query.jobToken)
      : null;
  if (job === null) throw new JobTokenInvalidError();

  const lease = await deps.connector.connect(job, ref);
  const ran = { destroy: false };
  try {
    // Postgres cancels the statement itself; the reset on release (RESET ALL) takes it back.
    // Behind another proxy (an agent's connector) each statement is a lease of its own there,
    // bounded by that proxy: a setting sent here would be reset before the statement ran.
    if (deps.connector.proxied !== true) {
      // standard_conforming_strings as the allowlist's parser read the text (a database could
      // default it off, and `'\''` would then end elsewhere).
      await lease.query(
        "select pg_catalog.set_config('statement_timeout', $1, false), pg_catalog.set_config('standard_conforming_strings', 'on', false)",
        [String(limits.timeoutMs)],
      );
    }
    return await boundedStatement(lease, query.sql, params, copy, limits, ran);
  } finally {
    // A statement still running past its bound: the connection is closed, never pooled.
    await lease.release(ran.destroy);
  }
}

/**
 * Runs one checked statement on `lease` within `limits` (its `statement_timeout` already set):
 * the rows within the row and byte bounds (a copy: within its own), as the JSON a transport
 * sends. A statement still running `CANCEL_GRACE_MS` past the time bound sets `ran.destroy`: the
 * connection must be closed, never pooled.
 *
 * @internal shared with proxy_transactions.ts.
 */
export async function boundedStatement(
  lease: DatatableLease,
  sql: string,
  params: readonly unknown[],
  copy: CopyBound | undefined,
  limits: ResolvedLimits,
  ran: { destroy: boolean },
): Promise<ProxiedQueryResult> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        ran.destroy = true;
        reject(new QueryTimeoutError());
      }, limits.timeoutMs + CANCEL_GRACE_MS);
    });
    let result: DatatableQueryResult;
    try {
      result = await Promise.race([lease.query(sql, params), late]);
    } catch (err) {
      if ((err as { code?: unknown }).code === '57014') throw new QueryTimeoutError();
      throw err;
    }
    if (copy !== undefined) checkCopy(result.rows, copy);
    else if (result.rows.length > limits.maxRows) {
      throw new ResultTooLargeError(
        `the statement answered more than ${limits.maxRows} rows, the query proxy's limit`,
      );
    }
    const json = JSON.stringify({ rows: result.rows, rowCount: result.rowCount });
    // Length in UTF-16 units bounds the bytes from below; exact bytes only when it is close.
    // (A copy's bytes are its values' text, measured above, as DuckDB's bound counts them.)
    if (
      copy === undefined &&
      (json.length > limits.maxBytes || Buffer.byteLength(json) > limits.maxBytes)
    ) {
      throw new ResultTooLargeError(
        `the statement's answer is larger than ${limits.maxBytes} bytes, the query proxy's limit`,
      );
    }
    return { rows: result.rows, rowCount: result.rowCount, json };
  } finally {
    clearTimeout(timer);
  }
}

/** A proxied `ctx.hasRole(datatable, role)`: whether the running job's recorded viewer holds it. */
export interface ProxiedRoleCheck {
  readonly protocol: unknown;
  readonly jobToken: string;
  readonly datatable: string;
  readonly role: string;
}

/**
 * Answers `ctx.hasRole` for a job that runs elsewhere, as the connector answers it in process
 * (never opens a connection; `false` when the run has no viewer).
 *
 * @throws {AgentProtocolError} @throws {JobTokenInvalidError} @throws {DatatableUnavailableError}
 *   when the connector cannot answer role questions.
 */
export async function runProxiedRoleCheck(
  check: ProxiedRoleCheck,
  deps: Pick<QueryProxyDeps, 'jobs' | 'connector'>,
): Promise<boolean> {
  if (check === null || typeof check !== 'object' || check.protocol !== AGENT_PROTOCOL_VERSION) {
    throw new AgentProtocolError();
  }
  // The same names a reference accepts.
  datatableRefOf(check.datatable, { role: check.role });
  const job =
    typeof check.jobToken === 'string' && check.jobToken.length > 0
      ? await deps.jobs.jobOfToken(check.jobToken)
      : null;
  if (job === null) throw new JobTokenInvalidError();
  if (deps.connector.viewerHolds === undefined) throw new DatatableUnavailableError();
  return deps.connector.viewerHolds(job, check.datatable, check.role);
}

/** The reference a proxied request names, by the rules `ctx.datatable` and SQL runnables use. */
export function referenceOf(reference: ProxiedReference): DatatableRef {
  if (reference === null || typeof reference !== 'object') {
    throw new InvalidDatatableRefError('reference must be { datatable, role }');
  }
  const { datatable, role } = reference;
  if (role !== null && typeof role !== 'string') {
    throw new InvalidDatatableRefError('reference.role must be a role name or null');
  }
  // The name by the reference grammar; the access from its one-role-name spelling.
  const { name } = datatableRefOf(datatable);
  return { name, access: accessFromRoleName(role) };
}

/** @internal */
export interface ResolvedLimits {
  readonly maxRows: number;
  readonly maxBytes: number;
  readonly timeoutMs: number;
  readonly copyMaxRows: number;
  readonly copyMaxBytes: number;
}

const DEFAULT_LIMITS: ResolvedLimits = Object.freeze({
  maxRows: 10_000,
  maxBytes: 8 << 20,
  timeoutMs: 30_000,
  copyMaxRows: DEFAULT_COPY_BOUND.maxRows,
  copyMaxBytes: DEFAULT_COPY_BOUND.maxBytes,
});

/** The bound a copy asked for, within the copy maximum; undefined for a plain statement. */
export function copyBoundOf(raw: unknown, limits: ResolvedLimits): CopyBound | undefined {
  if (raw === undefined || raw === null) return undefined;
  const { maxRows, maxBytes } = raw as Partial<CopyBound>;
  if (
    !Number.isSafeInteger(maxRows) ||
    maxRows! < 0 ||
    !Number.isSafeInteger(maxBytes) ||
    maxBytes! < 0
  ) {
    throw new StatementRefusedError('copy must be { maxRows, maxBytes }, non-negative integers');
  }
  return {
    maxRows: Math.min(maxRows!, limits.copyMaxRows),
    maxBytes: Math.min(maxBytes!, limits.copyMaxBytes),
  };
}

/**
 * A copy's rows within its bound: the count, then the UTF-8 bytes of every value's text (the
 * DuckDB copy reads every column as text), stopping at the first byte past the bound.
 */
function checkCopy(rows: readonly Record<string, unknown>[], bound: CopyBound): void {
  if (rows.length > bound.maxRows) {
    throw new ResultTooLargeError(
      `the copy holds more than ${bound.maxRows} rows: the bound it asked for (duckdb.maxRows) or the query proxy's copy maximum`,
    );
  }
  let bytes = 0;
  for (const row of rows) {
    for (const value of Object.values(row)) {
      if (value === null || value === undefined) continue;
      bytes += Buffer.byteLength(typeof value === 'string' ? value : JSON.stringify(value));
    }
    if (bytes > bound.maxBytes) {
      throw new ResultTooLargeError(
        `the copy holds more than ${bound.maxBytes} bytes: the bound it asked for (duckdb.maxBytes) or the query proxy's copy maximum`,
      );
    }
  }
}

/** @internal */
export function resolveLimits(raw: RawQueryProxyLimits | undefined): ResolvedLimits {
  if (raw === undefined) return DEFAULT_LIMITS;
  const maxRows = raw.maxRows ?? DEFAULT_LIMITS.maxRows;
  if (!Number.isInteger(maxRows) || maxRows < 0) {
    throw new TypeError('limits.maxRows must be a non-negative integer');
  }
  const timeoutMs =
    raw.timeout === undefined
      ? DEFAULT_LIMITS.timeoutMs
      : resolveDuration(raw.timeout, 'limits.timeout');
  // statement_timeout = 0 is "no limit" to Postgres: never what a bound means.
  if (timeoutMs < 1) throw new TypeError('limits.timeout must be at least 1 ms');
  const copyMaxRows = raw.copyMaxRows ?? DEFAULT_LIMITS.copyMaxRows;
  if (!Number.isSafeInteger(copyMaxRows) || copyMaxRows < 0) {
    throw new TypeError('limits.copyMaxRows must be a non-negative integer');
  }
  return {
    maxRows,
    maxBytes:
      raw.maxBytes === undefined
        ? DEFAULT_LIMITS.maxBytes
        : resolveByteSize(raw.maxBytes, 'limits.maxBytes'),
    timeoutMs,
    copyMaxRows,
    copyMaxBytes:
      raw.copyMaxBytes === undefined
        ? DEFAULT_LIMITS.copyMaxBytes
        : resolveByteSize(raw.copyMaxBytes, 'limits.copyMaxBytes'),
  };
}
