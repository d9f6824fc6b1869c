import type {
  FingerprintFn,
  FingerprintTracking,
  SettledFingerprint,
} from '../connector/fingerprint.js';
import type { Job } from '../job.js';
import type { CacheInvalidation } from '../stores/store.js';
import { isThenable } from '../util/thenable.js';

/**
 * `fingerprint` with the invalidation epochs of the job's workspace and runnable in front:
 * `e<tag>:n` (no fingerprint) or `e<tag>:s<fingerprint>`. The tag holds no `:`, so the text is
 * unambiguous. When the epochs are in memory (the bus is confirmed) and the fingerprint is
 * synchronous, so is the result: no promise hop on the hit path. When they are not, the promise
 * reads them from Redis, and rejects when it cannot (the run goes uncached).
 *
 * A fingerprint that tracks runs (`track`, over what the run depended on) keeps doing so: its
 * settled fingerprints get the epochs the run started with, and none at all (not stored) when
 * an invalidation happened meanwhile.
 */
export function withEpochs(
  fingerprint: FingerprintFn | null,
  invalidation: CacheInvalidation,
): FingerprintFn {
  const combined = (job: Job) => {
    const tag = invalidation.tag(job.workspace, job.runnable.path);
    const inner = fingerprint === null ? null : fingerprint(job);
    if (typeof tag === 'string' && !isThenable(inner)) return combine(tag, inner);
    return Promise.all([tag, inner]).then(([t, f]) => combine(t, f));
  };
  const track = fingerprint?.track;
  if (track === undefined) return combined;
  return Object.assign(combined, {
    track: (job: Job): FingerprintTracking => {
      const inner = track.call(fingerprint, job);
      return {
        abandon: () => inner.abandon(),
        settle: async (started: string | null): Promise<SettledFingerprint> => {
          const split = started === null ? null : splitCombined(started);
          if (split === null) {
            inner.abandon();
            return undefined;
          }
          const [settled, now] = await Promise.all([
            inner.settle(split.fingerprint),
            invalidation.tag(job.workspace, job.runnable.path),
          ]);
          // Invalidated while it ran: never stored (the fence's write side).
          if (now !== split.tag || settled === undefined) return undefined;
          if (Array.isArray(settled)) {
            return (settled as readonly (string | null)[]).map((f) => combine(split.tag, f));
          }
          return combine(split.tag, settled as string | null);
        },
      };
    },
  });
}

function combine(tag: string, fingerprint: string | null | undefined): string | null {
  if (fingerprint == null) return `e${tag}:n`;
  // Not text: handed on as is, so the key refuses it as it would without epochs.
  if (typeof fingerprint !== 'string') return fingerprint;
  return `e${tag}:s${fingerprint}`;
}

/** The tag and the inner fingerprint of a {@link combine}d text. */
function splitCombined(text: string): { tag: string; fingerprint: string | null } | null {
  const colon = text.indexOf(':');
  if (!text.startsWith('e') || colon < 0) return null;
  const tag = text.slice(1, colon);
  const rest = text.slice(colon + 1);
  if (rest === 'n') return { tag, fingerprint: null };
  if (rest.startsWith('s')) return { tag, fingerprint: rest.slice(1) };
  return null;
}
