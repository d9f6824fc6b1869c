// Over 450 lines on purpose: the error catalogue is one table (class, code, default message,
// status), read top to bottom as the errors reference; split by room, a code's neighbours and
// the ErrorCode union would live in several files and drift.
/**
 * Every condition a caller may need to branch on is one of these classes. Each carries a stable
 * `code` (static and on the instance), a message a user can act on, optional context fields and
 * the original `cause`. Messages never contain viewer emails, args, keys or passwords.
 */
export class ViewerCacheError extends Error {
  static readonly code: string = 'E_VIEWER_CACHE';
  readonly code: string;
  /** HTTP status a server should answer with when this error refuses a request. */
  readonly status: number;
  /** The data table the refusal is about, when there is one. */
  declare readonly datatable?: string;
  /** The data-table role the refusal is about, when there is one (a role name, never a login). */
  declare readonly role?: string;

  constructor(message: string, options: ErrorOptions & { code?: string; status?: number } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const ctor = this.constructor as typeof ViewerCacheError;
    this.code = options.code ?? ctor.code;
    this.status = options.status ?? 500;
    this.name = ctor.name;
    if (options.datatable !== undefined) this.datatable = options.datatable;
    if (options.role !== undefined) this.role = options.role;
  }
}

/**
 * What an error may carry besides its message: the original `cause` and the context a caller
 * needs to act (which data table, which role). Never an identity: no email, args or password.
 */
export interface ErrorOptions {
  cause?: unknown;
  datatable?: string;
  role?: string;
}

/**
 * Generates one error class per code, so the catalogue stays a single table below. Each class
 * is also exported as a type of the same name (`let e: NoRolesError`).
 */
function defineError<const Code extends string>(
  code: Code,
  name: string,
  defaultMessage: string,
  status: number,
) {
  const cls = class extends ViewerCacheError {
    static override readonly code: Code = code;
    /** The message used when none is given; safe to show to anyone. */
    static readonly defaultMessage = defaultMessage;
    declare readonly code: Code;
    constructor(message: string = defaultMessage, options: ErrorOptions = {}) {
      super(message, { ...options, code, status });
    }
  };
  Object.defineProperty(cls, 'name', { value: name });
  return cls;
}

/** Args contain a value JSON cannot carry faithfully (BigInt, function, symbol, cycle, …). */
export const ArgsNotJsonError = defineError(
  'E_ARGS_NOT_JSON',
  'ArgsNotJsonError',
  'job args must be plain JSON data',
  400,
);
export type ArgsNotJsonError = InstanceType<typeof ArgsNotJsonError>;
/** A job or origin is malformed (missing workspace, runnable, …). */
export const InvalidJobError = defineError(
  'E_INVALID_JOB',
  'InvalidJobError',
  'the job is malformed',
  400,
);
export type InvalidJobError = InstanceType<typeof InvalidJobError>;
/** The runnable path is not registered, or its hash does not match the registered version. */
export const UnknownRunnableError = defineError(
  'E_UNKNOWN_RUNNABLE',
  'UnknownRunnableError',
  'no runnable is registered under that path and hash',
  404,
);
export type UnknownRunnableError = InstanceType<typeof UnknownRunnableError>;
/** The runnable threw. The original error is the `cause`; it is never cached. */
export const ExecutorFailedError = defineError(
  'E_EXECUTOR_FAILED',
  'ExecutorFailedError',
  'the runnable failed',
  500,
);
export type ExecutorFailedError = InstanceType<typeof ExecutorFailedError>;
/** The runnable did not settle within the executor's timeout. */
export const ExecutorTimeoutError = defineError(
  'E_EXECUTOR_TIMEOUT',
  'ExecutorTimeoutError',
  'the runnable did not finish in time',
  504,
);
export type ExecutorTimeoutError = InstanceType<typeof ExecutorTimeoutError>;
/** The cache store failed or timed out. The middleware degrades to an uncached run instead. */
export const StoreUnavailableError = defineError(
  'E_STORE_UNAVAILABLE',
  'StoreUnavailableError',
  'the cache store is unavailable',
  503,
);
export type StoreUnavailableError = InstanceType<typeof StoreUnavailableError>;
/**
 * A two-tier store was used before its invalidation bus was first confirmed (subscribed, epochs
 * loaded): `openTwoTierStore` did not confirm it within `openTimeout`, or a store made with
 * `createTwoTierStore` was asked to look up or invalidate while Redis had not answered yet. A
 * lookup refused this way runs uncached (counted as a bypass, `store-not-ready`).
 */
