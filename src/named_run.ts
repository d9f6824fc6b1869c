import type { RunOptions } from './job.js';

/**
 * A run's key as a result cache named it: the digest of its full key input and the fingerprint
 * that input held. A server's result cache hands it to the executor it wraps on a miss (the
 * queue executor seals it into the job's record); a queue worker hands the one its record holds
 * back to its own result cache, which uses it instead of deriving the same key again — only when
 * the fingerprint the worker computes for the job is that very one, so a result is never written
 * under a key its run's authorization does not hold (SPEC 10).
 *
 * Why: the worker derived, from the same record, the key the server had just derived — about
 * 24 µs of CPU per queued miss at 32 callers and 0.12–0.15 ms at one caller here, where each
 * step runs with cold caches (CHANGELOG). Trusting it adds no trust: the digest comes from the
 * sealed record, which already names the viewer the worker runs as (SPEC 19).
 */
export interface NamedRun {
  /** The key input's digest (64 hex digits), as the cache's codec computed it. */
  readonly digest: string;
  readonly fingerprint: string | null;
}

/** The option under which a result cache hands its run's key to the executor it wraps. */
export const NAMED_RUN: unique symbol = Symbol('viewer-cache.namedRun');

/** The option under which a queue worker hands its record's key to its result cache. */
export const GIVEN_RUN: unique symbol = Symbol('viewer-cache.givenRun');

/** Run options that may carry either (internal: symbols, not fields of {@link RunOptions}). */
export interface NamedRunOptions extends RunOptions {
  readonly [NAMED_RUN]?: NamedRun;
  readonly [GIVEN_RUN]?: NamedRun;
}

/** A digest as every codec names one: SHA-256 (or HMAC-SHA-256), 64 lowercase hex digits. */
const DIGEST_RE = /^[0-9a-f]{64}$/;

/** `value` as a {@link NamedRun} when it is one; otherwise null (the key is derived as ever). */
export function namedRunOf(value: unknown): NamedRun | null {
  if (typeof value !== 'object' || value === null) return null;
  const { digest, fingerprint } = value as { digest?: unknown; fingerprint?: unknown };
  if (typeof digest !== 'string' || !DIGEST_RE.test(digest)) return null;
  if (fingerprint !== null && typeof fingerprint !== 'string') return null;
  return { digest, fingerprint };
}
