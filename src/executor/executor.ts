import { randomUUID } from 'node:crypto';
import {
  type DatatableConnector,
  type DatatableLease,
  DEFAULT_COPY_BOUND,
} from '../connector/datatable_connector.js';
import {
  type DatatableRef,
  type DatatableRequest,
  datatableRefOf,
  parseDatatableRef,
} from '../connector/datatable_ref.js';
import { type ByteSize, type Duration, resolveByteSize, resolveDuration } from '../duration.js';
import {
  coerceError,
  DatatableUnavailableError,
  ExecutorFailedError,
  ExecutorTimeoutError,
  InvalidJobError,
  ResultNotJsonError,
  RoleRequiredError,
  UnknownRunnableError,
  ViewerCacheError,
} from '../errors.js';
import {
  type Job,
  type JobExecutor,
  jobPerms,
  newJob,
  type RunOptions,
  type RunOrigin,
} from '../job.js';
import { ComputedResult, type JobResult } from '../job_result.js';
import { type Logger, silentLogger } from '../logger.js';
import type { RawQueryProxyLimits } from '../proxy/query_proxy.js';
import { traced } from '../tracing.js';
import { LazyAbort } from '../util/lazy_abort.js';
import {
  type DuckdbLimits,
  type DuckdbModule,
  loadDuckdb,
  runDuckdbScript,
} from './duckdb/duckdb_run.js';
import { type DuckdbScript, parseDuckdbScript } from './duckdb/duckdb_script.js';
import { type PythonLimits, runPython } from './python/python_run.js';
import { pythonCodeOf, type RunContext, type RunnableDefinition, versionOf } from './runnable.js';
import { statementRefusal } from './statement_refusal.js';

export type { DuckdbModule } from './duckdb/duckdb_run.js';
export type {
  DuckdbRunnable,
  PythonRunnable,
  RequiredRole,
  RunContext,
  RunnableDefinition,
  SqlRunnable,
  TsRunnable,
} from './runnable.js';
export type { DatatableRequest };

export interface RawExecutorOptions {
  /** Runnables by path. */
  runnables: Readonly<Record<string, RunnableDefinition>>;
  /** Where `ctx.datatable` and SQL runnables get connections. @default none (they are refused) */
  datatables?: DatatableConnector;
  /** Longest a job may run. @default '60s' */
  timeout?: Duration;
  /** @default silent */
  logger?: Logger;
  /** Job ids for child jobs and {@link Executor.createJob}. @default crypto.randomUUID */
  newJobId?: () => string;
  /** Issues `ctx.jobToken` when a job starts and revokes it when the job ends. @default none */
  jobTokens?: JobTokenIssuer;
  /** How Python runnables start (`kind: 'python'`). */
  python?: RawPythonOptions;
  /** Bounds of DuckDB runnables (`kind: 'duckdb'`). */
  duckdb?: RawDuckdbOptions;
}

export interface RawPythonOptions {
  /** The interpreter: a name looked up on PATH, or an absolute path. @default 'python3' */
  command?: string;
  /** Largest result a Python runnable may return. @default '16mb' */
  maxOutput?: ByteSize;
  /** Bounds of each statement it sends (rows, bytes, time). @default the query proxy's */
  queryLimits?: RawQueryProxyLimits;
}

export interface RawDuckdbOptions {
  /**
   * Rows a run may copy from its data tables, over all of them; the same bound on an agent
   * worker (the query proxy honours it up to its copy maximum, 100 000 by default).
   * @default 100_000
   */
  maxRows?: number;
  /** Bytes (text of the values) a run may copy from its data tables, as `maxRows`. @default '64mb' */
  maxBytes?: ByteSize;
  /** DuckDB's `memory_limit` for each run's instance. @default '256MB' */
  memoryLimit?: string;
  /** Where `@duckdb/node-api` comes from. @default import('@duckdb/node-api') */
  load?: () => Promise<DuckdbModule>;
}

/**
 * Where job tokens come from (a server that accepts them on a child-run route). Either side may
 * be asynchronous (tokens shared through a database): the token is issued before the job's code
 * runs and revoked before its result is handed back.
 */