export const StoreNotReadyError = defineError(
  'E_STORE_NOT_READY',
  'StoreNotReadyError',
  'the two-tier cache store has not reached Redis yet: await openTwoTierStore(...) (or store.ready()) before using it',
  503,
);
export type StoreNotReadyError = InstanceType<typeof StoreNotReadyError>;
/** A job with no recorded viewer asked for a viewer connection. */
export const NoViewerError = defineError(
  'E_NO_VIEWER',
  'NoViewerError',
  'this run has no viewer (anonymous visitor, schedule, trigger or agent tool), so it cannot connect as the viewer',
  403,
);
export type NoViewerError = InstanceType<typeof NoViewerError>;
/** The viewer is a tenant of no enabled data-table role. */
export const NoRolesError = defineError(
  'E_NO_ROLES',
  'NoRolesError',
  'the viewer holds no enabled role of this data table',
  403,
);
export type NoRolesError = InstanceType<typeof NoRolesError>;
/** `?role=` names a role the job's runner may not use, or that is disabled or unknown. */
export const RoleNotPermittedError = defineError(
  'E_ROLE_NOT_PERMITTED',
  'RoleNotPermittedError',
  'the runner may not use that data-table role',
  403,
);
export type RoleNotPermittedError = InstanceType<typeof RoleNotPermittedError>;
/** The data table has no default role configured, so a plain reference cannot connect. */
export const NoDefaultRoleError = defineError(
  'E_NO_DEFAULT_ROLE',
  'NoDefaultRoleError',
  'this data table has no default role; ask for ?as=viewer or ?role=NAME',
  403,
);
export type NoDefaultRoleError = InstanceType<typeof NoDefaultRoleError>;
/** The data table named in a reference is not in the catalog. */
export const UnknownDatatableError = defineError(
  'E_UNKNOWN_DATATABLE',
  'UnknownDatatableError',
  'no data table by that name in this workspace',
  404,
);
export type UnknownDatatableError = InstanceType<typeof UnknownDatatableError>;
/** The role named is not in the catalog (or was dropped). */
export const UnknownRoleError = defineError(
  'E_UNKNOWN_ROLE',
  'UnknownRoleError',
  'no data-table role by that name',
  404,
);
export type UnknownRoleError = InstanceType<typeof UnknownRoleError>;
/** A `datatable://` reference does not follow the grammar. */
export const InvalidDatatableRefError = defineError(
  'E_INVALID_DATATABLE_REF',
  'InvalidDatatableRefError',
  'malformed data-table reference',
  400,
);
export type InvalidDatatableRefError = InstanceType<typeof InvalidDatatableRefError>;
/** A role name is reserved or not a safe identifier. */
export const InvalidRoleNameError = defineError(
  'E_INVALID_ROLE_NAME',
  'InvalidRoleNameError',
  'invalid role name',
  400,
);
export type InvalidRoleNameError = InstanceType<typeof InvalidRoleNameError>;
/** Resolving the viewer's roles or their login failed (catalog unreachable, …). Fail closed. */
export const RoleResolutionFailedError = defineError(
  'E_ROLE_RESOLUTION_FAILED',
  'RoleResolutionFailedError',
  'could not resolve data-table roles',
  503,
);
export type RoleResolutionFailedError = InstanceType<typeof RoleResolutionFailedError>;
/** Opening a connection as a data-table login failed. */
export const ConnectFailedError = defineError(
  'E_CONNECT_FAILED',
  'ConnectFailedError',
  'could not connect to the data table',
  503,
);
export type ConnectFailedError = InstanceType<typeof ConnectFailedError>;
/** The executor has no data-table connector, so `ctx.datatable` cannot be used. */
export const DatatableUnavailableError = defineError(
  'E_DATATABLE_UNAVAILABLE',
  'DatatableUnavailableError',
  'this executor has no data-table connector',
  500,
);
export type DatatableUnavailableError = InstanceType<typeof DatatableUnavailableError>;
/**
 * The data table's database could not be reached: the connection was refused, terminated while
 * it was being opened, or not opened in time. Carries `datatable`; the original error is the
 * `cause`. 503, safe to retry once the database is back.
 */
