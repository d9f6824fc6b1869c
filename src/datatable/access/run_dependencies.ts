import type { DatatableRef } from '../../connector/datatable_ref.js';
import type { FingerprintTracking, SettledFingerprint } from '../../connector/fingerprint.js';
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
import type { RunnableVersion } from './learned_sets.js';

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
 * until a version has run, it predicts every question (the full fingerprint). With
 * {@link SharedLearning} (the data tables' `LearnedSets`) the sets are shared by every process
 * and outlive it: a version this process has not seen is read from there once, and a set that
 * grew is written there before its run's result is stored, so another process's next run of
 * it computes the same fingerprint.
 * After a run, its result is stored only if every answer it actually got is still the current
 * answer, and the questions the lookup was keyed on still answer as they did then; it is stored
 * under the fingerprint of the grown set, so the next run finds it. A run that asked something
 * new missed once (its lookup was keyed on the smaller set). Nothing here is sensitive: the sets
 * hold data-table and role names, never viewers.
 *
 * A run that starts a child job depends on everything the job could use (the workspace-wide
 * fingerprint), checked each time the child consults the catalog: the child's answers may come
 * from the cache, where nobody asked them.
 *
 * Recordings are kept by job object, so a run whose connections or role checks reach the
 * catalog through another object (a layer that copied the job) would look like one that asked
 * nothing, and "depends on nothing" would be learned and shared: every later run keyed blind to
 * roles. So a consultation by a job object nobody tracks taints every run tracked now with the
 * same id or runnable version: such a run learns nothing, and its result is stored only under
 * the full fingerprint (and only when its lookup was keyed there, so that no change during the
 * run goes unseen).
 */
export class RunDependencies {
  readonly #authorizationOf: (job: Job) => JobAuthorization | Promise<JobAuthorization>;
  /** Learned sets by version; {@link NOT_LEARNED} when the shared store has none (yet). */
  readonly #learned = new Map<string, DependencySet>();
  readonly #shared: SharedLearning | null;
  /** Shared-store reads under way, by version: concurrent first runs share one. */
  readonly #loading = new Map<string, Promise<DependencySet>>();
  /** Versions held from the shared store, by digest (how announcements name them). */
  readonly #byDigest = new Map<string, string>();
  /** Bumped by every announcement: a read that started before one may be stale. */
  #epoch = 0;
  /**
   * The set a lookup read from the shared store was keyed on, when it was not kept in memory:
   * its run's recording must predict the same set, or its result could never be stored.
   */
  readonly #keyedOn = new WeakMap<Job, DependencySet>();
  /** Recordings of the runs executing now, by job object. */
  readonly #recordings = new WeakMap<Job, Recording>();
  /** Recordings executing now, by job id and by version: who an untracked consultation taints. */
  readonly #running = new Map<string, Set<Recording>>();
  /** A child job's nearest recorded ancestor. */
  readonly #parentOf = new WeakMap<Job, Recording>();
  /** Whether any child job was ever linked (spares the lookup a WeakMap read until then). */
  #linked = false;
  readonly #maxLearned: number;

  constructor(
    authorizationOf: (job: Job) => JobAuthorization | Promise<JobAuthorization>,
    options: { shared?: SharedLearning | null; maxLearned?: number } = {},
  ) {
    this.#authorizationOf = authorizationOf;
    this.#shared = options.shared ?? null;
    this.#maxLearned = options.maxLearned ?? 100_000;
  }

  /** The fingerprint over what runs of this job's runnable were seen to depend on. */
  fingerprint(job: Job): string | Promise<string> {
    const set = this.#known(job);
    if (!isThenable(set)) return this.#fingerprintOver(job, set);
    return set.then((s) => {
      this.#keyedOn.set(job, s);
      return this.#fingerprintOver(job, s);
    });
  }

  /**
   * The set this job's lookup is keyed on (learned here or read from the shared store), or
   * `everything` when none is learned yet: the full fingerprint. For explanations.
   */
  async learned(job: Job): Promise<DependencySet> {
    return this.#known(job);
  }

  /**
   * A version's set changed in the shared store (its announcement): drop this process's copy,
   * so its next run reads the row again.
   */
  forget(digest: string, size: number): void {
    const key = this.#byDigest.get(digest);
    const held = key === undefined ? undefined : this.#learned.get(key);
    // Our own save's echo (or one we already read): sets only grow, so equal size is the same set.
    if (held !== undefined && held !== NOT_LEARNED && sizeOf(held) === size) return;
    this.#epoch++;
    if (key === undefined) return;
    this.#byDigest.delete(digest);
    this.#learned.delete(key);
  }

  /** Announcements may have been missed (the listener was down): read every version again. */
  forgetAll(): void {
    this.#epoch++;
    this.#byDigest.clear();
    this.#learned.clear();
  }

  /** The set this job's lookup is keyed on: in memory, else read once from the shared store. */
  #known(job: Job): DependencySet | Promise<DependencySet> {
    const key = learnedKey(job);
    const held = this.#learned.get(key);
    if (held !== undefined) return held;
    const shared = this.#shared;
    if (shared === null) return UNKNOWN;
    let loading = this.#loading.get(key);
    if (loading === undefined) {
      const epoch = this.#epoch;
      const version = versionOf(job);
      loading = shared.load(version).then(
        (found) => {
          this.#loading.delete(key);
          // Kept only if no announcement came meanwhile, and an absence only while announcements
          // are heard (else a set learned elsewhere later would never be read here).
          if (epoch === this.#epoch && (found !== null || shared.hearsAnnouncements())) {
            this.#remember(key, found ?? NOT_LEARNED, shared.digest(version));
          }
          return found ?? UNKNOWN;
        },
        () => {
          // The store failed: the full fingerprint, which needs nothing from it; remembered, so
          // a failing store (an unmigrated catalog) costs no query per lookup — this process
          // then learns on its own, as before sets were shared.
          this.#loading.delete(key);
          if (epoch === this.#epoch) this.#remember(key, NOT_LEARNED, null);
          return UNKNOWN;
        },
      );
      this.#loading.set(key, loading);
    }
    return loading;
  }

  #remember(key: string, set: DependencySet, digest: string | null): void {
    if (this.#learned.size >= this.#maxLearned) {
      this.#learned.clear();
      this.#byDigest.clear();
    }
    this.#learned.set(key, set);
    if (digest !== null) this.#byDigest.set(digest, key);
  }

  #fingerprintOver(job: Job, set: DependencySet): string | Promise<string> {
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
    const held = this.#keyedOn.get(job) ?? this.#learned.get(learnedKey(job));
    const recording = new Recording(
      held === undefined || held === NOT_LEARNED ? UNKNOWN : held,
      this.#linked ? this.#parentOf.get(job) : undefined,
    );
    this.#recordings.set(job, recording);
    for (const name of runningNames(job)) {
      const set = this.#running.get(name);
      if (set === undefined) this.#running.set(name, new Set([recording]));
      else set.add(recording);
    }
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
    if (recording !== undefined) {
      recording.record(dependency, authorization);
      return;
    }
    const parent = this.#linked ? this.#parentOf.get(job) : undefined;
    if (parent !== undefined) {
      parent.record(EVERY_REFERENCE, authorization);
      return;
    }
    // Nobody tracks this object: if a tracked run has its id or version, this may be that run
    // asking through a copy of its job, and what it asked is not in its recording.
    if (this.#running.size === 0) return;
    for (const name of runningNames(job)) {
      for (const running of this.#running.get(name) ?? []) running.unobserved = true;
    }
  }

  #tracking(job: Job, recording: Recording): FingerprintTracking {
    const { predicted } = recording;
    let ended = false;
    const end = (): boolean => {
      if (ended) return false;
      ended = true;
      if (--recording.active === 0) {
        this.#recordings.delete(job);
        for (const name of runningNames(job)) {
          const set = this.#running.get(name);
          set?.delete(recording);
          if (set?.size === 0) this.#running.delete(name);
        }
      }
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
  ): SettledFingerprint | Promise<SettledFingerprint> {
    if (now.fingerprintOver(predicted) !== fingerprint) return undefined;
    for (const [dependency, answer] of recording.answers) {
      if (now.answer(dependency) !== answer) return undefined;
    }
    // What it asked was (maybe) not recorded: nothing learned; the full fingerprint only, and
    // only when the lookup (checked just above) was keyed on it.
    if (recording.unobserved) {
      return predicted.everything ? now.fingerprintOver(UNKNOWN) : undefined;
    }
    const key = learnedKey(job);
    const entry = this.#learned.get(key);
    const learned = entry !== undefined && entry !== NOT_LEARNED;
    const held = learned ? entry : NOTHING;
    const grown = recording.everything
      ? EVERYTHING
      : union(held, predicted === UNKNOWN ? NOTHING : predicted, recording.answers.keys());
    if (learned && grown === held) return this.#storedUnder(now, predicted, grown);
    const shared = this.#shared;
    if (shared === null || grown === EVERYTHING) {
      this.#remember(key, grown, null);
      return this.#storedUnder(now, predicted, grown);
    }
    // Shared before the result is stored: whoever finds the entry can compute its fingerprint.
    const version = versionOf(job);
    return shared.save(version, grown).then(
      (stored) => {
        this.#remember(key, stored, shared.digest(version));
        // Under the stored set (a superset of what the run asked): what every process computes.
        return this.#storedUnder(now, predicted, stored);
      },
      () => {
        // Not shared: learned here, and also stored under the full fingerprint for the others.
        this.#remember(key, grown, null);
        const stored = now.fingerprintOver(grown);
        const full = now.fingerprintOver(UNKNOWN);
        return stored === full ? stored : [stored, full];
      },
    );
  }

  #storedUnder(
    now: JobAuthorization,
    predicted: DependencySet,
    set: DependencySet,
  ): string | readonly string[] {
    const stored = now.fingerprintOver(set);
    // Keyed on everything (this process had not seen the runnable run yet): stored there too, so
    // other processes that have not either find it.
    return predicted === UNKNOWN && !set.everything
      ? [stored, now.fingerprintOver(UNKNOWN)]
      : stored;
  }
}

