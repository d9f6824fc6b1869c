import {
  createEmbedVerifier,
  InvalidJobError,
  type Logger,
  WORKSPACE_RE,
  withResultCache,
} from '../../index.js';
import { Scheduler } from '../apps/scheduler.js';
import { EmbedKeys } from '../credentials/embed_keys.js';
import { ApiTokens } from '../credentials/tokens.js';
import { DEMO_WORKSPACE, seedDemo } from '../demo/demo.js';
import { buildHttpApp } from '../http/http.js';
import { AccessRecord } from '../process/access_record.js';
import type { ServerConfig } from '../process/config.js';
import { createMetrics } from '../process/metrics.js';
import { BackoffPoller } from '../process/poll_backoff.js';
import { Outbox } from '../recipients/outbox.js';
import { PerRecipientRuns } from '../recipients/per_recipient_runs.js';
import { openAssembly } from './assembly.js';
import { openExecution } from './execution.js';

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
  let baseUrl = '';
  // The job-token route of a workspace, from parts that were validated here: a runnable's
  // workspace cannot steer a live job token to another route or host.
  const childRunUrl = (workspace: string) => {
    if (!WORKSPACE_RE.test(workspace)) throw new InvalidJobError('invalid workspace');
    return new URL(`/api/w/${encodeURIComponent(workspace)}/jobs/run_child`, baseUrl);
  };
  const assembly = await openAssembly(config, logger, {
    role: 'server',
    apps: { childRunUrl, whenNone: 'warn' },
    store: true,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const { apps: world, database, secretKey, datatables, pool, storeState, busState } = assembly;
  const { releases, stillStarting } = assembly;
  const close = () => assembly.release();
  try {
    const { executor, jobTokens, liveWorkers, queueDepth, agents } = await openExecution(
      config,
      assembly,
    );
    // Sealed: whoever can write to the shared Redis must not be able to serve forged rows.
    const cache = withResultCache(executor, assembly.cacheOptions);
    const apiTokens = new ApiTokens(pool, { logger });
    await apiTokens.start();
    releases.push(async () => apiTokens.stop());
    const embedKeys = new EmbedKeys(pool, { logger });
    await embedKeys.start();
    releases.push(async () => embedKeys.stop());

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
    const sweeper = new BackoffPoller({
      periodMs: Math.max(1000, Math.min(config.outboxRetentionMs / 4, 600_000)),
      poll: async () => void (await outbox.sweep()),
      answeredAgain: (failedPolls) => logger.info({ failedPolls }, 'outbox sweep answering again'),
      failed: (err, { failedPolls, retryInMs }) =>
        logger.warn(
          { code: (err as { code?: unknown }).code, failedPolls, retryInMs },
          'outbox sweep failed',
        ),
    });
    await sweeper.start({ pollFirst: false });
    releases.push(async () => sweeper.stop());
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
    releases.push(async () => scheduler.stop());
    const metrics = createMetrics(cache, datatables, {
      ...(liveWorkers ? { liveWorkers } : {}),
      ...(queueDepth ? { queueDepth } : {}),
      ...(agents ? { agentGroups: () => agents.dispatch.presence.groups() } : {}),
    });
    let accessRecord: AccessRecord | undefined;
    if (config.accessRecord) {
      accessRecord = new AccessRecord(pool, secretKey, {
        logger,
        retentionDays: config.accessRecordRetentionDays,
      });
      accessRecord.start();
      const record = accessRecord;
      releases.push(() => record.close());
    }
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
      jobTokens,
      ...(liveWorkers ? { liveWorkers } : {}),
      ...(config.execution === 'agent' ? { agentGroup: config.agentGroup } : {}),
      embedVerifier: createEmbedVerifier({ keys: embedKeys }),
      metrics,
      requestTimeoutMs: config.requestTimeoutMs,
      accessLog: config.accessLog,
      ...(accessRecord === undefined ? {} : { accessRecord }),
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
              transactionLimits: {
                maxDuration: config.agentTransactions.maxMs,
                idleTimeout: config.agentTransactions.idleMs,
                maxStatements: config.agentTransactions.maxStatements,
              },
              onJobEnded: agents.onJobEnded,
            },
          }
        : {}),
      ...(busState ? { busState } : {}),
    });
    releases.push(() => app.close());
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