export interface JobTokenIssuer {
  issue(job: Job): string | Promise<string>;
  revoke(job: Job): void | Promise<void>;
  /**
   * `issue` answers at once (a string, no I/O): the token is then issued on the runnable's
   * first read of `ctx.jobToken` — never after its job ended — and a job that never reads it
   * is neither issued a token nor revoked one. @default false (issued before the code runs)
   */
  readonly lazy?: boolean;
}

/** What a server knows when it starts a run. */
export interface JobRequest {
  workspace: string;
  path: string;
  args?: Record<string, unknown>;
  /** Who the job runs as (owner, publisher, or the caller of a direct run). */
  runAs: string;
  /** Where the run came from; decides the viewer through {@link recordViewer}. */
  origin: RunOrigin;
  /**
   * The role scope of the credential that started the run (a scoped API key), as catalog ids;
   * a job-token origin also narrows by its parent's scope (see {@link recordRoleScope}).
   * @default unscoped
   */
  roleScope?: readonly number[];
  /** @default the runnable's own `cacheTtlS` */
  cacheTtlS?: number;
  id?: string;
}

export interface Executor extends JobExecutor {
  /** Builds a job for a registered runnable, recording its viewer from the origin. */
  createJob(request: JobRequest): Job;
  /** The registered version of `path`, or undefined. */
  runnable(path: string): { path: string; hash: string; cacheTtlS?: number } | undefined;
}

interface Registered {
  readonly path: string;
  readonly hash: string;
  readonly definition: RunnableDefinition;
  /** A DuckDB runnable's script, read once. */
  readonly duckdb?: DuckdbScript;
  /** A Python runnable's code (its file read once). */
  readonly python?: string;
}

/**
 * The reference job executor: runs registered TypeScript and SQL runnables. Runnables receive a
 * private JSON copy of their args — exactly what the cache key saw — and data-table connections
 * that are released (and reset) when the job ends, however it ends.
 */
