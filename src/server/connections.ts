import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import type { Logger } from '../index.js';
import type { ServerConfig } from './config.js';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from './embedded_postgres.js';

// What the server and the CLI both open — the secret key, the database, Redis — without the
// HTTP server (Fastify, an optional peer), so every CLI command but `serve` runs without it.

/** The secret key from config, else the one generated into the data folder on first start. */
export async function loadSecretKey(config: ServerConfig): Promise<string> {
  if (config.secretKey !== null) return config.secretKey;
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
): Promise<{ url: string; embedded: EmbeddedPostgresHandle | null }> {
  if (config.databaseUrl !== null) return { url: config.databaseUrl, embedded: null };
  const embedded = await startEmbeddedPostgres(
    join(config.dataDir, 'pg'),
    config.embeddedPgPort,
    logger,
  );
  return { url: embedded.url, embedded };
}

/** The Redis client (single node or Cluster) `REDIS_URL` names. */
export function openRedis(config: ServerConfig): Redis | Cluster {
  const url = config.redisUrl!;
  if (!config.redisCluster)
    return new Redis(url, { maxRetriesPerRequest: 1, enableOfflineQueue: false });
  const nodes = url.split(',').map((entry) => {
    const parsed = new URL(entry.includes('://') ? entry : `redis://${entry}`);
    return { host: parsed.hostname, port: Number(parsed.port || 6379) };
  });
  return new Cluster(nodes, {
    enableOfflineQueue: false,
    redisOptions: { maxRetriesPerRequest: 1 },
  });
}