export const DatatableUnreachableError = defineError(
  'E_DATATABLE_UNREACHABLE',
  'DatatableUnreachableError',
  'the data table is unavailable: its database is unreachable; retry once it is back',
  503,
);
export type DatatableUnreachableError = InstanceType<typeof DatatableUnreachableError>;
/**
 * A database the reference server itself reads (its credentials: API tokens, embed keys, agent
 * tokens) could not be reached, so a request could not be authenticated: refused (fail closed),
 * 503, safe to retry once the database is back.
 */
export const DatabaseUnreachableError = defineError(
  'E_DATABASE_UNREACHABLE',
  'DatabaseUnreachableError',
  "the server's database is unreachable, so credentials cannot be checked; retry once it is back",
  503,
);
export type DatabaseUnreachableError = InstanceType<typeof DatabaseUnreachableError>;
/** An admin operation on the catalog was refused (duplicate role, role in use, …). */
export const CatalogError = defineError(
  'E_CATALOG',
  'CatalogError',
  'the catalog refused this change',
  409,
);
export type CatalogError = InstanceType<typeof CatalogError>;

/** The data-table connection died under the job (backend terminated, restart, network drop). */
export const ConnectionLostError = defineError(
  'E_CONNECTION_LOST',
  'ConnectionLostError',
  'the data-table connection was lost during the run; retry',
  503,
);
export type ConnectionLostError = InstanceType<typeof ConnectionLostError>;
/** Postgres refused the data a query carried (SQLSTATE class 22: bad encoding, NUL byte, …). */
export const InvalidDataError = defineError(
  'E_INVALID_DATA',
  'InvalidDataError',
  'the database refused a value in this request',
  400,
);
export type InvalidDataError = InstanceType<typeof InvalidDataError>;

/**
 * Postgres refused a statement a runnable sent (any SQLSTATE outside class 22, which is
 * {@link InvalidDataError}): a syntax error, a denied `delete`, a constraint. It reads the same
 * in process and on an agent: `sqlstate` is Postgres's code; the status is 403 when Postgres
 * refused the viewer's privileges (42501: a grant or a row-security policy), else 500 (the
 * runnable's fault). The message names the runnable and quotes Postgres; servers show callers
 * only the default message and the SQLSTATE.
 */
export class QueryFailedError extends ViewerCacheError {
  static override readonly code = 'E_QUERY_FAILED' as const;
  /** The message used when none is given; safe to show to anyone. */
  static readonly defaultMessage = 'the database refused a statement of the runnable';
  declare readonly code: 'E_QUERY_FAILED';
  /** Postgres's SQLSTATE (five characters); `XX000` when the reporter did not say. */
  readonly sqlstate: string;
  constructor(
    message: string = QueryFailedError.defaultMessage,
    options: ErrorOptions & { sqlstate?: string } = {},
  ) {
    const sqlstate =
      options.sqlstate !== undefined && SQLSTATE_RE.test(options.sqlstate)
        ? options.sqlstate
        : 'XX000';
    super(message, {
      ...options,
      code: 'E_QUERY_FAILED',
      status: sqlstate === INSUFFICIENT_PRIVILEGE ? 403 : 500,
    });
    this.sqlstate = sqlstate;
  }
}
const SQLSTATE_RE = /^[0-9A-Z]{5}$/;
const INSUFFICIENT_PRIVILEGE = '42501';