export function createExecutor(options: RawExecutorOptions): Executor {
  if (options === null || typeof options !== 'object') throw new TypeError('options are required');
  const { runnables, datatables } = options;
  if (runnables === null || typeof runnables !== 'object') {
    throw new TypeError('runnables must be an object of runnable definitions by path');
  }
  const registry = new Map<string, Registered>();
  for (const [path, definition] of Object.entries(runnables)) {
    const hash = versionOf(path, definition);
    registry.set(path, {
      path,
      hash,
      definition,
      ...(definition?.kind === 'duckdb' ? { duckdb: parseDuckdbScript(definition.sql) } : {}),
      ...(definition?.kind === 'python' ? { python: pythonCodeOf(path, definition) } : {}),
    });
  }
  const python: PythonLimits = {
    command: options.python?.command ?? 'python3',
    maxOutputBytes: resolveByteSize(options.python?.maxOutput ?? '16mb', 'python.maxOutput'),
    queryLimits: options.python?.queryLimits,
  };
  if (typeof python.command !== 'string' || python.command.length === 0)
    throw new TypeError('python.command must be a non-empty string');
  const duckdb: DuckdbLimits = {
    maxRows: options.duckdb?.maxRows ?? DEFAULT_COPY_BOUND.maxRows,
    maxBytes:
      options.duckdb?.maxBytes === undefined
        ? DEFAULT_COPY_BOUND.maxBytes
        : resolveByteSize(options.duckdb.maxBytes, 'duckdb.maxBytes'),
    memoryLimit: options.duckdb?.memoryLimit ?? '256MB',
    load: options.duckdb?.load ?? loadDuckdb,
  };
  if (!Number.isSafeInteger(duckdb.maxRows) || duckdb.maxRows < 0)
    throw new TypeError('duckdb.maxRows must be a non-negative integer');
  if (!/^[0-9]+(\.[0-9]+)?\s*[KMGT]i?B$/i.test(duckdb.memoryLimit))
    throw new TypeError("duckdb.memoryLimit is a size such as '256MB'");
  const timeoutMs = resolveDuration(options.timeout ?? '60s', 'timeout');
  const logger = options.logger ?? silentLogger;
  const newJobId = options.newJobId ?? randomUUID;

  const lookup = (path: string, hash?: string): Registered => {
    const found = registry.get(path);
    if (found === undefined)
      throw new UnknownRunnableError(`no runnable is registered at ${JSON.stringify(path)}`);
    if (hash !== undefined && found.hash !== hash) {
      throw new UnknownRunnableError(
        `runnable ${JSON.stringify(path)} has no version ${JSON.stringify(hash)}`,
      );
    }
    return found;
  };

  const executor: Executor = {
    runnable(path) {
      const found = registry.get(path);
      if (found === undefined) return undefined;
      const { cacheTtlS } = found.definition;
      return { path, hash: found.hash, ...(cacheTtlS === undefined ? {} : { cacheTtlS }) };
    },

    createJob(request) {
      const found = lookup(request.path);
      if (typeof request.runAs !== 'string' || request.runAs.length === 0) {
        throw new InvalidJobError('runAs must be the email the job runs as');
      }
      // Built by newJob, not as a literal: see there (a hit's job must die young).
      return newJob(
        request.id ?? newJobId(),
        request.workspace,
        found.path,
        found.hash,
        request.args ?? {},
        jobPerms(request.runAs, request.origin, request.roleScope),
        request.cacheTtlS ?? found.definition.cacheTtlS,
      );
    },

    async run(job: Job, runOptions?: RunOptions): Promise<JobResult> {
      const found = lookup(job.runnable.path, job.runnable.hash);
      const dispatcher = runOptions?.dispatcher ?? executor;
      const leases: DatatableLease[] = [];
      const state = { ended: false };
      const abort = new LazyAbort();
      let timer: NodeJS.Timeout | undefined;
      const started = performance.now();
      const issuer = options.jobTokens;
      let jobToken: string | null = null;
      let tokenIssued = false;
      let tokenClosed = false;
      // A lazy issuer's token exists once the runnable reads it, and never after the job ended.
      const tokenOf = (): string | null => {
        if (tokenIssued || issuer === undefined || state.ended || tokenClosed) return jobToken;
        tokenIssued = true;
        jobToken = issuer.issue(job) as string;
        return jobToken;
      };
      try {
        if (issuer !== undefined && issuer.lazy !== true) {
          jobToken = await issuer.issue(job);
          tokenIssued = true;
        }
        const work = runDefinition(found, job, {
          jobToken: tokenOf,
          dispatcher,
          leases,
          state,
          abort,
          datatables,
          python,
          duckdb,
          createChild: (path, args, cacheTtlS) => {
            const child = lookup(path);
            return newJob(
              newJobId(),
              job.workspace,
              child.path,
              child.hash,
              args,
              // The child runs as the parent's runner, for the parent's viewer, within the
              // parent's role scope (job-token origin).
              jobPerms(job.perms.email, { kind: 'job-token', parent: { perms: job.perms } }),
              cacheTtlS ?? child.definition.cacheTtlS,
            );
          },
        });
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            abort.abort();
            reject(new ExecutorTimeoutError(`the runnable did not finish within ${timeoutMs} ms`));
          }, timeoutMs);
        });
        const value = await Promise.race([work, timeout]);
        return jsonResult(job, value);
      } catch (thrown) {
        const err = coerceError(thrown);
        logger.debug(
          {
            jobId: job.id,
            path: job.runnable.path,
            code: (err as ViewerCacheError).code,
            ms: performance.now() - started,
          },
          'job failed',
        );
        // Refusals keep their own code (E_NO_VIEWER, …) so callers can tell them apart.
        if (err instanceof ViewerCacheError) throw err;
        const refused = statementRefusal(job, err);
        if (refused !== null) throw refused;
        throw new ExecutorFailedError(`runnable ${job.runnable.path} failed: ${err.message}`, {
          cause: err,
        });
      } finally {
        clearTimeout(timer);
        tokenClosed = true;
        if (tokenIssued) await Promise.resolve(issuer?.revoke(job)).catch(() => {});
        // From here on a connection that is still opening is released on arrival (see connect).
        state.ended = true;
        // A timed-out job may still hold a connection mid-query: destroy rather than reuse it.
        const destroy = abort.aborted;
        await Promise.allSettled(leases.map((lease) => lease.release(destroy)));
      }
    },
  };
  return executor;
}

/**
 * The result, serialised once here (the cache and the server need its bytes anyway, and the
 * bytes are kept): a value JSON cannot carry is the runnable's coded failure, naming it,
 * instead of an uncoded fault wherever the bytes are first asked for.
 */
