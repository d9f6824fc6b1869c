import {
  cachedResultPath,
  createDatatables,
  createExecutor,
  type DatatableConnector,
  type Datatables,
  type Executor,
  formatDatatableRef,
  type JobExecutor,
  type Logger,
  lintDatatables,
  MemoryCacheStore,
  type RunOrigin,
  withResultCache,
} from '../../index.js';
import type { ServedApps } from '../apps/apps.js';
import { loadApps } from '../demo/demo_apps.js';
import { judge, type ObservedRunnable } from './audit_checks.js';
import { openAuditQueue } from './audit_queue.js';
import type { AuditReport, AuditStatus } from './audit_report.js';
import { freshRuns } from './fresh_runs.js';
import { type AuditRun, type RunOutcome, runOutcome } from './run_outcome.js';
import {
  type AuditViewer,
  deriveViewers,
  NO_VIEWERS,
  originOf,
  type ResolvedViewer,
  resolveViewers,
  viewerLabel,
} from './viewer_set.js';

/** Runs at a time within one per-recipient batch (the server's default). */
const BATCH_CONCURRENCY = 4;

/** What {@link runAudit} is given. */
export interface RawAuditOptions {
  /** The apps module's path, or `demo` (both demo worlds). */
  readonly apps: string;
  /** The catalog's database (a role that may read every data table's system catalogs). */
  readonly databaseUrl: string;
  /** The server's secret key: set logins' passwords derive from it. */
  readonly secretKey: string;
  /** The workspace audited. @default the apps module's `workspace` */
  readonly workspace?: string;
  /** The viewers; the nobody viewers are added when missing. @default derived from the catalog */
  readonly viewers?: readonly AuditViewer[];
  /** The environment the apps module (and each fresh process) sees. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** How long one viewer's fresh process may take. @default 120_000 */
  readonly freshTimeoutMs?: number;
  /**
   * Where the cached runs run: `in-process` (the executor under the audit's caches), or `queue`
   * (through a queue of the audit's own on Redis and a worker taking its jobs, as
   * `VIEWER_CACHE_EXECUTION=queue` runs them). @default 'in-process'
   */
  readonly execution?: 'in-process' | 'queue';
  /** The Redis the queue mode queues on. Required with `execution: 'queue'`. */
  readonly redisUrl?: string;
  /** Called as work advances: `done` of `total` steps. */
  readonly onProgress?: (done: number, total: number, what: string) => void;
  readonly logger?: Logger;
}

/**
 * Runs every audited runnable of the apps module as every viewer and lints every data table's
 * rules: the library function behind `viewer-cache audit`, for a user's own test suite.
 * Each viewer's own answer is computed with no cache in a fresh Node process; then every
 * runnable is run through a cache of the audit's own (in memory: never the production cache) in
 * viewer order, twice, and through another in reverse order; then as a per-recipient batch
 * (origin `recipient`, every signed-in user a recipient, four at a time) through a third. With
 * `execution: 'queue'` those cached runs go through a queue and a worker of the audit's own.
 * See audit_checks.ts for what is judged. Never writes to the production cache; runs only the runnables the module lists under
 * `audit.runnables`.
 * @throws {TypeError} naming a bad option.
 */
export async function runAudit(options: RawAuditOptions): Promise<AuditReport> {
  for (const name of ['apps', 'databaseUrl', 'secretKey'] as const)
    if (typeof options[name] !== 'string' || options[name] === '')
      throw new TypeError(`runAudit: ${name} must be a non-empty string`);
  const execution = options.execution ?? 'in-process';
  if (execution !== 'in-process' && execution !== 'queue')
    throw new TypeError("runAudit: execution must be 'in-process' or 'queue'");
  if (execution === 'queue' && (typeof options.redisUrl !== 'string' || options.redisUrl === ''))
    throw new TypeError('runAudit: redisUrl is required with execution: queue');
  const started = Date.now();
  const env = options.env ?? process.env;
  const apps = await loadApps(options.apps, {
    childRunUrl: () => {
      throw new TypeError('the audit starts no server: a child run over HTTP is not audited');
    },
    env,
  });
  const workspace = options.workspace ?? apps.workspace;
  if (workspace === null || workspace === undefined)
    throw new TypeError('runAudit: workspace is required (the apps module names none)');
  const datatables = await createDatatables({
    connection: options.databaseUrl,
    secretKey: options.secretKey,
    pools: { prepareAhead: false },
    ...(options.logger ? { logger: options.logger } : {}),
  });
  try {
    return await audit(options, apps, workspace, env, datatables, started);
  } finally {
    await datatables.close();
  }
}

