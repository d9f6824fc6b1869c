import type { Job } from '../job.js';
import type { CacheInvalidation } from '../stores/store.js';
import type { FingerprintFn } from './result_cache_options.js';

/**
 * `fingerprint` with the invalidation epochs of the job's workspace and runnable in front:
 * `e<tag>:n` (no fingerprint) or `e<tag>:s<fingerprint>`. The tag holds no `:`, so the text is
 * unambiguous. When the epochs are in memory (the bus is confirmed) and the fingerprint is
 * synchronous, so is the result: no promise hop on the hit path. When they are not, the promise
 * reads them from Redis, and rejects when it cannot (the run goes uncached).
 */
export function withEpochs(
  fingerprint: FingerprintFn | null,
  invalidation: CacheInvalidation,
): FingerprintFn {
  return (job: Job) => {
    const tag = invalidation.tag(job.workspace, job.runnable.path);
    const inner = fingerprint === null ? null : fingerprint(job);
    if (typeof tag === 'string' && !isThenable(inner)) return combine(tag, inner);
    return Promise.all([tag, inner]).then(([t, f]) => combine(t, f));
  };
}

function combine(tag: string, fingerprint: string | null | undefined): string | null {
  if (fingerprint == null) return `e${tag}:n`;
  // Not text: handed on as is, so the key refuses it as it would without epochs.
  if (typeof fingerprint !== 'string') return fingerprint;
  return `e${tag}:s${fingerprint}`;
}

function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}