/** A runnable returned a value JSON cannot carry (BigInt, cycle, …): nothing to cache or send. */
export const ResultNotJsonError = defineError(
  'E_RESULT_NOT_JSON',
  'ResultNotJsonError',
  'the runnable returned a value that is not JSON (BigInt, cycle, …): return plain JSON data',
  500,
);
export type ResultNotJsonError = InstanceType<typeof ResultNotJsonError>;

/**
 * The secret key this process was given is not the one the catalog recorded at first use
 * (catalog migration 8 keeps an HMAC check value, never the key): another deployment's key, or a
 * key generated in another folder. Start every server, worker and CLI of one DATABASE_URL with
 * the same VIEWER_CACHE_SECRET_KEY.
 */
export const SecretMismatchError = defineError(
  'E_SECRET_MISMATCH',
  'SecretMismatchError',
  'this secret key is not the one this database was first used with: start every process of the deployment with the same key (VIEWER_CACHE_SECRET_KEY)',
  500,
);
export type SecretMismatchError = InstanceType<typeof SecretMismatchError>;

/**
 * A setting was not understood (an environment variable, a command-line flag): refused at
 * start, never ignored. The message names the setting and the values it accepts; the CLI exits 2.
 */
export const ConfigError = defineError(
  'E_CONFIG',
  'ConfigError',
  'a setting was not understood',
  500,
);
export type ConfigError = InstanceType<typeof ConfigError>;

/** A policy or runnable read a viewer attribute the viewer was not given (SQLSTATE VC402). */
export const NoViewerAttributeError = defineError(
  'E_NO_VIEWER_ATTRIBUTE',
  'NoViewerAttributeError',
  'the viewer was not given the attribute this query reads',
  403,
);
export type NoViewerAttributeError = InstanceType<typeof NoViewerAttributeError>;

/** The runnable requires a data-table role its viewer does not hold (checked before it runs). */
export const RoleRequiredError = defineError(
  'E_ROLE_REQUIRED',
  'RoleRequiredError',
  'this runnable requires a data-table role the viewer does not hold',
  403,
);
export type RoleRequiredError = InstanceType<typeof RoleRequiredError>;

/**
 * An embed assertion was refused: malformed, not a JWT, signed with an algorithm outside the
 * allow-list (`alg: none` included), by an unknown key or not by the key it names, of the wrong
 * type, or with missing or ill-typed claims or attributes. The host must sign a new one.
 */
export const EmbedInvalidError = defineError(
  'E_EMBED_INVALID',
  'EmbedInvalidError',
  'the embed link is not valid',
  401,
);
export type EmbedInvalidError = InstanceType<typeof EmbedInvalidError>;
/** The embed assertion expired (or is older than the verifier's maximum lifetime). */
export const EmbedExpiredError = defineError(
  'E_EMBED_EXPIRED',
  'EmbedExpiredError',
  'the embed link has expired; ask the host for a new one',
  401,
);
export type EmbedExpiredError = InstanceType<typeof EmbedExpiredError>;
/** The embed assertion was signed for another workspace or another app. */
export const EmbedAudienceError = defineError(
  'E_EMBED_AUDIENCE',
  'EmbedAudienceError',
  'the embed link was signed for another workspace or app',
  401,
);
export type EmbedAudienceError = InstanceType<typeof EmbedAudienceError>;
/** The key that signed the embed assertion has been revoked. */
export const EmbedRevokedError = defineError(
  'E_EMBED_REVOKED',
  'EmbedRevokedError',
  'the key that signed this embed link was revoked',
  401,
);
export type EmbedRevokedError = InstanceType<typeof EmbedRevokedError>;
/** `invalidate` was called on a cache whose store keeps no epochs (a plain Redis or memory store). */
export const InvalidationUnsupportedError = defineError(
  'E_INVALIDATION_UNSUPPORTED',
  'InvalidationUnsupportedError',
  'this cache store cannot invalidate: use a TwoTierCacheStore (createTwoTierStore)',
  501,
);
export type InvalidationUnsupportedError = InstanceType<typeof InvalidationUnsupportedError>;