async function audit(
  options: RawAuditOptions,
  apps: ServedApps,
  workspace: string,
  env: Readonly<Record<string, string | undefined>>,
  datatables: Datatables,
  started: number,
): Promise<AuditReport> {
  const lint = await lintDatatables({
    catalog: datatables.admin,
    workspace,
    connection: options.databaseUrl,
    intended: apps.audit.intended,
  });
  const viewers = await viewerSet(options.viewers, datatables, workspace, lint.readIdentity);
  const catalogRoles = await datatables.admin.listRoles(workspace);
  const scopeOf = (viewer: AuditViewer) =>
    viewer.kind === 'user' && viewer.roles
      ? catalogRoles.filter((r) => viewer.roles!.includes(r.name)).map((r) => r.oid)
      : undefined;

  // What each runnable asks of the data tables, seen at the connector (not guessed from code).
  const reads = new Map<string, Set<string>>();
  const observed: DatatableConnector = {
    connect(job, ref) {
      const seen = reads.get(job.runnable.path) ?? new Set();
      seen.add(formatDatatableRef(ref));
      reads.set(job.runnable.path, seen);
      return datatables.connect(job, ref);
    },
    viewerHolds: (job, datatable, role) => datatables.viewerHolds!(job, datatable, role),
    startedChild: (job, child) => datatables.startedChild!(job, child),
  };
  const executor = createExecutor({ runnables: apps.runnables, datatables: observed });
  const queue =
    options.execution === 'queue'
      ? await openAuditQueue({
          redisUrl: options.redisUrl!,
          secretKey: options.secretKey,
          workspace,
          registry: executor,
          // The worker side: its own executor, observed as the in-process one is.
          worker: createExecutor({ runnables: apps.runnables, datatables: observed }),
          datatables,
          ...(options.logger ? { logger: options.logger } : {}),
        })
      : null;
  try {
    // Jobs are built by the queue's side in queue mode (as a queue server builds them).
    const jobs: Executor = queue?.executor ?? executor;
    const paths = Object.keys(apps.audit.runnables).sort();
    const runsOf = (viewer: AuditViewer): AuditRun[] =>
      paths.map((path) => {
        const scope = scopeOf(viewer);
        return {
          workspace,
          path,
          args: apps.audit.runnables[path]!.args ?? {},
          runAs: runnerOf(apps, path, viewer),
          origin: originOf(viewer),
          ...(scope ? { roleScope: scope } : {}),
        };
      });

    const total = viewers.length * 2 + 1 + paths.length;
    let done = 0;
    const step = (what: string) => options.onProgress?.(++done, total, what);

    // Each viewer's own answers, in a fresh process each (two at a time).
    const fresh: RunOutcome[][] = new Array(viewers.length);
    let next = 0;
    const worker = async () => {
      while (next < viewers.length) {
        const i = next++;
        fresh[i] = await freshRuns(
          {
            appsSource: options.apps,
            env,
            databaseUrl: options.databaseUrl,
            secretKey: options.secretKey,
            runs: runsOf(viewers[i]!.viewer),
          },
          options.freshTimeoutMs ?? 120_000,
        );
        step(`fresh run as ${i + 1}/${viewers.length}`);
      }
    };
    await Promise.all([worker(), worker()]);

    // Through caches of the audit's own: viewer order, twice; then reverse order.
    const cacheOf = (): JobExecutor =>
      withResultCache(jobs, {
        store: queue?.passStore() ?? new MemoryCacheStore(),
        fingerprint: datatables.fingerprint,
      });
    const forward = cacheOf();
    const first: RunOutcome[][] = [];
    const second: RunOutcome[][] = [];
    const keys: (string | null)[][] = [];
    for (const [i, { viewer }] of viewers.entries()) {
      const runs = runsOf(viewer);
      first[i] = [];
      second[i] = [];
      keys[i] = [];
      for (const run of runs) first[i]!.push(await runOutcome(jobs, forward, run));
      for (const run of runs) second[i]!.push(await runOutcome(jobs, forward, run));
      for (const run of runs) keys[i]!.push(await keyOf(executor, datatables, run));
      step(`cached runs as ${i + 1}/${viewers.length}`);
    }
    const backward = cacheOf();
    const reverse: RunOutcome[][] = new Array(viewers.length);
    for (let i = viewers.length - 1; i >= 0; i--) {
      reverse[i] = [];
      for (const run of runsOf(viewers[i]!.viewer))
        reverse[i]!.push(await runOutcome(jobs, backward, run));
    }
    step('reverse order');

    // Per-recipient batches: every signed-in user a recipient, run concurrently as a batch is.
    const batchCache = cacheOf();
    const recipient: (RunOutcome | null)[][] = viewers.map(() => []);
    for (const [p, path] of paths.entries()) {
      const runs = viewers.map(({ viewer }, i) => {
        if (viewer.kind !== 'user' || viewer.roles !== undefined) return null;
        const run = runsOf(viewer)[p]!;
        const origin: RunOrigin = { kind: 'recipient', recipient: { email: viewer.email } };
        return { i, run: { ...run, origin } };
      });
      for (const [i] of viewers.entries()) recipient[i]![p] = null;
      const batch = runs.filter((r) => r !== null);
      let next = 0;
      const worker = async () => {
        while (next < batch.length) {
          const { i, run } = batch[next++]!;
          recipient[i]![p] = await runOutcome(jobs, batchCache, run);
        }
      };
      await Promise.all(Array.from({ length: BATCH_CONCURRENCY }, worker));
      step(`per-recipient batch of ${path}`);
    }

    const runnables: ObservedRunnable[] = paths.map((path, p) => {
      const refs = [...(reads.get(path) ?? [])].sort();
      const col = <T>(m: T[][]) => m.map((row) => row[p]!);
      return {
        path,
        spec: apps.audit.runnables[path]!,
        inPrivateApp: Object.values(apps.apps).some((a) => !a.public && a.runnables.includes(path)),
        cached: (executor.runnable(path)?.cacheTtlS ?? 0) > 0,
        datatables: [...new Set(refs.map((ref) => new URL(ref).host))],
        notAsViewer: refs.filter((ref) => !ref.includes('as=viewer')),
        fresh: col(fresh),
        first: col(first),
        second: col(second),
        reverse: col(reverse),
        recipient: col(recipient),
        keys: col(keys),
      };
    });
    const { cells, findings } = judge(viewers, runnables);
    const lintFails = lint.findings.filter((f) => f.status === 'fail').length;
    // Varies-by-viewer is about a runnable, not a cell; the other findings are also on cells.
    const across = (status: AuditStatus) =>
      findings.filter((f) => f.check === 'varies-by-viewer' && f.status === status).length;
    const summary = {
      pass: cells.filter((c) => c.status === 'pass').length,
      warn: cells.filter((c) => c.status === 'warn').length + across('warn'),
      fail: cells.filter((c) => c.status === 'fail').length + across('fail') + lintFails,
      intended: lint.findings.length - lintFails,
    };
    const status: AuditStatus = summary.fail > 0 ? 'fail' : summary.warn > 0 ? 'warn' : 'pass';
    return {
      apps: options.apps,
      workspace,
      startedAt: new Date(started).toISOString(),
      durationMs: Date.now() - started,
      viewers: viewers.map(({ viewer, roles }) => ({
        label: viewerLabel(viewer),
        kind: viewer.kind,
        roles,
      })),
      runnables: runnables.map((r) => ({
        path: r.path,
        apps: Object.entries(apps.apps)
          .filter(([, a]) => a.runnables.includes(r.path))
          .map(([name]) => name),
        public: !r.inPrivateApp,
        reads: [...(reads.get(r.path) ?? [])].sort(),
      })),
      cells,
      findings,
      lints: lint.findings,
      summary,
      status,
      execution: queue === null ? 'in-process' : 'queue',
      ...(queue === null ? {} : { workerJobs: queue.taken() }),
    };
  } finally {
    await queue?.close();
  }
}

