/**
 * Opening a process, written once for `serve`, `worker` and the CLI: in order, the apps, the
 * database (given or embedded), the secret key, the data tables (with the listener), the
 * process's pool and its migrations, the cache store and the one block of cache options. Each
 * thing opened pushes its clean-up on a {@link ReleaseStack}; a step that fails, or a signal
 * aborted between steps, releases what was opened and rejects.
 */
import pg from 'pg';
import {
  type CacheStore,
  createDatatables,
  type Datatables,
  type Logger,
  migrateQueue,
  type RawResultCacheOptions,
} from '../../index.js';
import type { ServedApps } from '../apps/apps.js';
import { NO_APPS } from '../apps/apps_loader.js';
import { DEMO_APPS, loadApps } from '../demo/demo_apps.js';
import type { ServerConfig } from '../process/config.js';
import { loadSecretKey, openCacheStore, openDatabase } from '../process/connections.js';
import type { EmbeddedPostgresHandle } from '../process/embedded_postgres.js';
import { migrateServer } from '../process/server_migrations.js';
import { ReleaseStack } from './release_stack.js';

/** Which process is opened: it names the connections and picks the migrations. */
export type AssemblyRole = 'server' | 'worker' | 'cli';

// What differs by process; everything else is the same steps in the same order.
const ROLES = {
  // One LISTEN connection per process, named with the pid so each is found in pg_stat_activity.
  server: { poolMax: 4, name: 'viewer-cache-server', listener: 'viewer-cache-listener' },
  worker: { poolMax: 4, name: 'viewer-cache-worker', listener: 'viewer-cache-worker-listener' },
  // The CLI listens to nothing: it waits for running servers to acknowledge its changes.
  cli: { poolMax: 2, name: undefined, listener: null },
} as const;

export interface AssemblyOptions {
  readonly role: AssemblyRole;
  /**
   * The apps the process runs: your module (`--apps`), or the demo's with `--demo`. With none
   * configured, `'warn'` serves none (and says so), `'refuse'` throws a TypeError with
   * `refusal`. Absent: none are loaded (the CLI).
   */
  readonly apps?: {
    readonly childRunUrl: (workspace: string) => URL;
    readonly whenNone: 'warn' | 'refuse';
    readonly refusal?: string;
  };
  /** Opens the cache store (Redis or in process) and the cache options over it. */
  readonly store?: boolean;
  /** Checked between steps: a stop asked for during start-up is not kept waiting. */
  readonly signal?: AbortSignal;
}

/** What {@link openAssembly} opened; `release()` closes it all, once, last-opened first. */
export interface Assembly {
  readonly logger: Logger;
  readonly apps: ServedApps;
  readonly database: { readonly url: string; readonly embedded: EmbeddedPostgresHandle | null };
  readonly secretKey: string;
  readonly datatables: Datatables;
  readonly pool: pg.Pool;
  /** Where the caller pushes what it opens next, so one release closes everything. */
  readonly releases: ReleaseStack;
  /** Throws the signal's reason when it was aborted. */
  stillStarting(): void;
  release(): Promise<void>;
}

/** With `store: true`: the cache store and the one block of result-cache options over it. */
export interface AssemblyWithStore extends Assembly {
  readonly store: CacheStore;
  readonly storeState?: () => Promise<string>;
  readonly busState?: () => 'confirmed' | 'unconfirmed';
  /**
   * The result cache's options, the same in every process so the keys are the same: the store,
   * the data tables' fingerprint and the seal (whoever can write to a shared Redis must not be
   * able to serve forged rows).
   */
  readonly cacheOptions: RawResultCacheOptions;
}

export function openAssembly(
  config: ServerConfig,
  logger: Logger,
  options: AssemblyOptions & { store: true },
): Promise<AssemblyWithStore>;
export function openAssembly(
  config: ServerConfig,
  logger: Logger,
  options: AssemblyOptions,
): Promise<Assembly>;
/** Opens a process's parts in order (see the file's comment). */
export async function openAssembly(
  config: ServerConfig,
  logger: Logger,
  options: AssemblyOptions,
): Promise<Assembly | AssemblyWithStore> {
  const role = ROLES[options.role];
  const releases = new ReleaseStack();
  const stillStarting = () => options.signal?.throwIfAborted();
  try {
    // The apps first: a module that is refused leaves nothing started and nothing written.
    // Nothing of the demo runs against a database it did not seed (its schedules would fail).
    stillStarting();
    let apps = NO_APPS;
    if (options.apps !== undefined) {
      const source = config.appsPath ?? (config.seedDemo ? DEMO_APPS : null);
      if (source !== null) {
        apps = await loadApps(source, { childRunUrl: options.apps.childRunUrl, env: process.env });
      } else if (options.apps.whenNone === 'refuse') {
        throw new TypeError(options.apps.refusal ?? 'no apps: give --apps PATH or --demo');
      } else {
        logger.warn('no apps to serve: start with --apps PATH (VIEWER_CACHE_APPS), or --demo');
      }
    }

    // The database before the secret key: an embedded PostgreSQL refused as root (a folder its
    // OS user cannot enter) is refused before the key is written into the data folder.
    stillStarting();
    const database = await openDatabase(config, logger, options.signal);
    const { embedded } = database;
    if (embedded !== null) releases.push(() => embedded.stop());
    stillStarting();
    const secretKey = await loadSecretKey(config);

    stillStarting();
    const datatables = await createDatatables({
      connection: database.url,
      ...(role.listener === null
        ? { catalog: { awaitPropagation: true } }
        : {
            // Direct to Postgres when DATABASE_URL is a transaction pooler (LISTEN needs a session).
            listenConnection: {
              connectionString: config.listenUrl ?? database.url,
              application_name: `${role.listener} ${process.pid}`,
            },
          }),
      secretKey,
      logger,
    });
    releases.push(() => datatables.close());

    stillStarting();
    const pool = new pg.Pool({
      connectionString: database.url,
      max: role.poolMax,
      ...(role.name === undefined ? {} : { application_name: role.name }),
    });
    // An idle client's failure; the next query reports its own.
    pool.on('error', (err) =>
      logger.warn({ err: err.message }, `${options.role} database connection lost`),
    );
    // A lent connection that dies between two statements emits 'error' with nobody listening
    // (pg-pool listens only while a connection is idle): a crash. The statement fails on its own.
    pool.on('connect', (client) => client.on('error', () => {}));
    releases.push(() => pool.end());
    if (options.role === 'worker') await migrateQueue(pool);
    else await migrateServer(pool);

    const base: Assembly = {
      logger,
      apps,
      database,
      secretKey,
      datatables,
      pool,
      releases,
      stillStarting,
      release: () => releases.release(),
    };
    if (options.store !== true) return base;

    stillStarting();
    const cleanup: (() => Promise<unknown>)[] = [];
    const opened = await openCacheStore(config, logger, cleanup).finally(() => {
      for (const step of cleanup) releases.push(step);
    });
    stillStarting();
    return {
      ...base,
      ...opened,
      cacheOptions: {
        store: opened.store,
        fingerprint: datatables.fingerprint,
        logger,
        seal: { secretKey },
      },
    };
  } catch (err) {
    await releases.release();
    throw err;
  }
}
