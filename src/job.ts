import { InvalidJobError } from './errors.js';

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

/**
 * A verified embed viewer: what the host signed, never the token itself. It holds no roles of
 * its own; it resolves only to roles whose tenants name embed viewers (`embed:*`, `embed:APP`).
 */
export interface EmbedViewer {
  /** The app the assertion's audience names. */
  readonly app: string;
  /** Signed attributes (`customer_id`, …) that policies read with `viewer_attribute(name)`. */
  readonly attributes: Readonly<Record<string, string>>;
  /** The email the host asserted, or `null`; never resolved as `user:EMAIL`. */
  readonly email: string | null;
}

/** Attribute names: SQL-friendly words, so a policy can name them without quoting. */
export const EMBED_ATTRIBUTE_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
/** App names (as the reference server's routes accept them). */
export const EMBED_APP_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;
/** Bounds of an embed viewer's attributes: how many, and how long each value may be. */
export const MAX_EMBED_ATTRIBUTES = 32;
export const MAX_EMBED_ATTRIBUTE_LENGTH = 1024;

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
  | { readonly kind: 'job-token'; readonly parent: { readonly perms: JobPerms } }
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
    const parentEmbed = origin.parent.perms.embed;
    if (parentEmbed !== undefined) {
      if (endUserEmail !== null) {
        throw new InvalidJobError('a job cannot have both a signed-in viewer and an embed viewer');
      }
      return { endUserEmail, embed: canonicalEmbedViewer(parentEmbed) };
    }
  }
  return { endUserEmail };
}

const frozenEmbeds = new WeakSet<EmbedViewer>();

/**
 * An embed viewer checked (app, attribute names and string values, email) and frozen with its
 * attributes in sorted order. Returns the same object when it already went through here.
 * @throws {InvalidJobError}
 */
export function canonicalEmbedViewer(viewer: unknown): EmbedViewer {
  if (frozenEmbeds.has(viewer as EmbedViewer)) return viewer as EmbedViewer;
  if (viewer === null || typeof viewer !== 'object') {
    throw new InvalidJobError('an embed viewer is required');
  }
  const { app, attributes, email } = viewer as Record<string, unknown>;
  if (typeof app !== 'string' || !EMBED_APP_RE.test(app)) {
    throw new InvalidJobError('an embed viewer must name its app');
  }
  if (email !== null && (typeof email !== 'string' || email.length === 0)) {
    throw new InvalidJobError('an embed viewer has a non-empty email or null');
  }
  if (
    attributes === null ||
    typeof attributes !== 'object' ||
    Array.isArray(attributes) ||
    (Object.getPrototypeOf(attributes) !== Object.prototype &&
      Object.getPrototypeOf(attributes) !== null)
  ) {
    throw new InvalidJobError('an embed viewer carries its attributes as an object');
  }
  const names = Object.keys(attributes).sort();
  if (names.length > MAX_EMBED_ATTRIBUTES) {
    throw new InvalidJobError(`an embed viewer has at most ${MAX_EMBED_ATTRIBUTES} attributes`);
  }
  const sorted: Record<string, string> = {};
  for (const name of names) {
    const value = (attributes as Record<string, unknown>)[name];
    // `__proto__` would be dropped by the assignment below: two viewers would read as one.
    if (!EMBED_ATTRIBUTE_NAME_RE.test(name) || name === '__proto__') {
      throw new InvalidJobError('an embed attribute name is a word of letters, digits and _');
    }
    if (typeof value !== 'string' || value.length > MAX_EMBED_ATTRIBUTE_LENGTH) {
      throw new InvalidJobError(
        `embed attribute values are strings of at most ${MAX_EMBED_ATTRIBUTE_LENGTH} characters`,
      );
    }
    sorted[name] = value;
  }
  const canonical: EmbedViewer = Object.freeze({
    app,
    attributes: Object.freeze(sorted),
    email: email as string | null,
  });
  frozenEmbeds.add(canonical);
  return canonical;
}

/** A signed-in identity must be a non-empty string: an empty email is not "no viewer". */
function requireEmail(email: unknown): string {
  if (typeof email !== 'string' || email.length === 0) {
    throw new InvalidJobError('a signed-in origin must carry a non-empty email');
  }
  return email;
}

/** What a job produced. */
export interface JobResult {
  /** The job that asked (on a hit: the current job, not the one that first computed it). */
  readonly jobId: string;
  /** The result value. On a cache hit it is parsed from the stored JSON on first access. */
  readonly value: unknown;
  /** True when served from the cache without executing. */
  readonly fromCache: boolean;
  /**
   * The result as UTF-8 JSON bytes. On a cache hit these are the stored bytes themselves, so a
   * caller that only forwards JSON never pays a parse or a stringify.
   */
  json(): Uint8Array;
}

/** Options the wrapping layers pass down to the executor they wrap. */
export interface RunOptions {
  /**
   * The outermost executor, which child jobs must go through so that they are cached and
   * coalesced like any other run. Defaults to the executor itself.
   */
  readonly dispatcher?: JobExecutor;
}

/** Anything that runs jobs: the platform's executor, or one wrapped in a cache. */
export interface JobExecutor {
  run(job: Job, options?: RunOptions): Promise<JobResult>;
}

/** A result computed now. The JSON bytes are produced once, on demand. */
export class ComputedResult implements JobResult {
  readonly fromCache = false;
  #json: Uint8Array | undefined;

  constructor(
    readonly jobId: string,
    readonly value: unknown,
  ) {}

  json(): Uint8Array {
    if (this.#json === undefined) {
      // `undefined` results are sent as JSON null rather than as an empty body.
      this.#json = Buffer.from(JSON.stringify(this.value) ?? 'null');
    }
    return this.#json;
  }

  /** Lets the cache hand over bytes it already serialised for storing. */
  static withJson(jobId: string, value: unknown, json: Uint8Array): ComputedResult {
    const result = new ComputedResult(jobId, value);
    result.#json = json;
    return result;
  }
}

/** A result read back from the cache: the bytes are authoritative, the value is parsed lazily. */
export class StoredResult implements JobResult {
  readonly fromCache = true;
  #value: unknown;
  #parsed = false;

  constructor(
    readonly jobId: string,
    readonly bytes: Uint8Array,
  ) {}

  get value(): unknown {
    if (!this.#parsed) {
      this.#value = JSON.parse(
        Buffer.from(this.bytes.buffer, this.bytes.byteOffset, this.bytes.byteLength).toString(
          'utf8',
        ),
      );
      this.#parsed = true;
    }
    return this.#value;
  }

  json(): Uint8Array {
    return this.bytes;
  }
}