/** A Python runnable was asked to run and no `python3` could be started (not installed, not on PATH). */
export const PythonUnavailableError = defineError(
  'E_PYTHON_UNAVAILABLE',
  'PythonUnavailableError',
  'python3 could not be started on this executor: install it or point the executor at one (python.command)',
  501,
);
export type PythonUnavailableError = InstanceType<typeof PythonUnavailableError>;
/** A DuckDB runnable was asked to run and `@duckdb/node-api` (an optional peer) is not installed. */
export const DuckdbUnavailableError = defineError(
  'E_DUCKDB_UNAVAILABLE',
  'DuckdbUnavailableError',
  'DuckDB runnables need the optional peer @duckdb/node-api: npm install @duckdb/node-api',
  501,
);
export type DuckdbUnavailableError = InstanceType<typeof DuckdbUnavailableError>;
/**
 * A DuckDB script asked for something outside its sandbox: a file, a second ATTACH, a setting,
 * an extension, a write, or a statement that is not a query. Refused before (or instead of) running.
 */
export const DuckdbRefusedError = defineError(
  'E_DUCKDB_REFUSED',
  'DuckdbRefusedError',
  'the DuckDB script asked for something its sandbox does not allow',
  400,
);
export type DuckdbRefusedError = InstanceType<typeof DuckdbRefusedError>;
// Jobs on agent workers: the query proxy and the agent protocol.

/** A job token no running job holds: forged, of a job that ended, or never issued. */
export const JobTokenInvalidError = defineError(
  'E_JOB_TOKEN_INVALID',
  'JobTokenInvalidError',
  'no running job holds this job token (the job ended, or the token was never issued)',
  401,
);
export type JobTokenInvalidError = InstanceType<typeof JobTokenInvalidError>;
/**
 * The caller does not speak the agent protocol this server speaks (no version, or another):
 * refused rather than served, since an older peer may have dropped the viewer request.
 */
export const AgentProtocolError = defineError(
  'E_AGENT_PROTOCOL',
  'AgentProtocolError',
  'this agent does not speak the protocol version the server requires: upgrade the agent',
  426,
);
export type AgentProtocolError = InstanceType<typeof AgentProtocolError>;
/** Proxied SQL was refused before it ran: not one statement of the kinds the query proxy runs. */
export const StatementRefusedError = defineError(
  'E_STATEMENT_REFUSED',
  'StatementRefusedError',
  'the query proxy runs exactly one SELECT, INSERT, UPDATE, DELETE, MERGE, SHOW or EXPLAIN statement, and never a role change (SET, RESET, set_config, DO, EXECUTE: see docs/agents.md)',
  400,
);
export type StatementRefusedError = InstanceType<typeof StatementRefusedError>;
/**
 * More rows or bytes than a bound allows: a proxied statement's answer, the tables a DuckDB
 * runnable copies in, or a Python runnable's result.
 */
export const ResultTooLargeError = defineError(
  'E_RESULT_TOO_LARGE',
  'ResultTooLargeError',
  "the statement's result is larger than the query proxy allows: select fewer rows or columns",
  413,
);
export type ResultTooLargeError = InstanceType<typeof ResultTooLargeError>;
/** A proxied statement ran longer than the proxy's time bound (it was cancelled). */
export const QueryTimeoutError = defineError(
  'E_QUERY_TIMEOUT',
  'QueryTimeoutError',
  'the statement ran longer than the query proxy allows',
  504,
);
export type QueryTimeoutError = InstanceType<typeof QueryTimeoutError>;
/**
 * A proxied statement named a transaction its job does not hold: never opened, already ended
 * and rolled back (by a COMMIT or ROLLBACK), or another job's. Nothing ran.
 */
