import pg from 'pg';
import { pino } from 'pino';
import {
  type CacheStore,
  createDatatables,
  createEmbedVerifier,
  createExecutor,
  type Datatables,
  InvalidJobError,
  type Logger,
  MemoryCacheStore,
  RedisCacheStore,
  TwoTierCacheStore,
  withResultCache,
} from '../index.js';
import { DEMO_APPS, loadApps, NO_APPS } from './apps_loader.js';
import type { ServerConfig } from './config.js';
import { loadSecretKey, openDatabase, openRedis } from './connections.js';
import { DEMO_WORKSPACE, seedDemo } from './demo.js';
import { EmbedKeys } from './embed_keys.js';
import { buildHttpApp } from './http.js';
import { WORKSPACE_RE } from './http_schemas.js';
import { createMetrics } from './metrics.js';
import { Outbox } from './outbox.js';
import { PerRecipientRuns } from './per_recipient_runs.js';
import { Scheduler } from './scheduler.js';
import { migrateServer } from './server_migrations.js';
import { redisReadiness } from './store_readiness.js';
import { ApiTokens, JobTokens } from './tokens.js';

export { loadSecretKey, openDatabase, openRedis } from './connections.js';

/**
 * pino, pretty on a TTY; identities, tokens, passwords and args are redacted wherever they
 * appear. JSON lines are written asynchronously and in batches (Fastify's two synchronous
 * lines per request were 22 % of a cached request's CPU): at most 250 ms late, and
 * `logger.flush()` on shutdown (or pino's exit hook) writes what is left.
 */
export function createServerLogger(
  config: Pick<ServerConfig, 'logLevel' | 'prettyLogs'>,
  /** File descriptor or path of the JSON lines (benchmarks write to /dev/null). @default 1 */
  destination: number | string = 1,
): Logger {
  const options = {
    level: config.logLevel,
    redact: {
      paths: [
        'req.headers.authorization',
        'password',
        '*.password',
        'token',
        '*.token',
        'args',
        '*.args',
        'email',
        '*.email',
        'viewer',
        '*.viewer',
      ],
      censor: '[redacted]',
    },
  };
  if (config.prettyLogs) {
    return pino({
      ...options,
      transport: {
        target: 'pino-pretty',
        options: { colorize: true, translateTime: 'SYS:HH:MM:ss' },
      },
    });
  }
  // Buffered up to 4 KiB per write, and flushed at least every 250 ms so a quiet server's lines
  // still show promptly. Each async write costs a syscall and a thread-pool round trip (7 % of
  // a cached request's CPU when every line was its own write).
  const stream = pino.destination({ dest: destination, sync: false, minLength: 4096 });
  setInterval(() => stream.flush(), 250).unref();
  return pino(options, stream);
}

export interface RunningServer {
  readonly url: string;
  readonly demoTokens: Record<string, string>;
  close(): Promise<void>;
}

/**
 * Starts the reference server: Postgres (given or embedded), the catalog, the cache store (Redis
 * or in process), the executor with the apps module's runnables (or the demo's), the scheduler and the HTTP API.
 */
export async function startServer(config: ServerConfig, logger: Logger): Promise<RunningServer> {
  const cleanup: (() => Promise<unknown>)[] = [];
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

    const secretKey = await loadSecretKey(config);
    const database = await openDatabase(config, logger);
    if (database.embedded !== null) cleanup.push(() => database.embedded!.stop());

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
    const pool = new pg.Pool({
      connectionString: database.url,
      max: 4,
      application_name: 'viewer-cache-server',
    });
    pool.on('error', (err) => logger.warn({ err: err.message }, 'server database connection lost'));
    cleanup.push(() => pool.end());
    await migrateServer(pool);

    let store: CacheStore;
    let storeState: (() => Promise<string>) | undefined;
    if (config.redisUrl !== null) {
      const redis = openRedis(config);
      redis.on('error', (err: Error) =>
        logger.debug({ err: err.message }, 'redis connection error'),
      );
      cleanup.push(() => redis.quit());
      const shared = { redis, prefix: config.redisPrefix, commandTimeout: config.redisTimeoutMs };
      if (config.memoryTierBytes > 0) {
        // Recent entries in memory in front of Redis, and `cache invalidate` heard by everyone.
        const twoTier = new TwoTierCacheStore({
          ...shared,
          memory: { maxBytes: config.memoryTierBytes },
        });
        cleanup.push(() => twoTier.close());
        store = twoTier;
      } else {
        store = new RedisCacheStore(shared);
      }
      storeState = redisReadiness(redis, config.redisTimeoutMs);
    } else {
      store = new MemoryCacheStore();
    }

    const jobTokens = new JobTokens();
    const executor = createExecutor({ runnables: world.runnables, datatables, jobTokens, logger });
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

    const outbox = new Outbox(pool, { retentionMs: config.outboxRetentionMs });
    // Delivered rows do not accumulate: swept once before serving, then a few times per
    // retention (at most every 10 minutes); reads skip expired rows between sweeps anyway.
    await outbox.sweep();
    const sweeper = setInterval(
      () => {
        outbox.sweep().catch((err: { code?: unknown }) => {
          logger.warn({ code: err.code }, 'outbox sweep failed');
        });
      },
      Math.max(1000, Math.min(config.outboxRetentionMs / 4, 600_000)),
    );
    sweeper.unref();
    cleanup.push(async () => clearInterval(sweeper));
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
      jobTokens,
      embedVerifier: createEmbedVerifier({ keys: embedKeys }),
      metrics,
      requestTimeoutMs: config.requestTimeoutMs,
      bodyLimit: config.bodyLimitBytes,
      maxConnections: config.maxConnections,
      maxConnectionsPerClient: config.maxConnectionsPerClient,
      ...(storeState ? { storeState } : {}),
    });
    cleanup.push(() => app.close());
    const address = await app.listen({ host: config.host, port: config.port });
    baseUrl = address.replace('[::1]', 'localhost');
    // The first scheduled run happens before anyone is told the server is up.
    await scheduler.tick();
    scheduler.start(config.scheduleEveryMs);
    return { url: baseUrl, demoTokens, close };
  } catch (err) {
    await close();
    throw err;
  }
}
