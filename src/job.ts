import { randomUUID } from 'node:crypto';
import { canonicalEmbedViewer, type EmbedViewer, embedViewerOf } from './embed_viewer.js';
import { InvalidJobError } from './errors.js';
import type { JobResult } from './job_result.js';

/**
 * A workspace id: short, no path separators, safe in a cache key and a URL segment. As text for
 * JSON schemas (the reference server validates route params with it), and as a RegExp.
 */
export const WORKSPACE_PATTERN = '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$';
export const WORKSPACE_RE = new RegExp(WORKSPACE_PATTERN);

/** A runnable's identity: its path and the content version that produced a result. */
export interface RunnableRef {
  readonly path: string;
  /** Content version of the runnable; a new version never shares cache entries with the old. */
  readonly hash: string;
}

/** Who a job runs as, and who its result is for. */
export interface JobPerms {
  /** The identity the job runs *as*: its owner, or the app's publisher. */
  readonly email: string;
  /**
   * The viewer: who the result is *for*, recorded by the server from the run's origin with
   * {@link recordViewer}. `null` when nobody is signed in (public app, schedule, trigger, …).
   */
  readonly endUserEmail: string | null;
  /**
   * The role scope of the credential that started the run (a scoped API key), as catalog ids:
   * every data-table connection of the job — as the viewer, by role name, or the default role —
   * holds only roles in this list, so the run gets at most its principals' roles ∩ the scope.
   * Ids rather than names so that a rename keeps a key working and a role dropped and made
   * again under the same name is not picked up. Part of the cache key. Record it with
   * {@link recordRoleScope}, which a child job also goes through: a child is never wider.
   * `undefined`: unscoped. `[]` is not "unscoped": it grants no role at all (fail closed).
   */
  readonly roleScope?: readonly number[] | undefined;
  /**
   * An embed viewer (a host application's signed assertion, verified before the run), recorded
   * with {@link recordViewerIdentity}. When set, `endUserEmail` is `null`: an embed viewer is
   * never a signed-in user, whatever email its assertion carries, so code that knows nothing of
   * embeds treats the run as having no viewer (fail closed).
   */
  readonly embed?: EmbedViewer | undefined;
}

/** One run of a runnable. */
export interface Job {
  readonly id: string;
  /** Tenant boundary: keys, roles and jobs all belong to one workspace. */
  readonly workspace: string;
  readonly runnable: RunnableRef;
  /** Plain JSON data. Part of the cache key; never a source of identity. */
  readonly args: Readonly<Record<string, unknown>>;
  readonly perms: JobPerms;
  /** Cache the result for this many seconds. Absent or ≤ 0: never cached. */
  readonly cacheTtlS?: number | undefined;
}

/**
 * A job, as every job this library builds on a request's path is built: an instance of a class,
 * not an object literal, for the garbage collector's sake. V8 tracks the objects of each literal
 * (its allocation site), and once most of them outlive a young-generation collection it allocates
 * that literal's objects in the old generation from then on ("pretenuring"). A miss holds its job
 * for the whole run, so a job literal gets pretenured; every hit's job is then old from birth and,
 * through the remembered set, keeps what it points to (its id, perms, args) alive through each
 * young collection, to be copied and promoted, until the next full collection. Objects made by
 * `new` of a class have no allocation site and are never pretenured. Measured on a 1 KiB value
 * hit after misses (`createViewerCache(...).run`, 1 M hits, `node --trace-gc-nvp`, a process
 * per build, 3 interleaved pairs): with the literal ≈ 495 bytes promoted and ≈ 1.9 µs of
 * scavenging per hit, with the class 25 bytes and ≈ 0.3 µs — the hit itself 7.6–8.0 µs instead
 * of 10.3–10.5.
 */
export function newJob(
  id: string,
  workspace: string,
  path: string,
  hash: string,
  args: Readonly<Record<string, unknown>>,
  perms: JobPerms,
  cacheTtlS: number | undefined,
): Job {
  return new BuiltJob(id, workspace, new BuiltRunnable(path, hash), args, perms, cacheTtlS);
}

class BuiltJob implements Job {
  constructor(
    readonly id: string,
    readonly workspace: string,
    readonly runnable: RunnableRef,
    readonly args: Readonly<Record<string, unknown>>,
    readonly perms: JobPerms,
    readonly cacheTtlS: number | undefined,
  ) {}
}

/**
 * {@link newJob} with an id drawn on first read rather than at birth: a run answered from the
 * cache whose caller never reads `jobId` draws none. A random UUID is ≈ 0.2–0.3 µs here, which
 * is ≈ 3 % of a 1 KiB value hit through `createViewerCache(...).run` (a CPU profile of that hit).
 * Once read, the id never changes.
 */