export const TransactionUnknownError = defineError(
  'E_TRANSACTION_UNKNOWN',
  'TransactionUnknownError',
  "no open transaction of this job has that id (ended, never opened, or another job's)",
  404,
);
export type TransactionUnknownError = InstanceType<typeof TransactionUnknownError>;
/**
 * The query proxy rolled the job's transaction back before this statement: it passed one of its
 * bounds (open too long, idle too long), a statement of it ran past its time, or the job or the
 * server ended. Every statement of it is refused so until the runnable sends ROLLBACK.
 */
export const TransactionEndedError = defineError(
  'E_TRANSACTION_ENDED',
  'TransactionEndedError',
  'the query proxy rolled this transaction back: nothing of it was committed; send ROLLBACK, then start again',
  409,
);
export type TransactionEndedError = InstanceType<typeof TransactionEndedError>;
/**
 * A proxied transaction would pass a bound of the query proxy: more statements than one
 * transaction may run (it is rolled back), or more transactions open at once than a job may hold.
 */
export const TransactionLimitError = defineError(
  'E_TRANSACTION_LIMIT',
  'TransactionLimitError',
  'the transaction passed a bound of the query proxy (statements per transaction, or transactions open per job): nothing of it was committed',
  400,
);
export type TransactionLimitError = InstanceType<typeof TransactionLimitError>;
/**
 * `withResultCache` was given a shared store (Redis, two tiers, or a store that does not declare
 * itself unshared) without `seal` (SPEC invariant 21): anyone who can write to that store could
 * serve forged results, and anyone who can read it could read them.
 */
export const SealRequiredError = defineError(
  'E_SEAL_REQUIRED',
  'SealRequiredError',
  'this store is shared: pass seal: { secretKey } (at least 32 bytes from a secret store), or seal: false to store entries in clear (anyone who can write to the store can then serve forged results, and read them)',
  500,
);
export type SealRequiredError = InstanceType<typeof SealRequiredError>;
/** The job queue (Redis behind BullMQ) could not take the job or tell how it ended. */
export const QueueUnavailableError = defineError(
  'E_QUEUE_UNAVAILABLE',
  'QueueUnavailableError',
  'the job queue is unavailable: check REDIS_URL and that a worker runs',
  503,
);
export type QueueUnavailableError = InstanceType<typeof QueueUnavailableError>;
/** No worker finished the job within the server's wait (the server gave up; nothing is cached). */
export const QueueTimeoutError = defineError(
  'E_QUEUE_TIMEOUT',
  'QueueTimeoutError',
  'no worker finished the job in time: start a worker (`viewer-cache worker`) or raise the wait',
  504,
);
export type QueueTimeoutError = InstanceType<typeof QueueTimeoutError>;
/**
 * A worker refused a queue message: its MAC does not verify under the secret key, its job record
 * does not exist (or belongs to another workspace), or the job already ended (a replay).
 */
export const QueueJobRefusedError = defineError(
  'E_QUEUE_JOB_REFUSED',
  'QueueJobRefusedError',
  'the worker refused the job: forged, replayed or unknown (check VIEWER_CACHE_SECRET_KEY is the same on servers and workers)',
  502,
);
export type QueueJobRefusedError = InstanceType<typeof QueueJobRefusedError>;
/** The worker running the job died (or stalled) and the one retry was used up. */
export const QueueWorkerLostError = defineError(
  'E_QUEUE_WORKER_LOST',
  'QueueWorkerLostError',
  'the worker running the job was lost; the job was not finished',
  503,
);
export type QueueWorkerLostError = InstanceType<typeof QueueWorkerLostError>;
/**
 * A miss that no worker or agent could take: none of the job's workspace and group was connected
 * (within the short wait for one to come back). Fails fast instead of waiting out the job's
 * timeout, and says it is the fleet, not the runnable.
 */
