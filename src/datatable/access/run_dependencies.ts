import type { DatatableRef } from '../../connector/datatable_ref.js';
import type { FingerprintTracking } from '../../connector/fingerprint.js';
import type { Job } from '../../job.js';
import { isThenable } from '../../util/thenable.js';
import type { JobAuthorization } from './authorization.js';
import {
  type Dependency,
  type DependencySet,
  EVERY_REFERENCE,
  holdsDependency,
  refDependency,
} from './dependency.js';

/**
 * What a run's result depends on, and the fingerprint computed over exactly that (SPEC
 * invariants 10 and 17).
 *
 * A run depends on the catalog only through what it asks the connector: each data-table
 * reference it makes (granted or refused) and each role check (`ctx.hasRole`). Its entry is keyed
 * by the outcome of those questions alone, so a change that answers none of them differently
 * leaves the entry alone: a runnable that never leases survives every role change, and one that
 * reads data table A survives a change to B.
 *
 * The key is computed before the run, so the questions are *predicted*: per (workspace,
 * runnable version) this remembers every question its runs have asked (a set that only grows);
 * until a version has run in this process, it predicts every question (the full fingerprint).
 * After a run, its result is stored only if every answer it actually got is still the current
 * answer, and the questions the lookup was keyed on still answer as they did then; it is stored
 * under the fingerprint of the grown set, so the next run finds it. A run that asked something
 * new missed once (its lookup was keyed on the smaller set). Nothing here is sensitive: the sets
 * hold data-table and role names, never viewers.
 *
 * A run that starts a child job depends on everything the job could use (the workspace-wide
 * fingerprint), checked each time the child consults the catalog: the child's answers may come
 * from the cache, where nobody asked them.
 */
export class RunDependencies {
  readonly #authorizationOf: (job: Job) => JobAuthorization | Promise<JobAuthorization>;
  readonly #learned = new Map<string, DependencySet>();
  /** Recordings of the runs executing now, by job object. */
  readonly #recordings = new WeakMap<Job, Recording>();
  /** A child job's nearest recorded ancestor. */
  readonly #parentOf = new WeakMap<Job, Recording>();
  /** Whether any child job was ever linked (spares the lookup a WeakMap read until then). */
  #linked = false;
  readonly #maxLearned: number;

  constructor(
    authorizationOf: (job: Job) => JobAuthorization | Promise<JobAuthorization>,
    maxLearned = 100_000,
  ) {
    this.#authorizationOf = authorizationOf;
    this.#maxLearned = maxLearned;
  }

