import type { Job } from '../job.js';
import type { CatalogSnapshot, CatalogState } from './catalog_snapshot.js';
import type { Directory, Principals } from './directory.js';
import { resolveRoles } from './resolve_roles.js';

/** Memo entries kept per catalog generation before the memo is cleared wholesale. */
const MAX_MEMO = 100_000;

/**
 * The authorization fingerprint of a job, used as the result cache's `fingerprint`:
 * the catalog's id and generation, the viewer's resolved role set, and what the runner
 * (`perms.email`) may use by name. Two runs share a cache entry only if all three agree, so a role or group
 * change applies on the viewer's next run, and a runner who may not use a role can never be
 * served a result computed with it.
 *
 * With the built-in directory it is computed from the in-memory catalog and memoised per
 * generation: a hit costs a Map lookup.
 */
export class Fingerprinter {
  readonly #snapshot: CatalogSnapshot;
  readonly #directory: Directory | null;
  #memoState: CatalogState | null = null;
  readonly #memo = new Map<string, string>();

  /** `directory` null means the built-in one (memberships in the catalog). */
  constructor(snapshot: CatalogSnapshot, directory: Directory | null) {
    this.#snapshot = snapshot;
    this.#directory = directory;
  }

  of(job: Job): string | Promise<string> {
    const state = this.#snapshot.freshState();
    if (state !== undefined && this.#directory === null) {
      if (state !== this.#memoState) {
        this.#memo.clear();
        this.#memoState = state;
      }
      const viewer = job.perms.endUserEmail;
      // '' for no viewer, '=' + email otherwise: the two can never meet.
      const memoKey = `${job.workspace}\0${job.perms.email}\0${viewer === null ? '' : `=${viewer}`}`;
      const known = this.#memo.get(memoKey);
      if (known !== undefined) return known;
      const fingerprint = this.#compute(state, job, (ws, email) => state.principals(ws, email));
      if (this.#memo.size >= MAX_MEMO) this.#memo.clear();
      this.#memo.set(memoKey, fingerprint);
      return fingerprint;
    }
    return this.#slow(job);
  }

  async #slow(job: Job): Promise<string> {
    const state = await this.#snapshot.current();
    const directory = this.#directory;
    if (directory === null)
      return this.#compute(state, job, (ws, email) => state.principals(ws, email));
    const { workspace, perms } = job;
    const [runner, viewer] = await Promise.all([
      directory.principals(workspace, perms.email),
      perms.endUserEmail === null ? null : directory.principals(workspace, perms.endUserEmail),
    ]);
    return this.#compute(state, job, (_ws, email) =>
      email === perms.email ? runner : (viewer as Principals),
    );
  }

  #compute(
    state: CatalogState,
    job: Job,
    principalsOf: (workspace: string, email: string) => Principals,
  ): string {
    const { workspace, perms } = job;
    const viewer = perms.endUserEmail;
    const viewerRoles =
      viewer === null
        ? '-'
        : resolveRoles(state, workspace, viewer, principalsOf(workspace, viewer))
            .map((role) => role.oid)
            .join(',');
    const runnerPrincipals = principalsOf(workspace, perms.email);
    const runnerRoles = resolveRoles(state, workspace, perms.email, runnerPrincipals)
      .map((role) => role.oid)
      .join(',');
    const admin = runnerPrincipals.isAdmin ? 1 : 0;
    return `c${state.catalogId};g${state.generation};v${viewerRoles};r${runnerRoles};a${admin}`;
  }
}
