import type pg from 'pg';
import { parse as parseConnectionString, toClientConfig } from 'pg-connection-string';
import { resolveDuration } from '../duration.js';
import { type Logger, silentLogger } from '../logger.js';
import type { Directory } from './catalog/directory.js';
import type { RawDatatablesOptions } from './datatables_api.js';
import { PasswordDeriver } from './logins/passwords.js';

type Defaulted = Required<
  Pick<RawDatatablesOptions, 'migrate' | 'transactionPooler' | 'viewerIdentity'>
> & {
  readonly catalog: Required<NonNullable<RawDatatablesOptions['catalog']>>;
  readonly pools: Required<NonNullable<RawDatatablesOptions['pools']>>;
};

/** Every default of {@link RawDatatablesOptions}, in one place (the `@default`s of its JSDoc). */
export const DATATABLES_DEFAULTS = Object.freeze({
  migrate: true,
  transactionPooler: false,
  viewerIdentity: true,
  catalog: Object.freeze({ heartbeat: '1s', heartbeatTimeout: '1s', awaitPropagation: false }),
  pools: Object.freeze({
    max: 100,
    size: 4,
    maxConnections: 20,
    acquireTimeout: '10s',
    idleTimeout: '30s',
    statementTimeout: 0,
    prepareAhead: true,
    checkOnRelease: true,
  }),
} as const satisfies Defaulted);

/** The options after validation and defaults: what the wiring reads, and nothing else. */
export interface ResolvedDatatablesOptions {
  /** The privileged connection (catalog database). */
  readonly adminConfig: pg.ClientConfig;
  /** The LISTEN client's connection; without `application_name` unless one was given for it. */
  readonly listenConfig: pg.ClientConfig;
  /** Where login connections go: host, port, TLS… (user, password and database left out). */
  readonly loginConfig: pg.ClientConfig;
  /** Managed passwords, derived from `secretKey` (checked here: ≥ 32 bytes). */
  readonly passwords: PasswordDeriver;
  /** A plugged-in directory, or `null` for the built-in one. */
  readonly directory: Directory | null;
  readonly logger: Logger;
  readonly migrate: boolean;
  readonly viewerIdentity: boolean;
  /** Statement spans carry the sanitized statement text (see RawDatatablesOptions). */
  readonly traceStatementText: boolean;
  /** Login connections go through a transaction pooler (probed at start). */
  readonly transactionPooler: boolean;
  readonly catalog: {
    readonly heartbeatMs: number;
    readonly heartbeatTimeoutMs: number;
    readonly awaitPropagation: boolean;
  };
  readonly pools: {
    readonly size: number;
    readonly max: number;
    readonly maxConnections: number;
    readonly acquireTimeoutMs: number;
    readonly idleTimeoutMs: number;
    /** 0 = none. */
    readonly statementTimeoutMs: number;
    readonly prepareAhead: boolean;
    readonly checkOnRelease: boolean;
  };
}

/**
 * Validates `options` (a `TypeError` naming the option otherwise), applies
 * {@link DATATABLES_DEFAULTS} and precomputes what the wiring needs, once; the result is frozen.
 */
