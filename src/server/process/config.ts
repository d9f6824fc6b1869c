import { resolve } from 'node:path';
import { ConfigError } from '../../index.js';

/** How long a per-recipient delivery is kept, by default: 7 days. */
export const DEFAULT_OUTBOX_RETENTION_MS = 7 * 86_400_000;

/** Everything the reference server and CLI read from the environment, resolved once. */
export interface ServerConfig {
  /** Catalog + data-table cluster; null = embedded PostgreSQL under `dataDir`. */
  readonly databaseUrl: string | null;
  /**
   * A direct connection for this process's one LISTEN client, when `databaseUrl` goes through a
   * transaction-mode pooler (where LISTEN does not work); null = `databaseUrl`.
   */
  readonly listenUrl: string | null;
  /** Redis (comma-separated nodes = Cluster); null = in-process cache. */
  readonly redisUrl: string | null;
  readonly redisCluster: boolean;
  /** Prefix of every cache key in Redis, so several servers can share one Redis. */
  readonly redisPrefix: string;
  /** Longest a Redis command may take before the run goes uncached (ms). */
  readonly redisTimeoutMs: number;
  /**
   * With Redis: bytes of recent entries each process keeps in memory in front of it (0 = none,
   * Redis only, and no invalidation).
   */
  readonly memoryTierBytes: number;
  readonly host: string;
  readonly port: number;
  /** Project-local folder for embedded Postgres data, the generated secret key, … */
  readonly dataDir: string;
  /** Port of the embedded PostgreSQL. */
  readonly embeddedPgPort: number;
  /** From VIEWER_CACHE_SECRET_KEY, else generated once into `dataDir`. */
  readonly secretKey: string | null;
  readonly logLevel: string;
  /**
   * One access line per request (`VIEWER_CACHE_ACCESS_LOG=on|off`, default on): off for
   * deployments whose proxy already logs requests. /metrics counts requests either way.
   */
  readonly accessLog: boolean;
  /**
   * The access record (`VIEWER_CACHE_ACCESS_RECORD=on|off`, default off): a row per run in the
   * server's schema, the viewer as a keyed hash (see process/access_record.ts).
   */
  readonly accessRecord: boolean;
  /** Days the access record keeps a row (`VIEWER_CACHE_ACCESS_RECORD_RETENTION_DAYS`). */
  readonly accessRecordRetentionDays: number;
  /** Pretty logs (a TTY), else JSON lines. */
  readonly prettyLogs: boolean;
  /**
   * Seed the demo workspace (roles, rows, users' tokens) on start: VIEWER_CACHE_DEMO=true, or by
   * default on the embedded PostgreSQL only; never into a database you named unless asked.
   */
  readonly seedDemo: boolean;
  /**
   * The apps module the server serves (`serve --apps PATH`, VIEWER_CACHE_APPS), as an absolute
   * path; null = the demo's apps when the demo is seeded, else none.
   */
  readonly appsPath: string | null;
  /** Prefix of the demo's role names (roles are cluster-wide: lets several demos share one). */
  readonly demoRolePrefix: string;
  /** Largest request body accepted (bytes); a larger one is `413 E_PAYLOAD_TOO_LARGE`. */
  readonly bodyLimitBytes: number;
  /** Largest job result an agent worker may send back (bytes): its finish request's body. */
  readonly agentResultLimitBytes: number;
  /** Longest a client may take to send a whole request, headers and body (ms). */
  readonly requestTimeoutMs: number;
  /** Open HTTP connections, all clients together. */
  readonly maxConnections: number;
  /** Open HTTP connections from one client address (behind a proxy: the proxy's). */
  readonly maxConnectionsPerClient: number;
  /** How often the demo schedule runs. */
  readonly scheduleEveryMs: number;
  /** How long a per-recipient delivery is kept in the outbox (ms). */
  readonly outboxRetentionMs: number;
  /**
   * Where misses run: `in-process` (in the server), `queue` (on `viewer-cache worker` processes,
   * through BullMQ), or `agent` (on agent workers, which take them through the HTTP API:
   * `viewer-cache worker --agent`).
   */
  readonly execution: 'in-process' | 'queue' | 'agent';
  /** With `execution: 'agent'`: the worker group whose agents run this server's jobs. */
  readonly agentGroup: string;
  /** With the queue: longest a server waits for a worker to finish a job (ms). */
  readonly queueWaitMs: number;
  /**
   * In queue mode, how long a job an agent took from the queue stays locked without a beat
   * from that agent (VIEWER_CACHE_WORKER_LOCK_MS, as a worker's lock): then it goes back to the
   * queue once, or fails E_QUEUE_WORKER_LOST. @default 30000
   */
  readonly agentLockMs: number;
  /**
   * With `--execution agent`: for this long after the server starts, a miss with no agent of
   * its group connected waits for one (agents start beside the server, or come back after its
   * restart); after it, 5 s, then E_NO_WORKERS (VIEWER_CACHE_AGENT_START_GRACE_MS). @default 60000
   */
  readonly agentStartGraceMs: number;
  /**
   * Bounds of an agent's transaction through the query proxy: longest open from its BEGIN
   * (VIEWER_CACHE_AGENT_TX_MAX_MS, default 30000), longest between two of its statements
   * (VIEWER_CACHE_AGENT_TX_IDLE_MS, default 10000), most statements
   * (VIEWER_CACHE_AGENT_TX_MAX_STATEMENTS, default 1000). Past one it is rolled back.
   */
  readonly agentTransactions: {
    readonly maxMs: number;
    readonly idleMs: number;
    readonly maxStatements: number;
  };
  /** The queue's Redis key prefix: a Cluster hash tag, one per deployment sharing a Redis. */
  readonly queuePrefix: string;
  /** The server's URL as workers reach it (their runnables' job-token child runs). */
  readonly serverUrl: string | null;
}

