/*
 * The operator's routes: the cache's counters, liveness, readiness within a bound (readiness.ts)
 * and Prometheus metrics. Nobody's answers, the state of now: every one is `live` (never kept by
 * a cache in front).
 */
import type { FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import type { CachedExecutor, Datatables } from '../../index.js';
import type { AgentPresence } from '../agents/agent_presence.js';
import { type Check, createReadiness } from './readiness.js';

/** What the operator's routes read (a part of the HTTP app's dependencies). */
export interface OperatorDeps {
  readonly cache: Pick<CachedExecutor, 'stats' | 'inFlight'>;
  readonly datatables: Pick<Datatables, 'generation' | 'listenerUp' | 'ping'>;
  readonly metrics: { readonly registry: Registry };
  readonly busState?: (() => string) | undefined;
  readonly storeState?: Check | undefined;
  readonly liveWorkers?: (() => Promise<number>) | undefined;
  readonly queueFleet?: (() => Promise<Record<string, number>>) | undefined;
  readonly agentGroup?: string | undefined;
  readonly agents?: { readonly dispatch: { readonly presence: AgentPresence } } | undefined;
}

const live = { caching: 'live' } as const;

/** Registers `/api/cache/stats`, `/healthz`, `/readyz` and `/metrics` on `app`. */
export function registerOperatorRoutes(app: FastifyInstance, deps: OperatorDeps): void {
  app.get('/api/cache/stats', { config: live }, async () => ({
    ...deps.cache.stats,
    inFlight: deps.cache.inFlight,
    catalogGeneration: deps.datatables.generation,
    catalogListener: deps.datatables.listenerUp,
    invalidationBus: deps.busState?.() ?? 'none',
  }));

  app.get('/healthz', { config: live }, async () => ({ ok: true }));
  // Each dependency asked at once and answered within a bound (readiness.ts): a hung
  // PostgreSQL or Redis is `timeout`, never a hung probe.
  let workers: number | undefined;
  let queues: Record<string, number> | undefined;
  const checks: Record<string, Check> = {
    postgres: () => deps.datatables.ping().then(() => 'ok'),
  };
  if (deps.storeState) checks['redis'] = deps.storeState;
  if (deps.liveWorkers) {
    const liveWorkers = deps.liveWorkers;
    // Jobs on workers: misses wait for one, so none alive is not ready.
    checks['workers'] = async () => {
      workers = 0; // until this round's count arrives (a timeout reports none)
      if (deps.queueFleet !== undefined) queues = {};
      // One read of the fleet's heartbeats answers both (reads in flight are shared).
      const [n, perQueue] = await Promise.all([liveWorkers(), deps.queueFleet?.()]);
      workers = n;
      queues = perQueue;
      return workers > 0 ? 'ok' : 'none';
    };
  }
  const group = deps.agentGroup;
  const presence = deps.agents?.dispatch.presence;
  if (presence !== undefined && group !== undefined) {
    // Jobs on agents of the server's group: none connected is not ready.
    checks['agents'] = async () =>
      Object.entries(presence.groups()).some(([key, n]) => key.endsWith(`/${group}`) && n > 0)
        ? 'ok'
        : 'none';
  }
  const readiness = createReadiness(checks);
  app.get('/readyz', { config: live }, async (_request, reply) => {
    const { status, checks: states } = await readiness();
    // Reported, not required: an unconfirmed bus costs a round trip per lookup, never a stale
    // entry, and the runs are still cached.
    const bus = deps.busState?.();
    const agents = presence?.groups();
    return reply.status(status).send({
      ok: status === 200,
      checks: states,
      ...(bus === undefined ? {} : { invalidations: bus }),
      ...(workers === undefined ? {} : { workers }),
      ...(queues === undefined ? {} : { queues }),
      ...(agents === undefined ? {} : { agents }),
    });
  });

  app.get('/metrics', { config: live }, async (_request, reply) => {
    reply.header('content-type', deps.metrics.registry.contentType);
    return deps.metrics.registry.metrics();
  });
}