function jsonResult(job: Job, value: unknown): ComputedResult {
  const result = new ComputedResult(job.id, value);
  try {
    result.json();
  } catch (err) {
    throw new ResultNotJsonError(
      `runnable ${job.runnable.path} returned a value that is not JSON (${(err as Error).name}: BigInt, a cycle, …): return plain JSON data`,
      { cause: err },
    );
  }
  return result;
}

interface RunDeps {
  /** The job's token (issued on first call when its issuer is lazy), or null. */
  jobToken: () => string | null;
  dispatcher: JobExecutor;
  leases: DatatableLease[];
  /** `ended` turns true once the job's leases have been released. */
  state: { ended: boolean };
  /** Aborted when the job times out; its signal is made only if the runnable asks. */
  abort: LazyAbort;
  datatables: DatatableConnector | undefined;
  python: PythonLimits;
  duckdb: DuckdbLimits;
  createChild(path: string, args: Record<string, unknown>, cacheTtlS: number | undefined): Job;
}

async function runDefinition(registered: Registered, job: Job, deps: RunDeps): Promise<unknown> {
  const { definition } = registered;
  const connect = async (ref: DatatableRef): Promise<DatatableLease> => {
    if (deps.datatables === undefined) throw new DatatableUnavailableError();
    if (deps.abort.aborted) throw new ExecutorTimeoutError();
    const lease = await deps.datatables.connect(job, ref);
    if (deps.state.ended) {
      // The job timed out (or returned without awaiting this) while the connection was opening:
      // its leases were already released, so nobody else would ever give this one back.
      await lease.release(deps.abort.aborted).catch(() => {});
      throw deps.abort.aborted
        ? new ExecutorTimeoutError()
        : new ExecutorFailedError('the job ended before its data-table connection opened');
    }
    deps.leases.push(lease);
    return lease;
  };
  const hasRole = async (datatable: string, role: string): Promise<boolean> => {
    const connector = deps.datatables;
    if (connector?.viewerHolds === undefined) throw new DatatableUnavailableError();
    datatableRefOf(datatable, { role }); // the same names a reference accepts
    return connector.viewerHolds(job, datatable, role);
  };
  const requireRole = async (datatable: string, role: string): Promise<void> => {
    if (!(await hasRole(datatable, role))) {
      throw new RoleRequiredError(undefined, { datatable, role });
    }
  };
  // Declared requirements are checked before any of the runnable's code runs.
  if (definition.requiresRole !== undefined) {
    await requireRole(definition.requiresRole.datatable, definition.requiresRole.role);
  }
  // The runnable sees a private copy made through JSON: exactly the data the key was built from.
  const args = JSON.parse(JSON.stringify(job.args)) as Record<string, unknown>;

  if (definition.kind === 'sql') {
    const lease = await connect(parseDatatableRef(definition.database));
    const values = (definition.params ?? []).map((name) => args[name] ?? null);
    const result = await lease.query(definition.sql, values);
    return result.rows;
  }

  if (definition.kind === 'duckdb') {
    return traced('viewer_cache.duckdb', () =>
      runDuckdbScript(registered.duckdb!, connect, deps.duckdb),
    );
  }
  if (definition.kind === 'python') {
    // The process reaches the data tables through its job's socket only, with its job's token.
    return traced('viewer_cache.python', () =>
      runPython(
        registered.python!,
        registered.path,
        job,
        args,
        deps.datatables,
        deps.abort.signal,
        deps.python,
      ),
    );
  }

  const ctx: RunContext = {
    jobId: job.id,
    workspace: job.workspace,
    viewer: job.perms.endUserEmail,
    get signal() {
      return deps.abort.signal;
    },
    get jobToken() {
      return deps.jobToken();
    },
    async runChild(path, childArgs = {}, childOptions) {
      const child = deps.createChild(path, childArgs, childOptions?.cacheTtlS);
      deps.datatables?.startedChild?.(job, child);
      const result = await deps.dispatcher.run(child);
      return result.value;
    },
    async datatable(name, request = {}) {
      return (await connect(datatableRefOf(name, request))).client;
    },
    hasRole,
    requireRole,
  };
  return definition.fn(args, ctx);
}