/**
 * The configuration, every value checked: a setting that is not understood is refused with
 * `E_CONFIG` naming it and the values it accepts, never ignored or defaulted. `flags` names the
 * command-line flag that set a variable (`{ PORT: '--port' }`), so the message names what the
 * person typed.
 */
export function readConfig(
  env: NodeJS.ProcessEnv = process.env,
  flags: Readonly<Record<string, string>> = {},
): ServerConfig {
  try {
    return readConfigOf(env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    const named = Object.entries(flags).find(([variable]) => err.message.startsWith(variable));
    if (named === undefined) throw err;
    const [variable, flag] = named;
    throw new ConfigError(`${flag}${err.message.slice(variable.length)}`);
  }
}

/** LOG_LEVEL's accepted values: pino's levels. */
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

function readConfigOf(env: NodeJS.ProcessEnv): ServerConfig {
  const port = integer(env['PORT'] ?? '3000', 'PORT', 0, 65535);
  const redisUrl = urlList(
    env['REDIS_URL'],
    'REDIS_URL',
    ['redis:', 'rediss:'],
    'redis://HOST:PORT',
  );
  return {
    databaseUrl: url(env['DATABASE_URL'], 'DATABASE_URL'),
    listenUrl: url(env['VIEWER_CACHE_LISTEN_URL'], 'VIEWER_CACHE_LISTEN_URL'),
    redisUrl,
    redisCluster: env['REDIS_CLUSTER'] === 'true' || (redisUrl?.includes(',') ?? false),
    redisPrefix: env['VIEWER_CACHE_REDIS_PREFIX'] || 'vc:',
    redisTimeoutMs: integer(
      env['VIEWER_CACHE_REDIS_TIMEOUT_MS'] ?? '200',
      'VIEWER_CACHE_REDIS_TIMEOUT_MS',
      1,
      60_000,
    ),
    memoryTierBytes: integer(
      env['VIEWER_CACHE_MEMORY_TIER_BYTES'] ?? String(64 << 20),
      'VIEWER_CACHE_MEMORY_TIER_BYTES',
      0,
      Number.MAX_SAFE_INTEGER,
    ),
    host: env['HOST'] || '127.0.0.1',
    port,
    dataDir: resolve(env['VIEWER_CACHE_DATA_DIR'] || '.viewer-cache'),
    embeddedPgPort: integer(
      env['VIEWER_CACHE_PG_PORT'] ?? '54329',
      'VIEWER_CACHE_PG_PORT',
      1,
      65535,
    ),
    secretKey: secretKey(env['VIEWER_CACHE_SECRET_KEY']),
    logLevel: oneOf(env['LOG_LEVEL'], 'LOG_LEVEL', LOG_LEVELS) ?? 'info',
    accessLog: onOff(env['VIEWER_CACHE_ACCESS_LOG'], 'VIEWER_CACHE_ACCESS_LOG') ?? true,
    accessRecord: onOff(env['VIEWER_CACHE_ACCESS_RECORD'], 'VIEWER_CACHE_ACCESS_RECORD') ?? false,
    accessRecordRetentionDays: integer(
      env['VIEWER_CACHE_ACCESS_RECORD_RETENTION_DAYS'] || '90',
      'VIEWER_CACHE_ACCESS_RECORD_RETENTION_DAYS',
      1,
      36_500,
    ),
    prettyLogs: prettyLogs(oneOf(env['LOG_FORMAT'], 'LOG_FORMAT', ['json', 'pretty'])),
    seedDemo: seedDemo(env),
    appsPath: env['VIEWER_CACHE_APPS'] ? resolve(env['VIEWER_CACHE_APPS']) : null,
    demoRolePrefix: env['VIEWER_CACHE_DEMO_ROLE_PREFIX'] || '',
    bodyLimitBytes: integer(
      env['VIEWER_CACHE_BODY_LIMIT_BYTES'] ?? '65536',
      'VIEWER_CACHE_BODY_LIMIT_BYTES',
      1024,
      64 << 20,
    ),
    agentResultLimitBytes: integer(
      env['VIEWER_CACHE_AGENT_RESULT_LIMIT_BYTES'] ?? String(16 << 20),
      'VIEWER_CACHE_AGENT_RESULT_LIMIT_BYTES',
      1024,
      256 << 20,
    ),
    requestTimeoutMs: integer(
      env['VIEWER_CACHE_REQUEST_TIMEOUT_MS'] ?? '10000',
      'VIEWER_CACHE_REQUEST_TIMEOUT_MS',
      100,
      600_000,
    ),
    maxConnections: integer(
      env['VIEWER_CACHE_MAX_CONNECTIONS'] ?? '1000',
      'VIEWER_CACHE_MAX_CONNECTIONS',
      1,
      1_000_000,
    ),
    maxConnectionsPerClient: integer(
      env['VIEWER_CACHE_MAX_CONNECTIONS_PER_CLIENT'] ?? '100',
      'VIEWER_CACHE_MAX_CONNECTIONS_PER_CLIENT',
      1,
      1_000_000,
    ),
    scheduleEveryMs: integer(
      env['VIEWER_CACHE_SCHEDULE_MS'] ?? '60000',
      'VIEWER_CACHE_SCHEDULE_MS',
      1000,
      86_400_000,
    ),
    outboxRetentionMs: integer(
      env['VIEWER_CACHE_OUTBOX_RETENTION_MS'] ?? String(DEFAULT_OUTBOX_RETENTION_MS),
      'VIEWER_CACHE_OUTBOX_RETENTION_MS',
      1000,
      10 * 365 * 86_400_000,
    ),
    execution: execution(env['VIEWER_CACHE_EXECUTION']),
    agentGroup: agentGroup(env['VIEWER_CACHE_AGENT_GROUP'] || 'default'),
    queueWaitMs: integer(
      env['VIEWER_CACHE_QUEUE_WAIT_MS'] ?? '60000',
      'VIEWER_CACHE_QUEUE_WAIT_MS',
      100,
      3_600_000,
    ),
    agentLockMs: integer(
      env['VIEWER_CACHE_WORKER_LOCK_MS'] || '30000',
      'VIEWER_CACHE_WORKER_LOCK_MS',
      1000,
      3_600_000,
    ),
    agentStartGraceMs: integer(
      env['VIEWER_CACHE_AGENT_START_GRACE_MS'] || '60000',
      'VIEWER_CACHE_AGENT_START_GRACE_MS',
      0,
      3_600_000,
    ),
    agentTransactions: {
      maxMs: integer(
        env['VIEWER_CACHE_AGENT_TX_MAX_MS'] || '30000',
        'VIEWER_CACHE_AGENT_TX_MAX_MS',
        100,
        3_600_000,
      ),
      idleMs: integer(
        env['VIEWER_CACHE_AGENT_TX_IDLE_MS'] || '10000',
        'VIEWER_CACHE_AGENT_TX_IDLE_MS',
        100,
        3_600_000,
      ),
      maxStatements: integer(
        env['VIEWER_CACHE_AGENT_TX_MAX_STATEMENTS'] || '1000',
        'VIEWER_CACHE_AGENT_TX_MAX_STATEMENTS',
        1,
        1_000_000,
      ),
    },
    queuePrefix: queuePrefix(env['VIEWER_CACHE_QUEUE_PREFIX']),
    serverUrl: env['VIEWER_CACHE_SERVER_URL'] || null,
  };
}

/** `pretty` or `json` as asked; unset: pretty on a terminal, JSON lines otherwise. */
function prettyLogs(format: string | undefined): boolean {
  return format === undefined ? process.stdout.isTTY === true : format === 'pretty';
}

/** One of `accepted`, or undefined when unset; anything else is refused, naming the variable. */
function oneOf(raw: string | undefined, name: string, accepted: readonly string[]) {
  if (raw === undefined || raw === '') return undefined;
  if (accepted.includes(raw)) return raw;
  throw new ConfigError(
    `${name} must be one of ${accepted.join(', ')} (got ${JSON.stringify(raw.slice(0, 40))})`,
  );
}

/** A postgres:// URL, or null when unset; anything else is refused before anything connects. */
function url(raw: string | undefined, name: string): string | null {
  if (raw === undefined || raw === '') return null;
  let parsed: URL | null = null;
  try {
    parsed = new URL(raw);
  } catch {}
  if (parsed === null || !['postgres:', 'postgresql:'].includes(parsed.protocol)) {
    // The value is not echoed: a connection string may carry a password.
    throw new ConfigError(
      `${name} must be a postgres:// (or postgresql://) URL, like postgres://USER:PASSWORD@HOST:5432/DATABASE`,
    );
  }
  return raw;
}

/** A comma-separated list of URLs of these protocols (Cluster nodes), or null when unset. */
function urlList(
  raw: string | undefined,
  name: string,
  protocols: readonly string[],
  example: string,
): string | null {
  if (raw === undefined || raw === '') return null;
  for (const node of raw.split(',')) {
    let parsed: URL | null = null;
    try {
      // A Cluster node may be written HOST:PORT, as connections.ts reads it.
      const entry = node.trim();
      if (entry.includes('://')) parsed = new URL(entry);
      else if (/^[^:/\s]+:\d{1,5}$/.test(entry)) parsed = new URL(`${protocols[0]}//${entry}`);
    } catch {}
    if (parsed === null || !protocols.includes(parsed.protocol) || parsed.hostname === '') {
      throw new ConfigError(
        `${name} must be ${example} (or several, comma-separated, for a Cluster); ${protocols.join(' or ')} URLs only`,
      );
    }
  }
  return raw;
}

/** The secret key, at least 32 bytes, or null when unset (never echoed). */
function secretKey(raw: string | undefined): string | null {
  if (raw === undefined || raw === '') return null;
  if (Buffer.byteLength(raw, 'utf8') < 32) {
    throw new ConfigError(
      'VIEWER_CACHE_SECRET_KEY must be at least 32 bytes (e.g. 64 hex characters: openssl rand -hex 32)',
    );
  }
  return raw;
}

function agentGroup(raw: string): string {
  if (/^[a-z0-9][a-z0-9_-]{0,62}$/.test(raw)) return raw;
  throw new ConfigError(
    `VIEWER_CACHE_AGENT_GROUP must be 1–63 lowercase letters, digits, _ or - (got ${JSON.stringify(raw)})`,
  );
}

function queuePrefix(raw: string | undefined): string {
  if (raw === undefined || raw === '') return '{viewer-cache}';
  // BullMQ's scripts touch several keys of a queue at once: on a Cluster they must share a slot.
  if (!/^\{[A-Za-z0-9_.:-]{1,64}\}$/.test(raw)) {
    throw new ConfigError(
      `VIEWER_CACHE_QUEUE_PREFIX must be a hash tag like {viewer-cache} (got ${JSON.stringify(raw)})`,
    );
  }
  return raw;
}

function execution(raw: string | undefined): ServerConfig['execution'] {
  // `process` is the spelling the agent-workers work first used; both mean "here".
  if (raw === undefined || raw === '' || raw === 'in-process' || raw === 'process')
    return 'in-process';
  if (raw === 'queue' || raw === 'agent') return raw;
  throw new ConfigError(
    `VIEWER_CACHE_EXECUTION must be in-process, queue or agent (got ${JSON.stringify(raw)})`,
  );
}

/**
 * The demo is seeded when asked, or by default on the embedded PostgreSQL when no apps module is
 * given. Your apps and the demo's are not served together: asking for both is refused.
 */
function seedDemo(env: NodeJS.ProcessEnv): boolean {
  const asked = flag(env['VIEWER_CACHE_DEMO'], 'VIEWER_CACHE_DEMO');
  if (asked === true && env['VIEWER_CACHE_APPS']) {
    throw new ConfigError(
      'VIEWER_CACHE_APPS (--apps) and VIEWER_CACHE_DEMO (--demo) exclude each other: the server serves your apps or the demo',
    );
  }
  return asked ?? (!env['DATABASE_URL'] && !env['VIEWER_CACHE_APPS']);
}

/** `true`/`false`, or undefined when unset; anything else is refused, naming the variable. */
function flag(raw: string | undefined, name: string): boolean | undefined {
  if (raw === undefined || raw === '') return undefined;
  if (raw === 'true' || raw === '1') return true;
  if (raw === 'false' || raw === '0') return false;
  throw new ConfigError(`${name} must be true or false (got ${JSON.stringify(raw)})`);
}

/** `on`/`off`, or undefined when unset; anything else is refused, naming the variable. */
function onOff(raw: string | undefined, name: string): boolean | undefined {
  if (raw === undefined || raw === '') return undefined;
  if (raw === 'on') return true;
  if (raw === 'off') return false;
  throw new ConfigError(`${name} must be on or off (got ${JSON.stringify(raw)})`);
}

function integer(raw: string, name: string, min: number, max: number): number {
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new ConfigError(
      `${name} must be an integer between ${min} and ${max} (got ${JSON.stringify(raw)})`,
    );
  }
  return value;
}
