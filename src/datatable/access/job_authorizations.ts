import { type EmbedViewer, embedViewerOf } from '../../embed_viewer.js';
import { canonicalRoleScope, type Job } from '../../job.js';
import type { CatalogSnapshot } from '../catalog/catalog_snapshot.js';
import type { CatalogState } from '../catalog/catalog_state.js';
import type { Directory, Principals } from '../catalog/directory.js';
import type { RulesWatch } from '../catalog/rules_watch.js';
import { JobAuthorization } from './authorization.js';

/** Memo entries kept per catalog generation before the memo is cleared wholesale. */
const MAX_MEMO = 100_000;

/**
 * The {@link JobAuthorization} of a job, on a catalog state no older than the call (SPEC
 * invariant 10). Both the connection and the cache fingerprint (through run_dependencies.ts)
 * come from here, so they are always decided by the same rules on the same kind of state.
 *
 * With the built-in directory the answer comes from the in-memory catalog and is memoised per
 * state and (role scope, workspace, runner, viewer): a cache hit costs a Map lookup. A plugged-in directory
 * is asked on every call (its answers may change at any time).
 */
export class JobAuthorizations {
  readonly #snapshot: CatalogSnapshot;
  readonly #directory: Directory | null;
  #memoState: CatalogState | null = null;
  readonly #memo = new Map<string, JobAuthorization>();
  /** Fingerprint parts that depend on the runner alone, for the memoised state. */
  #runnerParts = new Map<string, string>();

  /** `directory` null means the built-in one (memberships in the catalog). */
  readonly #rules: Pick<RulesWatch, 'confirmed' | 'confirm'> | null;
  /** The confirmed databases the memo was built under, and whether they are all of the state's. */
  #memoConfirmed: ReadonlySet<string> | null = null;
  #memoAllConfirmed = true;

  /**
   * `directory` null means the built-in one (memberships in the catalog). `rules`: which
   * databases' rules versions are confirmed (null: take the catalog's as confirmed).
   */
  constructor(
    snapshot: CatalogSnapshot,
    directory: Directory | null,
    rules: Pick<RulesWatch, 'confirmed' | 'confirm'> | null = null,
  ) {
    this.#snapshot = snapshot;
    this.#directory = directory;
    this.#rules = rules;
  }

  of(job: Job): JobAuthorization | Promise<JobAuthorization> {
    const state = this.#snapshot.freshState();
    if (state === undefined || this.#directory !== null) return this.#slow(job);
    // Same object while nothing changes: the hit path compares identities, no I/O.
    const confirmed = this.#rules?.confirmed() ?? null;
    if (state !== this.#memoState || confirmed !== this.#memoConfirmed) {
      this.#memo.clear();
      this.#runnerParts = new Map();
      this.#memoState = state;
      this.#memoConfirmed = confirmed;
      this.#memoAllConfirmed = confirmed === null || allConfirmed(state, confirmed);
    }
    // A database's rules unconfirmed: confirm first (or, where that just failed, give the job
    // an authorization of its own, never memoised, whose answers there match no entry).
    if (!this.#memoAllConfirmed) return this.#slow(job);
    const { workspace, perms } = job;
    const viewer = perms.endUserEmail;
    const scope = canonicalRoleScope(perms.roleScope);
    // The role scope leads ('' unscoped, '=' + ids; no NUL in either): jobs of one runner and
    // viewer under two scopes must never share an authorization. Then '' for no viewer,
    // '=' + email, or '#' + app for an embed viewer (whose roles depend on its app alone): none
    // of the three can meet another.
    const who =
      viewer !== null ? `=${viewer}` : perms.embed !== undefined ? `#${perms.embed.app}` : '';
    const memoKey =
      `${scope === undefined ? '' : `=${scope.join(',')}`}\0` +
      `${workspace}\0${perms.email}\0${who}`;
    let authorization = this.#memo.get(memoKey);
    if (authorization === undefined) {
      authorization = builtIn(state, job, this.#runnerParts);
      if (this.#memo.size >= MAX_MEMO) this.#memo.clear();
      this.#memo.set(memoKey, authorization);
    }
    return authorization;
  }

  async #slow(job: Job): Promise<JobAuthorization> {
    let state = await this.#snapshot.current();
    if (this.#rules !== null) {
      await this.#rules.confirm(state);
      // A digest recorded by that check moved the catalog: read it as of now.
      state = await this.#snapshot.current();
    }
    const confirmed = this.#rules?.confirmed();
    const directory = this.#directory;
    if (directory === null) return builtIn(state, job, undefined, confirmed);
    const { workspace, perms } = job;
    const viewer = perms.endUserEmail;
    const [runnerPrincipals, viewerPrincipals] = await Promise.all([
      directory.principals(workspace, perms.email),
      viewer === null ? null : directory.principals(workspace, viewer),
    ]);
    return new JobAuthorization(
      state,
      {
        workspace,
        runner: { email: perms.email, principals: runnerPrincipals },
        viewer:
          viewer === null ? null : { email: viewer, principals: viewerPrincipals as Principals },
        roleScope: canonicalRoleScope(perms.roleScope),
        ...embedParty(job),
      },
      undefined,
      confirmed,
    );
  }
}

/** Whether the rules version of every data-table database of `state` is confirmed. */
function allConfirmed(state: CatalogState, confirmed: ReadonlySet<string>): boolean {
  for (const workspace of state.workspaces()) {
    for (const { database } of state.datatables(workspace))
      if (!confirmed.has(database)) return false;
  }
  return true;
}

function builtIn(
  state: CatalogState,
  job: Job,
  runnerParts?: Map<string, string>,
  confirmed?: ReadonlySet<string>,
): JobAuthorization {
  const { workspace, perms } = job;
  const viewer = perms.endUserEmail;
  return new JobAuthorization(
    state,
    {
      workspace,
      runner: { email: perms.email, principals: state.principals(workspace, perms.email) },
      viewer:
        viewer === null ? null : { email: viewer, principals: state.principals(workspace, viewer) },
      roleScope: canonicalRoleScope(perms.roleScope),
      ...embedParty(job),
    },
    runnerParts,
    confirmed,
  );
}

/**
 * The embed viewer as a party, checked; only when the job has no signed-in viewer. Only its app
 * goes in: the authorization is shared (memoised) by every embed viewer of that app, whose
 * attributes and email are the job's own (bound to the connection, and in the key).
 */
function embedParty(job: Job): { embed?: Pick<EmbedViewer, 'app'> } {
  const embed = embedViewerOf(job.perms);
  return embed === undefined ? {} : { embed: { app: embed.app } };
}