/**
 * Where learned sets are shared between processes (`LearnedSets` in learned_sets.ts, with the
 * announcements heard by the catalog's listener).
 */
export interface SharedLearning {
  /** The stored set, or null when none is stored or it does not verify. */
  load(version: RunnableVersion): Promise<DependencySet | null>;
  /** Stores the union with what is stored; resolves to the stored set. */
  save(version: RunnableVersion, set: DependencySet): Promise<DependencySet>;
  /** The version's name in announcements. */
  digest(version: RunnableVersion): string;
  /** Whether a change to the store would be heard now (so an absence may be remembered). */
  hearsAnnouncements(): boolean;
}

const NOTHING: DependencySet = Object.freeze({ everything: false, members: Object.freeze([]) });
const EVERYTHING: DependencySet = Object.freeze({ everything: true, members: Object.freeze([]) });
/**
 * A runnable version this process has not seen run: keyed on everything, which every process
 * agrees on, so the first run of each process can still hit what another stored.
 */
const UNKNOWN: DependencySet = Object.freeze({ everything: true, members: Object.freeze([]) });
/** Held for a version the shared store had no (verifying) set of: keyed like UNKNOWN. */
const NOT_LEARNED: DependencySet = UNKNOWN;

/** What one executing run asked, and what it was told. */
class Recording {
  /** Each question the run asked, with the answer it got. */
  readonly answers = new Map<Dependency, string>();
  everything = false;
  /** The same question got two answers during the run (the catalog moved under it). */
  conflicting = false;
  /** Two executions of one job object overlapped: their answers cannot be told apart. */
  shared = false;
  /** A job with this run's id or version asked through an untracked object meanwhile. */
  unobserved = false;
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

/** A set's size as announcements carry it: -1 for everything. */
function sizeOf(set: DependencySet): number {
  return set.everything ? -1 : set.members.length;
}

function versionOf(job: Job): RunnableVersion {
  return { workspace: job.workspace, path: job.runnable.path, hash: job.runnable.hash };
}

/** Names a tracked run is found under by an untracked consultation: its id, its version. */
function runningNames(job: Job): [string, string] {
  return [`id\0${job.workspace}\0${job.id}`, `v\0${learnedKey(job)}`];
}

function learnedKey(job: Job): string {
  return `${job.workspace}\0${job.runnable.path}\0${job.runnable.hash}`;
}