export function newFreshJob(
  workspace: string,
  path: string,
  hash: string,
  args: Readonly<Record<string, unknown>>,
  perms: JobPerms,
  cacheTtlS: number | undefined,
): Job {
  return new FreshJob(workspace, new BuiltRunnable(path, hash), args, perms, cacheTtlS);
}

class FreshJob implements Job {
  #id: string | undefined;

  constructor(
    readonly workspace: string,
    readonly runnable: RunnableRef,
    readonly args: Readonly<Record<string, unknown>>,
    readonly perms: JobPerms,
    readonly cacheTtlS: number | undefined,
  ) {}

  get id(): string {
    this.#id ??= randomUUID();
    return this.#id;
  }
}

class BuiltRunnable implements RunnableRef {
  constructor(
    readonly path: string,
    readonly hash: string,
  ) {}
}

/** Where a run came from. Only the server builds these; nothing a caller types reaches them. */
export type RunOrigin =
  /** An app request. `session` is the signed-in user, `null` for an anonymous visitor. */
  | { readonly kind: 'app'; readonly session: { readonly email: string } | null }
  /** A direct run by a signed-in caller. */
  | { readonly kind: 'run'; readonly caller: { readonly email: string } }
  /** A preview (draft run) by a signed-in caller. */
  | { readonly kind: 'preview'; readonly caller: { readonly email: string } }
  /** A per-viewer embed link: a host application's assertion, verified by the server. */
  | { readonly kind: 'embed'; readonly viewer: EmbedViewer }
  /** A job started with another job's token: a child job or a flow step. */
  | {
      readonly kind: 'job-token';
      /**
       * The parent job: its perms (the child's viewer is the parent's), and, when the parent is
       * a queued job, its nesting depth (from its job token), so the child can be queued one
       * queue deeper than any slot its parent's chain holds.
       */
      readonly parent: { readonly perms: JobPerms; readonly depth?: number };
    }
  | { readonly kind: 'schedule' }
  /** Webhook, HTTP route, queue or other trigger. */
  | { readonly kind: 'trigger' }
  /** A tool job started by an AI-agent step. */
  | { readonly kind: 'agent-tool' }
  /**
   * One run of a job that runs once per recipient (a list of emails or a group's members): the
   * recipient is the viewer, and the result is delivered to them only.
   */
  | { readonly kind: 'recipient'; readonly recipient: { readonly email: string } };

/**
 * The viewer of a run, from its origin alone (SPEC invariant 1). Args, headers and anything else a
 * caller can type never reach it. Returns `null` when the run has no viewer.
 */
export function recordViewer(origin: RunOrigin): string | null {
  if (origin === null || typeof origin !== 'object') {
    throw new InvalidJobError('a run origin is required');
  }
  // Optional chaining below: a malformed origin (no session, caller or parent) fails closed
  // with E_INVALID_JOB rather than a TypeError; only an explicit `session: null` is anonymous.
  switch (origin.kind) {
    case 'app':
      return origin.session === null ? null : requireEmail(origin.session?.email);
    case 'run':
    case 'preview':
      return requireEmail(origin.caller?.email);
    case 'recipient':
      return requireEmail(origin.recipient?.email);
    case 'job-token': {
      // A child inherits its parent's *viewer*, never the parent's runner identity.
      const parentViewer = origin.parent?.perms?.endUserEmail;
      return parentViewer === null ? null : requireEmail(parentViewer);
    }
    case 'embed':
      // An embed viewer is not a signed-in user: see recordViewerIdentity.
      return null;
    case 'schedule':
    case 'trigger':
    case 'agent-tool':
      return null;
    default:
      // Unknown origin kinds fail closed rather than guessing a viewer.
      throw new InvalidJobError(
        `unknown run origin kind ${JSON.stringify((origin as { kind?: unknown }).kind)}`,
      );
  }
}

/**
 * The role scope of a run (see {@link JobPerms.roleScope}): the scope of the credential that
 * started it, intersected with the parent's scope for a job-token origin, so a child job is
 * never wider than its parent. Sorted, without duplicates, frozen; `undefined` when neither is
 * scoped.
 * @throws {InvalidJobError} when a scope is not an array of catalog ids.
 */
export function recordRoleScope(
  origin: RunOrigin,
  credential?: readonly number[],
): readonly number[] | undefined {
  const own = canonicalRoleScope(credential);
  const inherited =
    origin?.kind === 'job-token' ? canonicalRoleScope(origin.parent?.perms?.roleScope) : undefined;
  if (own === undefined && inherited === undefined) return undefined;
  // Always a frozen copy: a caller that later changes the array it passed cannot change a job.
  const ids = own === undefined ? inherited! : own.filter((id) => inherited?.includes(id) ?? true);
  return Object.freeze([...ids]);
}