export const NoWorkersError = defineError(
  'E_NO_WORKERS',
  'NoWorkersError',
  'no worker or agent of this workspace and group is connected: start one (or check that they reach this server)',
  503,
);
export type NoWorkersError = InstanceType<typeof NoWorkersError>;
/**
 * A queue worker asked to start a child run over HTTP (a runnable using its job token) without
 * the servers' address: the operator's missing setting, never the caller's bad request.
 */
export const WorkerMisconfiguredError = defineError(
  'E_WORKER_MISCONFIGURED',
  'WorkerMisconfiguredError',
  "this worker cannot start child runs over HTTP: its operator has not set VIEWER_CACHE_SERVER_URL (the servers' address)",
  503,
);
export type WorkerMisconfiguredError = InstanceType<typeof WorkerMisconfiguredError>;
/** A worker's answer did not open under this run's key (forged, or another job's result). */
export const QueueResultInvalidError = defineError(
  'E_QUEUE_RESULT_INVALID',
  'QueueResultInvalidError',
  "the worker's answer does not belong to this run and was refused",
  502,
);
export type QueueResultInvalidError = InstanceType<typeof QueueResultInvalidError>;
/** `serve --apps PATH` (`VIEWER_CACHE_APPS`) names no file. */
export const AppsModuleNotFoundError = defineError(
  'E_APPS_MODULE_NOT_FOUND',
  'AppsModuleNotFoundError',
  'the apps module was not found: check the path given to --apps (VIEWER_CACHE_APPS)',
  500,
);
export type AppsModuleNotFoundError = InstanceType<typeof AppsModuleNotFoundError>;
/** The apps module could not be imported (it threw, or Node cannot load its file type). */
export const AppsModuleLoadFailedError = defineError(
  'E_APPS_MODULE_LOAD_FAILED',
  'AppsModuleLoadFailedError',
  'the apps module could not be imported',
  500,
);
export type AppsModuleLoadFailedError = InstanceType<typeof AppsModuleLoadFailedError>;
/** The apps module's default export is not `{ runnables, apps, hooks?, schedules? }`. */
export const AppsModuleInvalidError = defineError(
  'E_APPS_MODULE_INVALID',
  'AppsModuleInvalidError',
  'the apps module must default-export { runnables, apps, hooks?, schedules? } (defineApps)',
  500,
);
export type AppsModuleInvalidError = InstanceType<typeof AppsModuleInvalidError>;
/**
 * `transactionPooler: true`, but the pooler carries session state from one transaction to the
 * next (probed at start: a `SET` in one transaction, read back in the next on the same
 * backend). PgBouncer needs `server_reset_query = DISCARD ALL` and
 * `server_reset_query_always = 1`; without them a runnable's `SET ROLE` reaches another run of
 * its login.
 */
export const PoolerUnsafeError = defineError(
  'E_POOLER_UNSAFE',
  'PoolerUnsafeError',
  'the transaction pooler keeps session state between transactions: set server_reset_query = DISCARD ALL and server_reset_query_always = 1 (PgBouncer)',
  500,
);
export type PoolerUnsafeError = InstanceType<typeof PoolerUnsafeError>;

