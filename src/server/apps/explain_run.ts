import { createHash } from 'node:crypto';
import stringify from 'fast-json-stable-stringify';
import {
  type CachedExecutor,
  cachedResultPath,
  type Datatables,
  type Executor,
  type JobExplanation,
  type RunOrigin,
} from '../../index.js';
import type { Apps } from './apps.js';

/**
 * Why a run would be a hit or a miss, and as whom it would read: for a viewer, an app's runnable
 * and args, the viewer as the server records it, their roles per data table with the tenants that
 * name them, what the runnable version was seen to ask (and each question's roles and login), the
 * key's parts as digests, whether an entry exists now, and what would invalidate it. Never rows,
 * passwords or tokens.
 */
export interface RunExplanation {
  readonly viewer: {
    /** `perms.endUserEmail` as recorded from the origin; null: no viewer. */
    readonly recorded: string | null;
    readonly embed: { readonly app: string; readonly attributes: Record<string, string> } | null;
  };
  readonly runAs: string;
  readonly runnable: { readonly path: string; readonly hash: string };
  /** The viewer's roles, each with the tenants of it that name the viewer. */
  readonly roles: ReadonlyArray<{
    readonly datatable: string;
    readonly role: string;
    readonly namedBy: readonly string[];
  }>;
  readonly datatables: JobExplanation;
  /** The key's parts, as SHA-256 digests (hex). */
  readonly key: {
    readonly workspace: string;
    readonly path: string;
    readonly runnableHash: string;
    readonly argsDigest: string;
    readonly viewerDigest: string;
    readonly fingerprintDigest: string;
    readonly keyDigest: string;
  };
  readonly entry:
    | { readonly state: 'present'; readonly ageS: number | null; readonly ttlLeftS: number | null }
    | { readonly state: 'absent' | 'uncached' };
  /** The changes that would make the next run of this viewer miss. */
  readonly invalidatedBy: readonly string[];
}

/** What {@link explainRun} is asked. */
export interface ExplainRequest {
  readonly workspace: string;
  /** The app the runnable is run through (its publisher runs it). */
  readonly app: string;
  readonly path: string;
  readonly args?: Readonly<Record<string, unknown>>;
  readonly origin: RunOrigin;
  readonly roleScope?: readonly number[];
}

/**
 * Explains one run without running it (see {@link RunExplanation}).
 * @throws {TypeError} when the app does not exist or does not list the runnable.
 */
export async function explainRun(
  deps: { executor: Executor; cache: CachedExecutor; datatables: Datatables; apps: Apps },
  request: ExplainRequest,
  now = Date.now(),
): Promise<RunExplanation> {
  const app = Object.hasOwn(deps.apps, request.app) ? deps.apps[request.app] : undefined;
  if (app === undefined || !app.runnables.includes(request.path))
    throw new TypeError(`the app ${JSON.stringify(request.app)} does not run ${request.path}`);
  const args = { ...(request.args ?? {}) };
  const job = deps.executor.createJob({
    workspace: request.workspace,
    path: request.path,
    args,
    runAs: app.publisher,
    origin: request.origin,
    ...(request.roleScope ? { roleScope: request.roleScope } : {}),
  });
  const { perms } = job;
  const embed = perms.embed ?? null;
  const email = perms.endUserEmail ?? null;
  const tenants = new Set<string>();
  if (email !== null) {
    const principals = await deps.datatables.principals(request.workspace, email);
    for (const t of ['*', `user:${email}`]) tenants.add(t);
    for (const g of principals.groups) tenants.add(`group:${g}`);
    for (const f of principals.folders) tenants.add(`folder:${f}`);
  } else if (embed !== null) {
    for (const t of ['embed:*', `embed:${embed.app}`]) tenants.add(t);
  }
  const roles = (await deps.datatables.admin.listRoles(request.workspace))
    .filter((r) => r.enabled)
    .map((r) => ({
      datatable: r.datatable,
      role: r.name,
      namedBy: r.tenants.filter((t) => tenants.has(t)),
    }))
    .filter((r) => r.namedBy.length > 0);
  const explained = await deps.datatables.explain(job);
  const fingerprint = await deps.datatables.fingerprint(job);
  const peek = await deps.cache.peek(job);
  const entry: RunExplanation['entry'] =
    peek.state !== 'present'
      ? { state: peek.state }
      : {
          state: 'present',
          ttlLeftS:
            peek.expiresAt === null ? null : Math.max(0, Math.round((peek.expiresAt - now) / 1000)),
          ageS:
            peek.expiresAt === null
              ? null
              : Math.max(0, Math.round((peek.ttlMs - (peek.expiresAt - now)) / 1000)),
        };
  const governing = await deps.datatables.admin.listGoverningTables(request.workspace);
  const read = [
    ...new Set(
      explained.answers
        .map((a) => /^datatable:\/\/([^?]+)/.exec(a.question)?.[1])
        .filter((d): d is string => d !== undefined),
    ),
  ];
  const invalidatedBy = [
    `a new version of ${request.path} (its hash moves)`,
    ...(email === null
      ? []
      : [
          `a change to the groups or folders of the viewer, or to a tenant naming them, in ${read.join(', ') || 'any data table'}`,
        ]),
    ...read.map(
      (d) =>
        `a rule change in ${d}'s database (a policy, grant, row security, or a view or function they read)`,
    ),
    ...read.map((d) => `disabling, enabling, renaming or dropping a role of ${d}`),
    ...governing
      .filter((g) => read.includes(g.datatable))
      .map((g) => `a change to the rows of governing table ${g.table} (${g.datatable})`),
    'viewer-cache cache invalidate (this workspace or this path)',
    'the TTL running out',
  ];
  const digest = (value: unknown) => createHash('sha256').update(stringify(value)).digest('hex');
  return {
    viewer: {
      recorded: email,
      embed: embed === null ? null : { app: embed.app, attributes: { ...embed.attributes } },
    },
    runAs: app.publisher,
    runnable: { path: job.runnable.path, hash: job.runnable.hash },
    roles,
    datatables: explained,
    key: {
      workspace: request.workspace,
      path: request.path,
      runnableHash: job.runnable.hash,
      argsDigest: digest(args),
      viewerDigest: digest({ email, embed }),
      fingerprintDigest: explained.fingerprintDigest,
      keyDigest: createHash('sha256').update(cachedResultPath(job, fingerprint)).digest('hex'),
    },
    entry,
    invalidatedBy,
  };
}