export function resolveDatatablesOptions(options: RawDatatablesOptions): ResolvedDatatablesOptions {
  if (options === null || typeof options !== 'object') throw new TypeError('options are required');
  const defaults = DATATABLES_DEFAULTS;
  const adminConfig = toConfig(options.connection);
  const passwords = new PasswordDeriver(options.secretKey);
  if (options.directory !== undefined && typeof options.directory?.principals !== 'function') {
    throw new TypeError('directory must have a principals(workspace, email) method');
  }
  const pools = options.pools ?? {};
  const size = pools.size ?? defaults.pools.size;
  const max = pools.max ?? defaults.pools.max;
  if (!Number.isInteger(size) || size < 1) throw new TypeError('pools.size must be an integer ≥ 1');
  if (!Number.isInteger(max) || max < 1) throw new TypeError('pools.max must be an integer ≥ 1');
  const maxConnections = pools.maxConnections ?? defaults.pools.maxConnections;
  if (!Number.isInteger(maxConnections) || maxConnections < 1)
    throw new TypeError('pools.maxConnections must be an integer ≥ 1');
  const {
    user: _user,
    password: _password,
    database: _database,
    ...loginConfig
  } = options.loginConnection === undefined ? adminConfig : toConfig(options.loginConnection);
  const statementTimeoutMs = resolveDuration(
    pools.statementTimeout ?? defaults.pools.statementTimeout,
    'pools.statementTimeout',
  );
  const viewerIdentity = Boolean(options.viewerIdentity ?? defaults.viewerIdentity);
  const transactionPooler = (options.transactionPooler ?? defaults.transactionPooler) === true;
  if (transactionPooler) {
    // Nothing session-scoped through a transaction pooler: each transaction may meet another
    // backend (the viewer identity is bound per transaction there). Refused at start rather
    // than failing open per run.
    if (statementTimeoutMs > 0) {
      throw new TypeError(
        'transactionPooler cannot carry pools.statementTimeout (a session setting); set statement_timeout on the pooler or the database',
      );
    }
  }
  // The admin connection's own application_name (from its URL) does not name the listener.
  const listenConfig =
    options.listenConnection === undefined
      ? { ...adminConfig, application_name: undefined }
      : toConfig(options.listenConnection);
  const catalog = options.catalog ?? {};
  return Object.freeze({
    adminConfig,
    listenConfig,
    loginConfig,
    passwords,
    directory: options.directory ?? null,
    logger: options.logger ?? silentLogger,
    migrate: Boolean(options.migrate ?? defaults.migrate),
    viewerIdentity,
    traceStatementText: options.traceStatementText === true,
    transactionPooler,
    catalog: Object.freeze({
      heartbeatMs: positive(
        resolveDuration(catalog.heartbeat ?? defaults.catalog.heartbeat, 'catalog.heartbeat'),
        'catalog.heartbeat',
      ),
      heartbeatTimeoutMs: positive(
        resolveDuration(
          catalog.heartbeatTimeout ?? defaults.catalog.heartbeatTimeout,
          'catalog.heartbeatTimeout',
        ),
        'catalog.heartbeatTimeout',
      ),
      awaitPropagation: (catalog.awaitPropagation ?? defaults.catalog.awaitPropagation) === true,
    }),
    pools: Object.freeze({
      size,
      max,
      maxConnections,
      acquireTimeoutMs: resolveDuration(
        pools.acquireTimeout ?? defaults.pools.acquireTimeout,
        'pools.acquireTimeout',
      ),
      idleTimeoutMs: resolveDuration(
        pools.idleTimeout ?? defaults.pools.idleTimeout,
        'pools.idleTimeout',
      ),
      statementTimeoutMs,
      prepareAhead: Boolean(pools.prepareAhead ?? defaults.pools.prepareAhead),
      checkOnRelease: Boolean(pools.checkOnRelease ?? defaults.pools.checkOnRelease),
    }),
  });
}

function positive(ms: number, name: string): number {
  if (!(ms > 0)) throw new TypeError(`${name} must be greater than 0`);
  return ms;
}

function toConfig(connection: string | pg.ClientConfig): pg.ClientConfig {
  if (typeof connection === 'string') {
    if (connection.length === 0)
      throw new TypeError('connection must be a postgres:// URL or a pg config');
    return toClientConfig(parseConnectionString(connection));
  }
  if (connection === null || typeof connection !== 'object') {
    throw new TypeError('connection must be a postgres:// URL or a pg config');
  }
  if (connection.connectionString !== undefined) {
    const { connectionString, ...rest } = connection;
    return { ...toClientConfig(parseConnectionString(connectionString)), ...rest };
  }
  return { ...connection };
}
