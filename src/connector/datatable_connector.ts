import type { Job } from '../job.js';
import type { DatatableRef } from './datatable_ref.js';

/** Rows of one statement. */
export interface DatatableQueryResult<Row = Record<string, unknown>> {
  rows: Row[];
  rowCount: number | null;
}

/**
 * What a runnable gets from `ctx.datatable(...)`: parameterised queries on a connection that
 * holds exactly the privileges asked for. It exposes no credentials and no way to reconnect.
 */
export interface DatatableClient {
  query<Row = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
  ): Promise<DatatableQueryResult<Row>>;
}

/**
 * The bound of one copy — the rows a DuckDB runnable reads into its in-memory database — over
 * every table of its run: rows, and bytes of the values' text (UTF-8).
 */
export interface CopyBound {
  readonly maxRows: number;
  readonly maxBytes: number;
}

/**
 * The documented default copy bound: `duckdb.maxRows` and `duckdb.maxBytes` in process, and the
 * query proxy's copy maximum (`copyMaxRows`, `copyMaxBytes`), so that a copy read through the
 * proxy (an agent worker) is bounded as it is in process.
 */
export const DEFAULT_COPY_BOUND: CopyBound = Object.freeze({
  maxRows: 100_000,
  maxBytes: 64 << 20,
});

/** A connection lent to one job; the executor releases it when the job ends. */
export interface DatatableLease {
  readonly client: DatatableClient;
  query(text: string, values?: readonly unknown[]): Promise<DatatableQueryResult>;
  /**
   * Reads the rows of a copy within `bound` rather than a per-statement limit. Only a lease
   * whose statements cross a bounded hop has it (the query proxy's client, which bounds each
   * statement at 10 000 rows otherwise); where it is absent `query` reads without a limit of
   * its own and the caller bounds what it keeps.
   */
  copy?(text: string, values: readonly unknown[], bound: CopyBound): Promise<DatatableQueryResult>;
  /**
   * Returns the connection: reset (what DISCARD ALL resets) and pooled, or closed when `destroy` is true
   * (a job that timed out mid-query) or the reset fails.
   */
  release(destroy: boolean): Promise<void>;
}

/**
 * The seam where data tables plug into the executor. It lives below both: the executor knows
 * only this interface and the reference grammar; the data-table layer implements it.
 */
export interface DatatableConnector {
  /**
   * Opens (or borrows from a pool) a connection for `job` as `ref` asks. Refuses, with an error
   * carrying a stable code, when the job may not have it — never falls back to a wider login.
   */
  connect(job: Job, ref: DatatableRef): Promise<DatatableLease>;
  /**
   * Whether the job's viewer holds data-table role `role` of data table `datatable` (a tenant
   * of it, enabled), on a catalog no older than the call. `false` when the run has no viewer.
   * Never opens a connection.
   */
  viewerHolds?(job: Job, datatable: string, role: string): Promise<boolean>;
  /**
   * Told when `job` starts `child`, before it is dispatched: the child's answers may come from
   * the cache, so the parent's result depends on whatever the child could use.
   */
  startedChild?(job: Job, child: Job): void;
  /**
   * True when every statement already runs behind another query proxy (an agent worker's
   * connector): that side bounds each one (`statement_timeout`) and resets its lease, so a
   * local proxy in front of it (a Python job's socket) sends the statement alone — one round
   * trip, not two. @default false
   */
  readonly proxied?: boolean;
}
