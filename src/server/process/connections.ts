import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import {
  type CacheStore,
  ConfigError,
  type Logger,
  MemoryCacheStore,
  RedisCacheStore,
  TwoTierCacheStore,
  type ViewerCacheError,
} from '../../index.js';
import type { ServerConfig } from './config.js';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from './embedded_postgres.js';
import { redisReadiness } from './store_readiness.js';

// What the server and the CLI both open — the secret key, the database, Redis — without the
// HTTP server (Fastify, an optional peer), so every CLI command but `serve` runs without it.

/** The secret key from config, else the one generated into the data folder on first start. */
export async function loadSecretKey(config: ServerConfig): Promise<string> {
  if (config.secretKey !== null) return config.secretKey;
  // A key generated here would be this folder's, not the deployment's: a server or a CLI run
  // in another folder would make its own and fight this one over the logins. Only the embedded
  // PostgreSQL, which lives in this folder too, keeps a generated key beside it.
  if (config.databaseUrl !== null)
    throw new ConfigError(
      'VIEWER_CACHE_SECRET_KEY is required with DATABASE_URL (the same key for every server, worker and CLI of the deployment; e.g. openssl rand -hex 32): no key is generated for a database this folder did not create',
    );
  const file = join(config.dataDir, 'secret.key');
  if (existsSync(file)) return (await readFile(file, 'utf8')).trim();
  await mkdir(config.dataDir, { recursive: true, mode: 0o711 });
  const key = randomBytes(32).toString('hex');
  await writeFile(file, `${key}\n`, { mode: 0o600, flag: 'wx' }).catch(
    async (err: { code?: string }) => {
      if (err.code !== 'EEXIST') throw err;
    },
  );
  return (await readFile(file, 'utf8')).trim();
}

/** The database URL from config, else an embedded PostgreSQL under the data folder. */
export async function openDatabase(
  config: ServerConfig,
  logger: Logger,
  signal?: AbortSignal,
): Promise<{ url: string; embedded: EmbeddedPostgresHandle | null }> {
  if (config.databaseUrl !== null) return { url: config.databaseUrl, embedded: null };
  const embedded = await startEmbeddedPostgres(
    join(config.dataDir, 'pg'),
    config.embeddedPgPort,
    logger,
    signal,
  );
  return { url: embedded.url, embedded };
}

/** The Redis client (single node or Cluster) `REDIS_URL` names. */
export function openRedis(config: ServerConfig): Redis | Cluster {
  const url = config.redisUrl!;
  if (!config.redisCluster)
    return new Redis(url, { maxRetriesPerRequest: 1, enableOfflineQueue: false });
  return new Cluster(clusterNodes(url), {
    enableOfflineQueue: false,
    redisOptions: { maxRetriesPerRequest: 1 },
  });
}

/** How long start-up waits for the two-tier store's invalidation bus before serving anyway. */
export const CACHE_STORE_OPEN_TIMEOUT_MS = 5000;

/**
 * The cache store: Redis (with a memory tier in front unless VIEWER_CACHE_MEMORY_TIER_BYTES=0)
 * when REDIS_URL is set, else in process; the same for a server and a worker. A two-tier store
 * is awaited until usable (its bus confirmed), so the first request after the ready line is
 * cached; if Redis does not answer within {@link CACHE_STORE_OPEN_TIMEOUT_MS}, one warning
 * (`E_STORE_NOT_READY`) and the server serves uncached until it does (Redis is a cache: its
 * outage must not keep the server down; `/readyz` says `redis: down` meanwhile).
 */
export async function openCacheStore(
  config: ServerConfig,
  logger: Logger,
  cleanup: (() => Promise<unknown>)[],
): Promise<{
  store: CacheStore;
  storeState?: () => Promise<string>;
  /** The invalidation bus's state (two tiers only). */
  busState?: () => 'confirmed' | 'unconfirmed';
}> {
  let store: CacheStore;
  let storeState: (() => Promise<string>) | undefined;
  let busState: (() => 'confirmed' | 'unconfirmed') | undefined;
  if (config.redisUrl !== null) {
    const redis = openRedis(config);
    redis.on('error', (err: Error) => logger.debug({ err: err.message }, 'redis connection error'));
    cleanup.push(() => redis.quit());
    const shared = { redis, prefix: config.redisPrefix, commandTimeout: config.redisTimeoutMs };
    if (config.memoryTierBytes > 0) {
      // Recent entries in memory in front of Redis, and `cache invalidate` heard by everyone.
      const twoTier = new TwoTierCacheStore({
        ...shared,
        memory: { maxBytes: config.memoryTierBytes },
      });
      cleanup.push(() => twoTier.close());
      await twoTier
        .ready({ timeout: CACHE_STORE_OPEN_TIMEOUT_MS })
        .catch((err: ViewerCacheError) => {
          logger.warn(
            { code: err.code, err: err.message },
            'cache store not ready: Redis did not answer at start; runs go uncached until it does',
          );
        });
      store = twoTier;
      busState = () => (twoTier.invalidation.confirmed ? 'confirmed' : 'unconfirmed');
    } else {
      store = new RedisCacheStore(shared);
    }
    storeState = redisReadiness(redis, config.redisTimeoutMs);
  } else {
    store = new MemoryCacheStore();
  }

  return {
    store,
    ...(storeState === undefined ? {} : { storeState }),
    ...(busState === undefined ? {} : { busState }),
  };
}

/** The queue's Redis (jobs on workers): BullMQ's blocking reads need unlimited retries. */
export function openQueueRedis(config: ServerConfig, logger: Logger): Redis | Cluster {
  if (config.redisUrl === null) {
    throw new TypeError(
      'jobs on workers (VIEWER_CACHE_EXECUTION=queue, viewer-cache worker) need REDIS_URL',
    );
  }
  const client = config.redisCluster
    ? new Cluster(clusterNodes(config.redisUrl), { redisOptions: { maxRetriesPerRequest: null } })
    : new Redis(config.redisUrl, { maxRetriesPerRequest: null });
  client.on('error', (err: Error) => logger.debug({ err: err.message }, 'queue redis error'));
  return client;
}

function clusterNodes(url: string): { host: string; port: number }[] {
  return url.split(',').map((entry) => {
    const parsed = new URL(entry.includes('://') ? entry : `redis://${entry}`);
    return { host: parsed.hostname, port: Number(parsed.port || 6379) };
  });
}
