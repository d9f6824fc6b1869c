/*
 * The result cache, traced: a `viewer_cache.run` span per run (its outcome, and the code when it
 * failed or was refused) and a span per shared-store read and write. Put in front of the cache
 * only when an OpenTelemetry SDK is registered as the cache is built, so an untraced cache pays
 * nothing at all on its hit path (see src/tracing.ts for what a span may carry).
 */
import { type Span, type Tracer, trace } from '@opentelemetry/api';
import type { ResultCacheEvents, TypedEmitter } from '../events.js';
import type { Job, RunOptions } from '../job.js';
import type { JobResult } from '../job_result.js';
import type { CacheStore } from '../stores/store.js';
import { endWithError, inSpan } from '../tracing.js';

/** What a run span's `viewer_cache.outcome` may say. */
export type RunOutcome = 'hit' | 'miss' | 'coalesced' | 'bypass' | 'refused' | 'failed';

/** The span of the run in progress, as the cache's own events see it (the active one). */
function mark(outcome: RunOutcome): () => void {
  return () => trace.getActiveSpan()?.setAttribute('viewer_cache.outcome', outcome);
}

/**
 * `cache` with a span around each run. The cache says what a run turned out to be through its
 * events, emitted inside the run (so under its span, the active one); a refusal (a 4xx code:
 * no viewer, no roles…) and a failure are told apart by the error's HTTP status.
 */
export function traceRuns<C extends TracedRuns>(cache: C, tracer: Tracer): C {
  cache.events.on('cache:hit', mark('hit'));
  cache.events.on('cache:miss', mark('miss'));
  cache.events.on('cache:coalesced', mark('coalesced'));
  cache.events.on('cache:bypass', mark('bypass'));
  const run = (job: Job, options?: RunOptions): Promise<JobResult> =>
    tracer.startActiveSpan(
      'viewer_cache.run',
      {
        attributes: {
          'viewer_cache.workspace': job.workspace,
          'viewer_cache.runnable.path': job.runnable.path,
        },
      },
      (span: Span) =>
        cache.run(job, options).then(
          (result) => {
            if (result.fromCache) span.setAttribute('viewer_cache.outcome', 'hit');
            span.end();
            return result;
          },
          (err: unknown) => {
            const status = (err as { status?: unknown } | null)?.status;
            const refused = typeof status === 'number' && status < 500;
            span.setAttribute('viewer_cache.outcome', refused ? 'refused' : 'failed');
            endWithError(span, err);
            throw err;
          },
        ),
    );
  return new Proxy(cache, {
    get(target, property) {
      if (property === 'run') return run;
      // The target as receiver: the cache's accessors read its private (#) fields.
      const value = Reflect.get(target, property);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

/** What {@link traceRuns} needs of a cache: its runs, and the events that say their outcome. */
export interface TracedRuns {
  run(job: Job, options?: RunOptions): Promise<JobResult>;
  readonly events: Pick<TypedEmitter<ResultCacheEvents>, 'on'>;
}

/** `store` with a span per read and write; its tiers' shared side likewise. Never a key. */
export function traceStore(store: CacheStore, tracer: Tracer): CacheStore {
  const tiers = store.tiers;
  const traced: Pick<CacheStore, 'get' | 'set' | 'tiers'> = {
    tiers:
      tiers === undefined
        ? undefined
        : { memory: tiers.memory, shared: traceStore(tiers.shared, tracer) },
    get: (key, tag) =>
      inSpan(tracer, 'viewer_cache.store.get', {}, async (span) => {
        const value = await store.get(key, tag);
        span.setAttribute('viewer_cache.store.found', value !== null);
        if (value !== null) span.setAttribute('viewer_cache.store.bytes', value.byteLength);
        return value;
      }),
    set: (key, value, ttlMs, tag) =>
      inSpan(
        tracer,
        'viewer_cache.store.set',
        { 'viewer_cache.store.bytes': value.byteLength },
        () => store.set(key, value, ttlMs, tag),
      ),
  };
  // Whatever else the store offers (close, delete, clear…) stays reachable, untraced.
  return new Proxy(store, {
    get(target, property) {
      if (property === 'get' || property === 'set' || property === 'tiers') {
        return traced[property];
      }
      // The target as receiver: a store's accessors read its private (#) fields.
      const value = Reflect.get(target, property);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}
