import type { Job } from '../job.js';
import { JobAuthorization } from './authorization.js';
import type { CatalogSnapshot } from './catalog_snapshot.js';
import type { CatalogState } from './catalog_state.js';
import type { Directory, Principals } from './directory.js';

/** Memo entries kept per catalog generation before the memo is cleared wholesale. */
const MAX_MEMO = 100_000;

/**
 * The {@link JobAuthorization} of a job, on a catalog state no older than the call (SPEC
 * invariant 10). Both the connection and the cache fingerprint (through run_dependencies.ts)
 * come from here, so they are always decided by the same rules on the same kind of state.
 *
 * With the built-in directory the answer comes from the in-memory catalog and is memoised per
 * state and (workspace, runner, viewer): a cache hit costs a Map lookup. A plugged-in directory
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
    // '' for no viewer, '=' + email otherwise: the two can never meet.
    const memoKey = `${workspace}\0${perms.email}\0${viewer === null ? '' : `=${viewer}`}`;
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
    },
    runnerParts,
  );
}
