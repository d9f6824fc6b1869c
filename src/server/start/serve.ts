import pg from 'pg';
import {
  createDatatables,
  createEmbedVerifier,
  createExecutor,
  createQueueExecutor,
  createQueueJobSource,
  type Datatables,
  type Executor,
  InvalidJobError,
  type Logger,
  migrateQueue,
  SharedJobTokens,
  WORKSPACE_RE,
  withResultCache,
} from '../../index.js';
import {
  type AgentDispatch,
  agentExecutor,
  InProcessAgentDispatch,
} from '../agents/agent_dispatch.js';
import { QueueAgentDispatch } from '../agents/queue_agent_dispatch.js';
import { NO_APPS } from '../apps/apps_loader.js';
import { Scheduler } from '../apps/scheduler.js';
import { AgentTokens } from '../credentials/agent_tokens.js';
import { EmbedKeys } from '../credentials/embed_keys.js';
import { ApiTokens, JobTokens } from '../credentials/tokens.js';
import { DEMO_WORKSPACE, seedDemo } from '../demo/demo.js';
import { DEMO_APPS, loadApps } from '../demo/demo_apps.js';
import { buildHttpApp } from '../http/http.js';
import type { ServerConfig } from '../process/config.js';
import {
  loadSecretKey,
  openCacheStore,
  openDatabase,
  openQueueRedis,
} from '../process/connections.js';
import { createMetrics } from '../process/metrics.js';
import { PollBackoff } from '../process/poll_backoff.js';
import { migrateServer } from '../process/server_migrations.js';
import { Outbox } from '../recipients/outbox.js';
import { PerRecipientRuns } from '../recipients/per_recipient_runs.js';
import { childrenInProcess } from './children_in_process.js';

export {
  loadSecretKey,
  openCacheStore,
  openDatabase,
  openQueueRedis,
  openRedis,
} from '../process/connections.js';
export { createServerLogger, exitOnFatal } from '../process/server_logger.js';

export interface RunningServer {
  readonly url: string;
  readonly demoTokens: Record<string, string>;
  close(): Promise<void>;
}

/**
 * Starts the reference server: Postgres (given or embedded), the catalog, the cache store (Redis
 * or in process), the executor with the apps module's runnables (or the demo's), the scheduler and the HTTP API.
 */