/**
 * A role scope in its one canonical form (sorted ids, no duplicates), or `undefined` for none.
 * The cache key and the authorization memo both read it through here.
 * @throws {InvalidJobError} when it is not an array of catalog ids (positive 32-bit integers).
 */
export function canonicalRoleScope(scope: unknown): readonly number[] | undefined {
  if (scope === undefined) return undefined;
  if (
    !Array.isArray(scope) ||
    !scope.every((id) => Number.isInteger(id) && id > 0 && id <= 0xffffffff)
  ) {
    throw new InvalidJobError('job.perms.roleScope must be an array of role catalog ids');
  }
  const ids = scope as readonly number[];
  // Already canonical (strictly increasing, as recordRoleScope leaves it): no copy on the hit path.
  if (ids.every((id, i) => i === 0 || id > ids[i - 1]!)) return ids;
  return Object.freeze([...new Set(ids)].sort((a, b) => a - b));
}

/** The viewer of a run as the job carries it: `perms.endUserEmail`, and `perms.embed` if any. */
export interface ViewerIdentityOfRun {
  readonly endUserEmail: string | null;
  readonly embed?: EmbedViewer;
}

/**
 * {@link recordViewer}, plus the embed viewer of an `embed` origin (or of a job-token origin's
 * parent: a child inherits its parent's embed viewer like any viewer). The embed viewer is
 * checked and frozen here, so the cache key and the authorization read one canonical value.
 */
export function recordViewerIdentity(origin: RunOrigin): ViewerIdentityOfRun {
  const endUserEmail = recordViewer(origin);
  if (origin.kind === 'embed') return { endUserEmail, embed: canonicalEmbedViewer(origin.viewer) };
  if (origin.kind === 'job-token') {
    const embed = embedViewerOf({ endUserEmail, embed: origin.parent.perms.embed });
    if (embed !== undefined) return { endUserEmail, embed };
  }
  return { endUserEmail };
}

/**
 * A job's perms: who it runs as, its viewer and role scope, both recorded from its origin (the
 * scope never wider than a parent's or the credential's). Every job builder goes through here, so
 * no path can leave out the scope a job-token origin inherits.
 */
export function jobPerms(
  runAs: string,
  origin: RunOrigin,
  credentialScope?: readonly number[],
): JobPerms {
  // The common origins (an app, a run, a preview, a recipient; no credential scope) carry
  // neither an embed viewer nor a scope: their perms are built directly, with no object between.
  if (credentialScope === undefined && origin !== null && typeof origin === 'object') {
    const { kind } = origin;
    if (kind === 'app' || kind === 'run' || kind === 'preview' || kind === 'recipient')
      return { email: runAs, endUserEmail: recordViewer(origin) };
  }
  const viewer = recordViewerIdentity(origin);
  const roleScope = recordRoleScope(origin, credentialScope);
  return roleScope === undefined
    ? { email: runAs, ...viewer }
    : { email: runAs, ...viewer, roleScope };
}

/** A signed-in identity must be a non-empty string: an empty email is not "no viewer". */
function requireEmail(email: unknown): string {
  if (typeof email !== 'string' || email.length === 0) {
    throw new InvalidJobError('a signed-in origin must carry a non-empty email');
  }
  return email;
}

/** Options the wrapping layers pass down to the executor they wrap. */
export interface RunOptions {
  /**
   * The outermost executor, which child jobs must go through so that they are cached and
   * coalesced like any other run. Defaults to the executor itself.
   */
  readonly dispatcher?: JobExecutor;
  /**
   * An opaque name of the run's full cache key (workspace, runnable, args, viewer, fingerprint),
   * equal for runs that share an entry and never for runs that do not. Set by the result cache on
   * a miss; an executor that dispatches elsewhere (the job queue) coalesces by it.
   */
  readonly flight?: string;
  /**
   * The caller has just looked this run's key up and missed (a queue worker answering a
   * server's miss): a result cache executes at once, without reading its store again. The run
   * is still coalesced with identical ones in flight and its result stored as on any miss.
   * Not passed on to child runs.
   */
  readonly knownMiss?: boolean;
  /**
   * Hand the result back once its cache entry's write is sent, without waiting for the store to
   * acknowledge it (a queue worker: its answer travels to Redis after the write, so the round
   * trip it would wait for buys nothing). A write that fails is counted (`notStored`,
   * `store-failed`) exactly as when awaited and never fails the run; the next lookup then
   * misses. Not passed on to child runs.
   */
  readonly writeBehind?: boolean;
}

/** Anything that runs jobs: the platform's executor, or one wrapped in a cache. */
export interface JobExecutor {
  run(job: Job, options?: RunOptions): Promise<JobResult>;
}