/** The viewers given (the nobody viewers added when missing), or derived from the catalog. */
async function viewerSet(
  given: readonly AuditViewer[] | undefined,
  datatables: Datatables,
  workspace: string,
  readIdentity: readonly string[],
): Promise<ResolvedViewer[]> {
  if (given === undefined) return deriveViewers(datatables, workspace, readIdentity.length > 0);
  const all = [...given, ...NO_VIEWERS.filter((n) => !given.some((v) => v.kind === n.kind))];
  return resolveViewers(datatables, workspace, all);
}

/**
 * Who a runnable's audited runs run as: its app's publisher (else its schedule's owner); the
 * schedule viewer's runs, as its schedule's owner when it has one (as the scheduler runs it).
 */
function runnerOf(apps: ServedApps, path: string, viewer: AuditViewer): string {
  const scheduled = apps.schedules.find((s) => s.path === path && s.recipients === undefined);
  if (viewer.kind === 'schedule' && scheduled !== undefined) return scheduled.owner;
  const app = Object.values(apps.apps).find((a) => a.runnables.includes(path));
  const owner = app?.publisher ?? apps.schedules.find((s) => s.path === path)?.owner;
  if (owner === undefined)
    throw new TypeError(`audit.runnables: ${path} is in no app and no schedule: nobody runs it`);
  return owner;
}

/** The key a run's entry has (null when its fingerprint is refused: no entry can exist). */
async function keyOf(
  executor: ReturnType<typeof createExecutor>,
  datatables: Datatables,
  run: AuditRun,
): Promise<string | null> {
  try {
    const job = executor.createJob({
      workspace: run.workspace,
      path: run.path,
      args: { ...run.args },
      runAs: run.runAs,
      origin: run.origin,
      ...(run.roleScope ? { roleScope: run.roleScope } : {}),
    });
    return cachedResultPath(job, await datatables.fingerprint(job));
  } catch {
    return null;
  }
}
