import { randomUUID } from 'node:crypto';
import type { ResultCacheStats } from '../cache/cache_report.js';
import { type CachedExecutor, withResultCache } from '../cache/result_cache.js';
import type { RawSealOptions } from '../cache/result_cache_options.js';
import type { DatatableConnector } from '../connector/datatable_connector.js';
import type { FingerprintFn } from '../connector/fingerprint.js';
import { type Duration, resolveDuration } from '../duration.js';
import { InvalidJobError } from '../errors.js';
import { createExecutor, type Executor, type RunContext } from '../executor/executor.js';
import {
  type Job,
  type JobExecutor,
  jobPerms,
  newFreshJob,
  newJob,
  type RunOrigin,
} from '../job.js';
import { ComputedResult, type JobResult } from '../job_result.js';
import { type Logger, silentLogger } from '../logger.js';
import { MemoryCacheStore } from '../stores/memory_store.js';
import type { CacheStore, InvalidationScope } from '../stores/store.js';
import { checkKnownKeys } from '../util/known_keys.js';

/** One of your functions: args in, a JSON-serialisable result out. */
export type ViewerFunction = (
  args: Record<string, unknown>,
  /** The run: its viewer, `ctx.datatable(name, { as: 'viewer' })` when `datatables` is given, … */
  ctx: RunContext,
) => unknown;

/**
 * What a data-table layer gives the wrapper: connections for the job (`ctx.datatable`, or
 * `withDatatableClient` in your executor) and the authorization fingerprint for the key.
 * `createDatatables()` returns one.
 */
export interface ViewerCacheDatatables extends DatatableConnector {
  readonly fingerprint: FingerprintFn;
}

export interface RawViewerCacheOptions {
  /** Your functions by path. Give this or `executor`. */
  functions?: Readonly<Record<string, ViewerFunction>>;
  /**
   * Your own executor: a function of the {@link Job} resolving to the result value (the wrapper
   * derives the bytes), or a {@link JobExecutor}. `job.perms.endUserEmail` is the viewer;
   * `withDatatableClient(datatables, job, 'datatable://main?as=viewer', fn)` lends it their
   * connection. Give this or `functions`.
   */
  executor?: ((job: Job) => unknown) | JobExecutor;
  /**
   * TTL of a run that gives none. Without it such a run is not cached, and it is said: counted
   * in `untimedRuns` and warned once per path (`VIEWER_CACHE_NO_TTL`).
   * @default none
   */
  ttl?: Duration;
  /** @default new MemoryCacheStore() */
  store?: CacheStore;
  /**
   * The data-table layer (`createDatatables()`): your functions get `ctx.datatable`, and the key
   * carries the viewer's current roles, so a role change applies on their next run.
   * @default none (no data tables; the key carries the viewer only)
   */
  datatables?: ViewerCacheDatatables;
  /** Seal entries and key names (see `withResultCache`); use it on a shared store. @default unsealed */
  seal?: RawSealOptions;
  /** @default 'default' */
  workspace?: string;
  /** Who jobs run as (`job.perms.email`) when a run does not say. @default 'app' */
  runAs?: string;
  /** @default silent */
  logger?: Logger;
  /**
   * `'shared'`: a hit from process memory hands back the entry's one parsed value, deep-frozen
   * and shared by the hits of that same entry only (no parse per hit); `'cloned'`: a deep copy
   * of that value, a value of its own (a copy per hit, no parse); `'fresh'`: a value of its own,
   * parsed per hit. See `withResultCache`'s `values` and docs/memory-store.md.
   * @default 'fresh'
   */
  values?: 'fresh' | 'shared' | 'cloned';
}

/** One run: which function, with what, for whom (the origin), for how long. */
export interface ViewerRun {
  path: string;
  args?: Record<string, unknown>;
  /** Who is asking: the viewer is recorded from it alone (`recordViewer`). */
  origin: RunOrigin;
  /** @default the wrapper's `ttl` */
  ttl?: Duration;
  /** @default the wrapper's `workspace` */
  workspace?: string;
  /** @default the wrapper's `runAs` */
  runAs?: string;
  /**
   * With `executor`: the version of the code at `path`; a new version never shares entries
   * with the old. (With `functions` it is a hash of the function's source.) @default '1'
   */
  version?: string;
}

