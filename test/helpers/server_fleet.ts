import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './free_port.js';
import { ServerProcess, serverEnv } from './server_process.js';

// Several reference servers as child processes sharing one database (and one Redis or Redis
// Cluster, or none), each on its own port and data folder, started all at once — the way an
// orchestrator starts replicas. Used by the many-processes suite and bench/propagation_bench.ts.

export interface FleetOptions {
  /** Superuser URL of the shared database. */
  readonly databaseUrl: string;
  /** Demo role prefix (roles are cluster-wide). */
  readonly prefix: string;
  readonly secretKey: string;
  /** Shared Redis (`redis://…`, or comma-separated Cluster nodes); none = in-process stores. */
  readonly redisUrl?: string;
  readonly redisPrefix?: string;
  readonly count?: number;
  /** More environment for every server. */
  readonly env?: Record<string, string>;
}

export class ServerFleet {
  readonly servers: ServerProcess[] = [];
  readonly urls: string[] = [];
  /** The environment of server 0, for the CLI. */
  cliEnv: NodeJS.ProcessEnv = {};
  readonly #dirs: string[] = [];

  private constructor(readonly options: FleetOptions) {}

  /**
   * Starts every server at the same moment; resolves once all are ready. If one fails, the
   * others are stopped and the error (with the failing server's output) is thrown.
   */
  static async start(options: FleetOptions): Promise<ServerFleet> {
    const fleet = new ServerFleet(options);
    try {
      const envs: NodeJS.ProcessEnv[] = [];
      for (let i = 0; i < (options.count ?? 3); i++) {
        const dir = await mkdtemp(join(tmpdir(), 'viewer-cache-fleet-'));
        fleet.#dirs.push(dir);
        envs.push(
          serverEnv({
            DATABASE_URL: options.databaseUrl,
            VIEWER_CACHE_SECRET_KEY: options.secretKey,
            VIEWER_CACHE_DEMO: 'true',
            VIEWER_CACHE_DEMO_ROLE_PREFIX: options.prefix,
            VIEWER_CACHE_DATA_DIR: dir,
            VIEWER_CACHE_SCHEDULE_MS: '86400000',
            // A loaded machine must not turn hits into uncached runs.
            VIEWER_CACHE_REDIS_TIMEOUT_MS: '5000',
            HOST: '127.0.0.1',
            PORT: String(await freePort()),
            LOG_LEVEL: 'warn',
            ...(options.redisUrl === undefined
              ? {}
              : {
                  REDIS_URL: options.redisUrl,
                  VIEWER_CACHE_REDIS_PREFIX: options.redisPrefix ?? `vc-fleet:${options.prefix}`,
                }),
            ...options.env,
          }),
        );
      }
      fleet.cliEnv = envs[0]!;
      // Spawned in one tight loop, so their start-ups overlap as much as they can.
      for (const env of envs) fleet.servers.push(new ServerProcess(env));
      const ready = await Promise.all(fleet.servers.map((server) => server.ready));
      fleet.urls.push(...ready.map((answer) => answer.url));
      return fleet;
    } catch (err) {
      await fleet.stop();
      throw err;
    }
  }

  async stop(): Promise<void> {
    await Promise.all(this.servers.map((server) => server.kill()));
    await Promise.all(this.#dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  }
}
