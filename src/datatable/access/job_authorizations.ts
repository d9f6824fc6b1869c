import { type EmbedViewer, embedViewerOf } from '../../embed_viewer.js';
import { canonicalRoleScope, type Job } from '../../job.js';
import type { CatalogSnapshot } from '../catalog/catalog_snapshot.js';
import type { CatalogState } from '../catalog/catalog_state.js';
import type { Directory, Principals } from '../catalog/directory.js';
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
  constructor(snapshot: CatalogSnapshot, directory: Directory | null) {
    this.#snapshot = snapshot;
    this.#directory = directory;
  }

  of(job: Job): JobAuthorization | Promise<JobAuthorization> {
    const state = this.#snapshot.freshState();
    if (state === undefined || this.#directory !== null) return this.#slow(job);
    if (state !== this.#memoState) {
      this.#memo.clear();
      this.#runnerParts = new Map();
      this.#memoState = state;
    }
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
    const state = await this.#snapshot.current();
    const directory = this.#directory;
    if (directory === null) return builtIn(state, job);
    const { workspace, perms } = job;
    const viewer = perms.endUserEmail;
    const [runnerPrincipals, viewerPrincipals] = await Promise.all([
      directory.principals(workspace, perms.email),
      viewer === null ? null : directory.principals(workspace, viewer),
    ]);
    return new JobAuthorization(state, {
      workspace,
      runner: { email: perms.email, principals: runnerPrincipals },
      viewer:
        viewer === null ? null : { email: viewer, principals: viewerPrincipals as Principals },
      roleScope: canonicalRoleScope(perms.roleScope),
      ...embedParty(job),
    });
  }
}

function builtIn(
  state: CatalogState,
  job: Job,
  runnerParts?: Map<string, string>,
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