/** Your functions (or executor) behind a per-viewer result cache. */
export interface ViewerCache {
  /** Runs (or answers from the cache) for the origin's viewer. */
  run(run: ViewerRun): Promise<JobResult>;
  /** Runs that gave no TTL while the wrapper has none: not cached. */
  readonly untimedRuns: number;
  readonly stats: Readonly<ResultCacheStats>;
  /** The cached executor underneath (events, `inFlight`). */
  readonly cached: CachedExecutor;
  /** See `CachedExecutor.invalidate` (needs a two-tier store). */
  invalidate(scope: InvalidationScope): Promise<void>;
  /** Closes the store (a Redis store closes only a connection it opened itself). */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * The cache around *your* code in three concepts — the function, the origin (who asks), the
 * TTL: the wrapper builds the job, records the viewer from the origin, derives the bytes and
 * keys the entry (`withResultCache` underneath, with every guarantee it gives).
 */
const OPTION_KEYS = [
  'functions',
  'executor',
  'ttl',
  'store',
  'datatables',
  'seal',
  'workspace',
  'runAs',
  'logger',
  'values',
] as const satisfies readonly (keyof RawViewerCacheOptions)[];

/**
 * A `ttl` with its unit (`'60s'`, `'500ms'`, `'5m'`). A bare number is refused: a job's
 * `cacheTtlS` counts seconds and the library's other durations milliseconds, so `ttl: 60` could
 * mean a minute or 60 ms — it used to mean the latter, silently.
 */
function resolveTtl(ttl: Duration): number {
  if (typeof ttl === 'number' && ttl !== 0)
    throw new TypeError(
      `ttl must be a string with its unit, like '60s', '500ms' or '5m' (got the bare number ${ttl}: seconds or milliseconds?)`,
    );
  return resolveDuration(ttl, 'ttl');
}

export function createViewerCache(options: RawViewerCacheOptions): ViewerCache {
  if (options === null || typeof options !== 'object') throw new TypeError('options are required');
  checkKnownKeys(options, OPTION_KEYS, 'createViewerCache');
  const { functions, executor } = options;
  if ((functions === undefined) === (executor === undefined)) {
    throw new TypeError('give exactly one of functions (a map of async functions) or executor');
  }
  if (
    executor !== undefined &&
    typeof executor !== 'function' &&
    typeof (executor as Partial<JobExecutor>)?.run !== 'function'
  ) {
    throw new TypeError('executor must be a function (job) => result, or have a run(job) method');
  }
  const defaultTtlMs = options.ttl === undefined ? null : resolveTtl(options.ttl);
  const workspace = options.workspace ?? 'default';
  const runAs = options.runAs ?? 'app';
  const logger = options.logger ?? silentLogger;
  const inner: Executor | null =
    functions === undefined
      ? null
      : createExecutor({
          runnables: Object.fromEntries(
            Object.entries(functions).map(([path, fn]) => {
              if (typeof fn !== 'function')
                throw new TypeError(`functions[${path}] must be a function`);
              return [path, { fn }];
            }),
          ),
          ...(options.datatables === undefined ? {} : { datatables: options.datatables }),
          logger,
        });
  const store = options.store ?? new MemoryCacheStore();
  const cached = withResultCache(inner ?? asJobExecutor(executor!), {
    store,
    ...(options.datatables === undefined ? {} : { fingerprint: options.datatables.fingerprint }),
    ...(options.seal === undefined ? {} : { seal: options.seal }),
    ...(options.values === undefined ? {} : { values: options.values }),
    logger,
  });
  const warned = new Set<string>();
  let untimedRuns = 0;

  /** The TTL in seconds, or undefined (counted, warned once per path). */
  const ttlOf = (run: ViewerRun): number | undefined => {
    const ms = run.ttl === undefined ? defaultTtlMs : resolveTtl(run.ttl);
    if (ms !== null && ms > 0) return ms / 1000;
    untimedRuns++;
    if (!warned.has(run.path)) {
      warned.add(run.path);
      const message = `viewer-cache: runs of ${run.path} give no ttl and the cache has none: not cached (give ttl to the run or to createViewerCache)`;
      logger.warn({ path: run.path }, message);
      process.emitWarning(message, { code: 'VIEWER_CACHE_NO_TTL' });
    }
    return undefined;
  };

  /**
   * Each function's registered version, read once: a run of a known function builds its job
   * directly (no request object, no registry lookup per run); an unknown path goes through the
   * executor's `createJob`, which refuses it with its own error.
   */
  const versions = new Map<string, string>();
  if (inner !== null) {
    for (const path of Object.keys(functions!)) versions.set(path, inner.runnable(path)!.hash);
  }

  const jobOf = (run: ViewerRun): Job => {
    const cacheTtlS = ttlOf(run);
    const ws = run.workspace ?? workspace;
    const email = run.runAs ?? runAs;
    if (typeof email !== 'string' || email.length === 0) {
      // As the executor's createJob says it, for either branch (the executor one did not check).
      throw new InvalidJobError('runAs must be the email the job runs as');
    }
    const version = inner === null ? (run.version ?? '1') : versions.get(run.path);
    if (version === undefined) {
      return inner!.createJob({
        workspace: ws,
        path: run.path,
        args: run.args ?? {},
        runAs: email,
        origin: run.origin,
        ...(cacheTtlS === undefined ? {} : { cacheTtlS }),
      });
    }
    // jobPerms, as the executor's createJob: a child's origin passes its parent's role scope on.
    const perms = jobPerms(email, run.origin);
    const args = run.args ?? {};
    // An adopter's executor may spread, serialise or clone the job it is handed, so its id is an
    // own field. Our own executor reads the fields by name: there the id is drawn when first
    // read, and a hit whose caller never reads `jobId` draws none.
    return inner === null
      ? newJob(randomUUID(), ws, run.path, version, args, perms, cacheTtlS)
      : newFreshJob(ws, run.path, version, args, perms, cacheTtlS);
  };

  return {
    run: (run) => {
      // A run that cannot be made into a job is a rejection, as every other failure of run().
      let job: Job;
      try {
        job = jobOf(run);
      } catch (err) {
        return Promise.reject(err);
      }
      return cached.run(job);
    },
    get untimedRuns() {
      return untimedRuns;
    },
    stats: cached.stats,
    cached,
    invalidate: (scope) => cached.invalidate(scope),
    close: () => store.close?.() ?? Promise.resolve(),
    [Symbol.asyncDispose]: () => store.close?.() ?? Promise.resolve(),
  };
}

/** A function of the job becomes an executor whose result bytes are the value's JSON. */
function asJobExecutor(executor: ((job: Job) => unknown) | JobExecutor): JobExecutor {
  if (typeof executor !== 'function') return executor;
  return { run: async (job) => new ComputedResult(job.id, await executor(job)) };
}
