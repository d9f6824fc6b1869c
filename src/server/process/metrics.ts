import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { CachedExecutor, Datatables } from '../../index.js';
import {
  type CounterSeries,
  type HistogramSeries,
  SeriesCounter,
  SeriesHistogram,
} from './series_metrics.js';

/**
 * Prometheus metrics. Cache counters are read from the middleware's own counters at scrape time,
 * so the hit path pays nothing for them. No label ever carries a viewer, key, path argument or
 * token: only fixed vocabularies (reason, access kind, route pattern, status code).
 */
export function createMetrics(
  cache: CachedExecutor,
  datatables: Datatables,
  fleet: MetricsFleet = {},
): {
  registry: Registry;
  observeRequest(route: string, status: number, seconds: number): void;
  observeJob(code: string, outcome: 'hit' | 'miss' | 'refused' | 'failed', seconds: number): void;
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
  // Every event's series exists from the start at 0: a rate over an absent series is no data,
  // not zero, and a process that only reuses logins would otherwise never expose the label.
  for (const event of ['created', 'taken_back', 'retired'] as const) logins.inc({ event }, 0);
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

  new Gauge({
    name: 'viewer_cache_catalog_generation',
    help: 'The catalog generation this process has loaded',
    registers: [registry],
    collect() {
      this.set(datatables.generation);
    },
  });
  new Gauge({
    name: 'viewer_cache_catalog_listener_up',
    help: 'Whether the catalog listener (LISTEN) is connected: 0 means runs check Postgres directly',
    registers: [registry],
    collect() {
      this.set(datatables.listenerUp ? 1 : 0);
    },
  });
  const refreshes = new Counter({
    name: 'viewer_cache_catalog_refreshes_total',
    help: 'Catalog snapshots loaded (each catalog change, on every process)',
    registers: [registry],
  });
  datatables.events.on('catalog:refreshed', () => refreshes.inc());
  new Gauge({
    name: 'viewer_cache_datatable_connections',
    help: 'Data-table connections of this process: open, lent to runs, and leases waiting for room',
    labelNames: ['state'] as const,
    registers: [registry],
    collect() {
      const { open, lent, waiting } = datatables.connections;
      this.set({ state: 'open' }, open);
      this.set({ state: 'lent' }, lent);
      this.set({ state: 'waiting' }, waiting);
    },
  });
  const { liveWorkers } = fleet;
  if (liveWorkers !== undefined) {
    new Gauge({
      name: 'viewer_cache_workers_alive',
      help: 'Queue workers whose heartbeat is fresh (queue mode); NaN when the queue did not answer',
      registers: [registry],
      async collect() {
        this.set((await withinScrape(liveWorkers())) ?? Number.NaN);
      },
    });
  }

  const { queueFleet } = fleet;
  if (queueFleet !== undefined) {
    new Gauge({
      name: 'viewer_cache_queue_takers_alive',
      help: 'Queue mode: workers and agents whose heartbeat is fresh, by queue (workspace/group); none while the queue does not answer',
      labelNames: ['queue'] as const,
      registers: [registry],
      async collect() {
        const counts = await withinScrape(queueFleet());
        this.reset();
        for (const [queue, count] of Object.entries(counts ?? {})) this.set({ queue }, count);
      },
    });
  }

  const { agentGroups } = fleet;
  if (agentGroups !== undefined) {
    new Gauge({
      name: 'viewer_cache_agents_connected',
      help: 'Agent workers connected (a take open, a job held, or seen within 5 s), by group',
      labelNames: ['group'] as const,
      registers: [registry],
      collect() {
        // Summed over workspaces: a group is the operator's name for a fleet.
        const byGroup = new Map<string, number>();
        for (const [key, count] of Object.entries(agentGroups())) {
          const group = key.slice(key.indexOf('/') + 1);
          byGroup.set(group, (byGroup.get(group) ?? 0) + count);
        }
        this.reset();
        for (const [group, count] of byGroup) this.set({ group }, count);
      },
    });
  }
  const { queueDepth } = fleet;
  if (queueDepth !== undefined) {
    new Gauge({
      name: 'viewer_cache_queue_jobs',
      help: 'Queue mode: jobs in the queue by state (waiting, active, delayed); NaN when the queue did not answer',
      labelNames: ['state'] as const,
      registers: [registry],
      async collect() {
        const counts = await withinScrape(queueDepth());
        for (const state of ['waiting', 'active', 'delayed'] as const) {
          this.set({ state }, counts === null ? Number.NaN : counts[state]);
        }
      },
    });
  }

  const requests = new SeriesCounter({
    name: 'viewer_cache_http_requests_total',
    help: 'HTTP requests by route pattern and status',
    labelNames: ['route', 'status'] as const,
    registers: [registry],
  });
  const latency = new SeriesHistogram({
    name: 'viewer_cache_http_request_duration_seconds',
    help: 'HTTP request latency by route pattern and status class (2xx, 4xx, 5xx…)',
    labelNames: ['route', 'status_class'] as const,
    buckets: HTTP_BUCKETS,
    registers: [registry],
  });
  const jobs = new SeriesCounter({
    name: 'viewer_cache_jobs_total',
    help: 'Jobs by outcome (ok, or the error code)',
    labelNames: ['outcome'] as const,
    registers: [registry],
  });
  const runs = new SeriesHistogram({
    name: 'viewer_cache_run_duration_seconds',
    help: 'Run latency by outcome: hit, miss (executed), refused (4xx), failed (5xx)',
    labelNames: ['outcome'] as const,
    buckets: HTTP_BUCKETS,
    registers: [registry],
  });
  // Series resolved once per label set, and counted without prom-client's per-call label work
  // (series_metrics.ts). Every set is finite: route patterns, status codes, error codes,
  // outcomes.
  const requestChildren = new Map<string, { count: CounterSeries; latency: HistogramSeries }>();
  const jobChildren = new Map<string, CounterSeries>();
  const runChildren = new Map<string, HistogramSeries>();
  return {
    registry,
    observeRequest: (route, status, seconds) => {
      const key = `${status} ${route}`;
      let child = requestChildren.get(key);
      if (child === undefined) {
        child = {
          count: requests.series({ route, status: String(status) }),
          latency: latency.series({ route, status_class: `${Math.trunc(status / 100)}xx` }),
        };
        requestChildren.set(key, child);
      }
      child.count.inc();
      child.latency.observe(seconds);
    },
    observeJob: (code, outcome, seconds) => {
      let job = jobChildren.get(code);
      if (job === undefined) {
        job = jobs.series({ outcome: code });
        jobChildren.set(code, job);
      }
      job.inc();
      let run = runChildren.get(outcome);
      if (run === undefined) {
        run = runs.series({ outcome });
        runChildren.set(outcome, run);
      }
      run.observe(seconds);
    },
  };
}

/** What the server knows of its fleet, for the gauges that describe it. */
export interface MetricsFleet {
  /** Queue mode: workers (and agents) of the server's group whose heartbeat is fresh. */
  liveWorkers?: () => Promise<number>;
  /** Queue mode: live workers and agents per `workspace/group` queue. */
  queueFleet?: () => Promise<Record<string, number>>;
  /** With agents: connected agents per `workspace/group`. */
  agentGroups?: () => Record<string, number>;
  /** Queue mode: the queue's jobs by state. */
  queueDepth?: () => Promise<{ waiting: number; active: number; delayed: number }>;
}

/** A scrape must answer even while Redis does not: `NaN` (or null) after 500 ms or on failure. */
function withinScrape<T extends number | object | null>(value: Promise<T>): Promise<T | null> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), 500);
  });
  return Promise.race([value.catch(() => null), late]).finally(() => clearTimeout(timer));
}

/** From 100 µs (a hit) to 30 s (a long run). */
const HTTP_BUCKETS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
  30,
];