  /** The fingerprint over what runs of this job's runnable were seen to depend on. */
  fingerprint(job: Job): string | Promise<string> {
    const set = this.#learned.get(learnedKey(job)) ?? UNKNOWN;
    const authorization = this.#authorizationOf(job);
    if (isThenable(authorization)) {
      return authorization.then((a) => {
        if (this.#linked) this.#parentOf.get(job)?.record(EVERY_REFERENCE, a);
        return a.fingerprintOver(set);
      });
    }
    // A child job's lookup: its entry answers for the state now, which its parent depends on.
    if (this.#linked) this.#parentOf.get(job)?.record(EVERY_REFERENCE, authorization);
    return authorization.fingerprintOver(set);
  }

  /**
   * Starts recording a run that is about to execute after a miss. `settle(fingerprint)` returns
   * the fingerprint to store its result under, or `undefined` when it must not be stored; call
   * `abandon()` instead when the result will not be stored anyway.
   */
  track(job: Job): FingerprintTracking {
    const existing = this.#recordings.get(job);
    if (existing !== undefined) {
      // The same job object executing twice at once: answers could not be told apart.
      existing.shared = true;
      existing.active++;
      return this.#tracking(job, existing);
    }
    const recording = new Recording(
      this.#learned.get(learnedKey(job)) ?? UNKNOWN,
      this.#linked ? this.#parentOf.get(job) : undefined,
    );
    this.#recordings.set(job, recording);
    return this.#tracking(job, recording);
  }

  /** Records that `job` asked for `ref` (before it is granted or refused). */
  askedFor(job: Job, ref: DatatableRef, authorization: JobAuthorization): void {
    this.#record(job, refDependency(ref), authorization);
  }

  /** Records that `job` checked whether its viewer holds `role` of `datatable`. */
  checkedRole(job: Job, datatable: string, role: string, authorization: JobAuthorization): void {
    this.#record(job, holdsDependency(datatable, role), authorization);
  }

  /**
   * Records that `job` started `child`: the parent now depends on everything the job could use,
   * as it was each time the child consulted the catalog (its lookup, its connections, its role
   * checks, and its own children's).
   */
  startedChild(job: Job, child: Job): void {
    const recording = this.#recordings.get(job) ?? this.#parentOf.get(job);
    if (recording === undefined) return; // nobody will store what depends on it
    recording.everything = true;
    this.#linked = true;
    this.#parentOf.set(child, recording);
  }

  #record(job: Job, dependency: Dependency, authorization: JobAuthorization): void {
    const recording = this.#recordings.get(job);
    if (recording !== undefined) recording.record(dependency, authorization);
    else if (this.#linked) this.#parentOf.get(job)?.record(EVERY_REFERENCE, authorization);
  }

  #tracking(job: Job, recording: Recording): FingerprintTracking {
    const { predicted } = recording;
    let ended = false;
    const end = (): boolean => {
      if (ended) return false;
      ended = true;
      if (--recording.active === 0) this.#recordings.delete(job);
      return true;
    };
    return {
      abandon: () => {
        end();
      },
      settle: (fingerprint) => {
        if (!end() || recording.shared || recording.conflicting) return undefined;
        const authorization = this.#authorizationOf(job);
        return isThenable(authorization)
          ? authorization.then((a) => this.#settle(job, recording, predicted, fingerprint, a))
          : this.#settle(job, recording, predicted, fingerprint, authorization);
      },
    };
  }

  /** On the current state: still the answers the run got, and the lookup's answers unchanged. */
  #settle(
    job: Job,
    recording: Recording,
    predicted: DependencySet,
    fingerprint: string | null,
    now: JobAuthorization,
  ): string | readonly string[] | undefined {
    if (now.fingerprintOver(predicted) !== fingerprint) return undefined;
    for (const [dependency, answer] of recording.answers) {
      if (now.answer(dependency) !== answer) return undefined;
    }
    const key = learnedKey(job);
    const grown = recording.everything
      ? EVERYTHING
      : union(
          this.#learned.get(key) ?? NOTHING,
          predicted === UNKNOWN ? NOTHING : predicted,
          recording.answers.keys(),
        );
    if (grown !== predicted) {
      if (this.#learned.size >= this.#maxLearned) this.#learned.clear();
      this.#learned.set(key, grown);
    }
    const stored = now.fingerprintOver(grown);
    // Keyed on everything (this process had not seen the runnable run yet): stored there too, so
    // other processes that have not either find it.
    return predicted === UNKNOWN && grown !== EVERYTHING
      ? [stored, now.fingerprintOver(UNKNOWN)]
      : stored;
  }
}

const NOTHING: DependencySet = Object.freeze({ everything: false, members: Object.freeze([]) });
const EVERYTHING: DependencySet = Object.freeze({ everything: true, members: Object.freeze([]) });
/**
 * A runnable version this process has not seen run: keyed on everything, which every process
 * agrees on, so the first run of each process can still hit what another stored.
 */
const UNKNOWN: DependencySet = Object.freeze({ everything: true, members: Object.freeze([]) });

/** What one executing run asked, and what it was told. */
class Recording {
  /** Each question the run asked, with the answer it got. */
  readonly answers = new Map<Dependency, string>();
  everything = false;
  /** The same question got two answers during the run (the catalog moved under it). */
  conflicting = false;
  /** Two executions of one job object overlapped: their answers cannot be told apart. */
  shared = false;
  active = 1;

  /**
   * @param predicted the set the lookup was keyed on
   * @param parent the recording of the run that started this one as a child job
   */
  constructor(
    readonly predicted: DependencySet,
    readonly parent: Recording | undefined,
  ) {}

  record(dependency: Dependency, authorization: JobAuthorization): void {
    const answer = authorization.answer(dependency);
    const before = this.answers.get(dependency);
    if (before === undefined) this.answers.set(dependency, answer);
    else if (before !== answer) this.conflicting = true;
    this.parent?.record(EVERY_REFERENCE, authorization);
  }
}

function union(
  learned: DependencySet,
  predicted: DependencySet,
  asked: Iterable<Dependency>,
): DependencySet {
  if (learned.everything || predicted.everything) return EVERYTHING;
  const members = new Set([...learned.members, ...predicted.members, ...asked]);
  if (members.size === learned.members.length) return learned;
  return Object.freeze({ everything: false, members: Object.freeze([...members].sort()) });
}

function learnedKey(job: Job): string {
  return `${job.workspace}\0${job.runnable.path}\0${job.runnable.hash}`;
}
