import { Counter, collectDefaultMetrics, Histogram, Registry } from 'prom-client';
import type { CachedExecutor, Datatables } from '../../index.js';

/**
 * Prometheus metrics. Cache counters are read from the middleware's own counters at scrape time,
 * so the hit path pays nothing for them. No label ever carries a viewer, key, path argument or
 * token: only fixed vocabularies (reason, access kind, route pattern, status code).
 */
export function createMetrics(
  cache: CachedExecutor,
  datatables: Datatables,
): {
  registry: Registry;
  observeRequest(route: string, status: number): void;
  observeJob(outcome: string): void;
} {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });

  const fromStats = (name: string, help: string, read: () => number) =>
    new Counter({
      name,
      help,
      registers: [registry],
      collect() {
        this.reset();
        this.inc(read());
      },
    });
  const { stats } = cache;
  fromStats('viewer_cache_hits_total', 'Results served from the cache', () => stats.hits);
  fromStats('viewer_cache_misses_total', 'Cacheable runs that executed', () => stats.misses);
  fromStats(
    'viewer_cache_coalesced_total',
    'Runs that joined an identical in-flight run',
    () => stats.coalesced,
  );
  fromStats(
    'viewer_cache_bypasses_total',
    'Runs that did not consult the cache',
    () => stats.bypasses,
  );
  fromStats('viewer_cache_stored_total', 'Results written to the cache', () => stats.stored);
  fromStats(
    'viewer_cache_not_stored_total',
    'Successful results not written',
    () => stats.notStored,
  );
  fromStats(
    'viewer_cache_rejected_total',
    'Entries read but refused (corrupt, foreign key, expired)',
    () => stats.rejected,
  );
  fromStats(
    'viewer_cache_store_errors_total',
    'Cache store failures (runs went uncached)',
    () => stats.storeErrors,
  );

  const logins = new Counter({
    name: 'viewer_cache_set_logins_total',
    help: 'Set logins by event',
    labelNames: ['event'] as const,
    registers: [registry],
  });
  datatables.events.on('login:created', () => logins.inc({ event: 'created' }));
  datatables.events.on('login:taken-back', () => logins.inc({ event: 'taken_back' }));
  datatables.events.on('login:retired', () => logins.inc({ event: 'retired' }));

  const buckets = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25];
  const resolve = new Histogram({
    name: 'viewer_cache_datatable_resolve_seconds',
    help: 'Resolving roles and login for a data-table connection',
    labelNames: ['access'] as const,
    buckets,
    registers: [registry],
  });
  const connect = new Histogram({
    name: 'viewer_cache_datatable_connect_seconds',
    help: 'Lending a pooled connection (opening one if none is idle)',
    labelNames: ['access'] as const,
    buckets,
    registers: [registry],
  });
  const refused = new Counter({
    name: 'viewer_cache_datatable_refused_total',
    help: 'Data-table connection requests refused, by error code',
    labelNames: ['code'] as const,
    registers: [registry],
  });
  datatables.events.on('datatable:resolved', ({ ms, access }) =>
    resolve.observe({ access }, ms / 1000),
  );
  datatables.events.on('datatable:connected', ({ ms, access }) =>
    connect.observe({ access }, ms / 1000),
  );
  datatables.events.on('datatable:refused', ({ code }) => refused.inc({ code }));

  const requests = new Counter({
    name: 'viewer_cache_http_requests_total',
    help: 'HTTP requests by route pattern and status',
    labelNames: ['route', 'status'] as const,
    registers: [registry],
  });
  const jobs = new Counter({
    name: 'viewer_cache_jobs_total',
    help: 'Jobs by outcome (ok, or the error code)',
    labelNames: ['outcome'] as const,
    registers: [registry],
  });
  // Each request counted through a child resolved once per (route, status): `inc(labels)`
  // rebuilds and hashes the label set on every call (1 % of a cached request's CPU under
  // autocannon). Both sets are finite: route patterns, status codes, error codes.
  const requestChildren = new Map<string, { inc(): void }>();
  const jobChildren = new Map<string, { inc(): void }>();
  return {
    registry,
    observeRequest: (route, status) => {
      const key = `${status} ${route}`;
      let child = requestChildren.get(key);
      if (child === undefined) {
        child = requests.labels({ route, status: String(status) });
        requestChildren.set(key, child);
      }
      child.inc();
    },
    observeJob: (outcome) => {
      let child = jobChildren.get(outcome);
      if (child === undefined) {
        child = jobs.labels({ outcome });
        jobChildren.set(outcome, child);
      }
      child.inc();
    },
  };
}