/** Every error class, by code. */
export const errors = {
  E_ARGS_NOT_JSON: ArgsNotJsonError,
  E_INVALID_JOB: InvalidJobError,
  E_UNKNOWN_RUNNABLE: UnknownRunnableError,
  E_EXECUTOR_FAILED: ExecutorFailedError,
  E_EXECUTOR_TIMEOUT: ExecutorTimeoutError,
  E_STORE_UNAVAILABLE: StoreUnavailableError,
  E_STORE_NOT_READY: StoreNotReadyError,
  E_NO_VIEWER: NoViewerError,
  E_NO_ROLES: NoRolesError,
  E_ROLE_NOT_PERMITTED: RoleNotPermittedError,
  E_NO_DEFAULT_ROLE: NoDefaultRoleError,
  E_UNKNOWN_DATATABLE: UnknownDatatableError,
  E_UNKNOWN_ROLE: UnknownRoleError,
  E_INVALID_DATATABLE_REF: InvalidDatatableRefError,
  E_INVALID_ROLE_NAME: InvalidRoleNameError,
  E_ROLE_RESOLUTION_FAILED: RoleResolutionFailedError,
  E_CONNECT_FAILED: ConnectFailedError,
  E_DATATABLE_UNAVAILABLE: DatatableUnavailableError,
  E_DATATABLE_UNREACHABLE: DatatableUnreachableError,
  E_DATABASE_UNREACHABLE: DatabaseUnreachableError,
  E_CATALOG: CatalogError,
  E_CONNECTION_LOST: ConnectionLostError,
  E_INVALID_DATA: InvalidDataError,
  E_INVALIDATION_UNSUPPORTED: InvalidationUnsupportedError,
  E_NO_VIEWER_ATTRIBUTE: NoViewerAttributeError,
  E_ROLE_REQUIRED: RoleRequiredError,
  E_EMBED_INVALID: EmbedInvalidError,
  E_EMBED_EXPIRED: EmbedExpiredError,
  E_EMBED_AUDIENCE: EmbedAudienceError,
  E_EMBED_REVOKED: EmbedRevokedError,
  E_PYTHON_UNAVAILABLE: PythonUnavailableError,
  E_DUCKDB_UNAVAILABLE: DuckdbUnavailableError,
  E_DUCKDB_REFUSED: DuckdbRefusedError,
  E_JOB_TOKEN_INVALID: JobTokenInvalidError,
  E_AGENT_PROTOCOL: AgentProtocolError,
  E_STATEMENT_REFUSED: StatementRefusedError,
  E_RESULT_TOO_LARGE: ResultTooLargeError,
  E_QUERY_TIMEOUT: QueryTimeoutError,
  E_TRANSACTION_UNKNOWN: TransactionUnknownError,
  E_TRANSACTION_ENDED: TransactionEndedError,
  E_TRANSACTION_LIMIT: TransactionLimitError,
  E_SEAL_REQUIRED: SealRequiredError,
  E_QUEUE_UNAVAILABLE: QueueUnavailableError,
  E_QUEUE_TIMEOUT: QueueTimeoutError,
  E_QUEUE_JOB_REFUSED: QueueJobRefusedError,
  E_QUEUE_WORKER_LOST: QueueWorkerLostError,
  E_NO_WORKERS: NoWorkersError,
  E_WORKER_MISCONFIGURED: WorkerMisconfiguredError,
  E_QUEUE_RESULT_INVALID: QueueResultInvalidError,
  E_APPS_MODULE_NOT_FOUND: AppsModuleNotFoundError,
  E_APPS_MODULE_LOAD_FAILED: AppsModuleLoadFailedError,
  E_APPS_MODULE_INVALID: AppsModuleInvalidError,
  E_POOLER_UNSAFE: PoolerUnsafeError,
  E_QUERY_FAILED: QueryFailedError,
  E_RESULT_NOT_JSON: ResultNotJsonError,
  E_SECRET_MISMATCH: SecretMismatchError,
  E_CONFIG: ConfigError,
} as const;

export type ErrorCode = keyof typeof errors;

/**
 * The error class of one of our codes, or undefined for anything else. The one code → class
 * lookup: a code another process reported (a worker, an agent, a Python child, a child run) is
 * data, checked here rather than used as a key (`constructor` is no error class).
 */
export function errorClassOf(code: unknown): (typeof errors)[ErrorCode] | undefined {
  return typeof code === 'string' && Object.hasOwn(errors, code)
    ? errors[code as ErrorCode]
    : undefined;
}

/** Normalises anything thrown into an Error, so handlers and logs see one shape. */
export function coerceError(thrown: unknown): Error {
  if (thrown instanceof Error) return thrown;
  return new Error(typeof thrown === 'string' ? thrown : 'non-Error value thrown', {
    cause: thrown,
  });
}