export async function startServer(
  config: ServerConfig,
  logger: Logger,
  options: {
    /**
     * Aborted (a SIGTERM or SIGINT during start-up): start-up stops at its next step, closes
     * what it opened (embedded PostgreSQL included) and rejects with the signal's reason.
     */
    signal?: AbortSignal;
  } = {},
): Promise<RunningServer> {
  const cleanup: (() => Promise<unknown>)[] = [];
  // Between steps: a stop asked for during start-up is not kept waiting for the rest of it.
  const stillStarting = () => options.signal?.throwIfAborted();
  const close = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
  };
  try {
    let baseUrl = '';
    // The job-token route of a workspace, from parts that were validated here: a runnable's
    // workspace cannot steer a live job token to another route or host.
    const childRunUrl = (workspace: string) => {
      if (!WORKSPACE_RE.test(workspace)) throw new InvalidJobError('invalid workspace');
      return new URL(`/api/w/${encodeURIComponent(workspace)}/jobs/run_child`, baseUrl);
    };
    // Your apps module, or the demo's when the demo is seeded: nothing of the demo runs against a
    // database it did not seed (its schedules would fail there every minute). Loaded first, so a
    // module that is refused leaves nothing started and nothing written.
    const appsSource = config.appsPath ?? (config.seedDemo ? DEMO_APPS : null);
    const world =
      appsSource === null ? NO_APPS : await loadApps(appsSource, { childRunUrl, env: process.env });
    if (appsSource === null)
      logger.warn('no apps to serve: start with --apps PATH (VIEWER_CACHE_APPS), or --demo');

    // The database first: an embedded PostgreSQL refused as root (a folder its OS user cannot
    // enter) is refused before the secret key is written into the data folder.
    stillStarting();
    const database = await openDatabase(config, logger);
    if (database.embedded !== null) cleanup.push(() => database.embedded!.stop());
    stillStarting();
    const secretKey = await loadSecretKey(config);

    const datatables: Datatables = await createDatatables({
      connection: database.url,
      // One LISTEN connection per process, named with the pid so each is found in
      // pg_stat_activity; direct to Postgres when DATABASE_URL is a transaction pooler.
      listenConnection: {
        connectionString: config.listenUrl ?? database.url,
        application_name: `viewer-cache-listener ${process.pid}`,
      },
      secretKey,
      logger,
    });
    cleanup.push(() => datatables.close());
    stillStarting();
    const pool = new pg.Pool({
      connectionString: database.url,
      max: 4,
      application_name: 'viewer-cache-server',
    });
    pool.on('error', (err) => logger.warn({ err: err.message }, 'server database connection lost'));
    cleanup.push(() => pool.end());
    await migrateServer(pool);
    stillStarting();

    const { store, storeState, busState } = await openCacheStore(config, logger, cleanup);
    stillStarting();

    const jobTokens = new JobTokens();
    // With the queue, job tokens are shared (every server accepts a worker's), also those of
    // the child runs that run here (see children_in_process.ts).
    if (config.execution === 'queue') await migrateQueue(pool);
    const sharedTokens =
      config.execution === 'queue' ? new SharedJobTokens({ pool, logger }) : null;
    const local = createExecutor({
      runnables: world.runnables,
      datatables,
      jobTokens: sharedTokens ?? jobTokens,
      logger,
    });
    let executor: Executor = local;
    let liveWorkers: (() => Promise<number>) | undefined;
    let queueRedisOf = (): ReturnType<typeof openQueueRedis> => {
      throw new TypeError('no queue outside queue mode');
    };
    if (config.execution === 'queue') {
      // Misses run on workers (`viewer-cache worker`); hits are answered here, as before, and
      // job-token children run here (a parent holding the only worker slot would wait forever).
      const queueRedis = openQueueRedis(config, logger);
      queueRedisOf = () => queueRedis;
      cleanup.push(() => queueRedis.quit());
      const queue = createQueueExecutor({
        executor: local,
        pool,
        redis: queueRedis,
        secretKey,
        wait: config.queueWaitMs,
        prefix: config.queuePrefix,
        logger,
      });
      cleanup.push(() => queue.close());
      await queue.ready();
      executor = childrenInProcess({ jobs: queue, remote: queue, local });
      liveWorkers = () => queue.liveWorkers();
    }
    const shared = sharedTokens;
    // With agents, a miss is handed to an agent of the group (the same job, viewer recorded
    // here); the executor above still builds jobs and knows the runnables' versions.
    let agents: { dispatch: AgentDispatch; tokens: AgentTokens } | undefined;
    if (config.execution === 'agent' || config.execution === 'queue') {
      const tokens = new AgentTokens(pool, { logger });
      await tokens.start();
      cleanup.push(async () => tokens.stop());
      let dispatch: AgentDispatch;
      if (config.execution === 'agent') {
        dispatch = new InProcessAgentDispatch(jobTokens, {
          timeoutMs: 60_000,
          startGraceMs: config.agentStartGraceMs,
        });
      } else {
        // Queue mode: agents take from the queue every server enqueues on, beside (or instead
        // of) database workers; a job they run is cached exactly as a database worker caches it.
        const source = createQueueJobSource({
          pool,
          redis: queueRedisOf(),
          secretKey,
          lockDuration: config.agentLockMs,
          prefix: config.queuePrefix,
          logger,
        });
        cleanup.push(() => source.close());
        await source.ready();
        dispatch = new QueueAgentDispatch({
          source,
          jobTokens,
          lockMs: config.agentLockMs,
          // Tracked, as a database worker's: the agent's proxied statements are recorded
          // against this very job object (the dispatch hands it out by identity), so the set the
          // run asked is learned and shared, and the server keys on it.
          cacheAround: (agentRunner) =>
            withResultCache(agentRunner, {
              store,
              fingerprint: datatables.fingerprint,
              logger,
              seal: { secretKey },
            }),
        });
      }
      cleanup.push(async () => dispatch.close());
      agents = { dispatch, tokens };
    }
    if (agents && config.execution === 'agent') {
      // Job-token children run here, as with the queue (an agent holding the parent's slot).
      const remote = agentExecutor(agents.dispatch, config.agentGroup);
      executor = childrenInProcess({ jobs: local, remote, local });
    }
    // Sealed: whoever can write to the shared Redis must not be able to serve forged rows.
    const cache = withResultCache(executor, {
      store,
      fingerprint: datatables.fingerprint,
      logger,
      seal: { secretKey },
    });
    const apiTokens = new ApiTokens(pool, { logger });
    await apiTokens.start();
    cleanup.push(async () => apiTokens.stop());
    const embedKeys = new EmbedKeys(pool, { logger });
    await embedKeys.start();
    cleanup.push(async () => embedKeys.stop());

    let demoTokens: Record<string, string> = {};
    if (config.seedDemo) {
      const seeded = await seedDemo({
        datatables,
        databaseUrl: database.url,
        tokens: apiTokens,
        secretKey,
        rolePrefix: config.demoRolePrefix,
      });
      demoTokens = seeded.tokens;
    }
    stillStarting();

    const outbox = new Outbox(pool, { retentionMs: config.outboxRetentionMs });
    // Delivered rows do not accumulate: swept once before serving, then a few times per
    // retention (at most every 10 minutes); reads skip expired rows between sweeps anyway.
    await outbox.sweep();
    // Backs off while Postgres does not answer: one warning per step, one info line after.
    const sweeps = new PollBackoff(Math.max(1000, Math.min(config.outboxRetentionMs / 4, 600_000)));
    let sweeper: NodeJS.Timeout | undefined;
    let sweeping = true;
    const sweepLater = () => {
      if (!sweeping) return;
      sweeper = setTimeout(() => {
        outbox.sweep().then(
          () => {
            const failedPolls = sweeps.answered();
            if (failedPolls > 0) logger.info({ failedPolls }, 'outbox sweep answering again');
            sweepLater();
          },
          (err: { code?: unknown }) => {
            sweeps.failed();
            logger.warn(
              { code: err.code, failedPolls: sweeps.failures, retryInMs: sweeps.delayMs },
              'outbox sweep failed',
            );
            sweepLater();
          },
        );
      }, sweeps.delayMs);
      sweeper.unref();
    };
    sweepLater();
    cleanup.push(async () => {
      sweeping = false;
      clearTimeout(sweeper);
    });
    const perRecipient = new PerRecipientRuns({
      executor,
      cache,
      outbox,
      members: (workspace, group) => datatables.admin.listMembers(workspace, 'group', group),
      logger,
    });

    const scheduler = new Scheduler(
      world.workspace ?? DEMO_WORKSPACE,
      world.schedules,
      executor,
      cache,
      logger,
      perRecipient,
    );
    cleanup.push(async () => scheduler.stop());
    const metrics = createMetrics(cache, datatables);
    const app = buildHttpApp({
      logger,
      executor,
      cache,
      datatables,
      apps: world.apps,
      hooks: world.hooks,
      schedules: () => scheduler.status(),
      recipients: { perRecipient, outbox },
      apiTokens,
      jobTokens: {
        async verify(token: string) {
          return jobTokens.verify(token) ?? (shared === null ? null : await shared.verify(token));
        },
      },
      ...(liveWorkers ? { liveWorkers } : {}),
      ...(config.execution === 'agent' ? { agentGroup: config.agentGroup } : {}),
      embedVerifier: createEmbedVerifier({ keys: embedKeys }),
      metrics,
      requestTimeoutMs: config.requestTimeoutMs,
      accessLog: config.accessLog,
      bodyLimit: config.bodyLimitBytes,
      maxConnections: config.maxConnections,
      maxConnectionsPerClient: config.maxConnectionsPerClient,
      ...(storeState ? { storeState } : {}),
      ...(agents
        ? {
            agents: {
              agentTokens: agents.tokens,
              dispatch: agents.dispatch,
              datatables,
              resultLimitBytes: config.agentResultLimitBytes,
            },
          }
        : {}),
      ...(busState ? { busState } : {}),
    });
    cleanup.push(() => app.close());
    stillStarting();
    const address = await app.listen({ host: config.host, port: config.port });
    baseUrl = address.replace('[::1]', 'localhost');
    // The first scheduled run happens before anyone is told the server is up — in process. On
    // workers or agents it waits for one, and they may start after the server (an agent cannot
    // take it before the server is up to hand it over): it goes on meanwhile.
    if (config.execution === 'in-process') await scheduler.tick();
    else void scheduler.tick().catch(() => {});
    scheduler.start(config.scheduleEveryMs);
    return { url: baseUrl, demoTokens, close };
  } catch (err) {
    await close();
    throw err;
  }
}
