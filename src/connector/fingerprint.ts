import type { Job } from '../job.js';

/*
 * The seam between the result cache and whatever decides a job's authorization (the data tables'
 * `datatables.fingerprint`, or an adopter's own): the cache hashes the fingerprint into the key,
 * and follows each run it executes so that its result is stored only under what it depended on.
 * Written once, here, beneath both sides: neither the cache nor the data tables owns it.
 */

/** Computes a job's authorization fingerprint; see `RawResultCacheOptions.fingerprint`. */
export type FingerprintFn = ((job: Job) => Promise<string | null> | string | null) & {
  /**
   * Optional: follows a run that executes after a miss, for a fingerprint computed over what
   * the run depends on (`datatables.fingerprint` has it). Without it, a result is stored only if
   * calling the function again gives the lookup's fingerprint.
   */
  readonly track?: (job: Job) => FingerprintTracking;
};

/**
 * What a run's result is stored under once it succeeded: a fingerprint, several (stored under
 * each), or `undefined` (not stored).
 */
export type SettledFingerprint = string | null | readonly (string | null)[] | undefined;

/** One executing run followed by the `track` of a {@link FingerprintFn}. */
export interface FingerprintTracking {
  /**
   * After the run succeeded: the fingerprint(s) to store its result under (they may differ from
   * the lookup's when the run depended on more than predicted), or `undefined` to not store it.
   */
  settle(fingerprint: string | null): SettledFingerprint | Promise<SettledFingerprint>;
  /** The run failed or its result will not be stored. */
  abandon(): void;
}
