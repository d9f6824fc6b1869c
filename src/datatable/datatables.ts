import pg from 'pg';
import { parse as parseConnectionString, toClientConfig } from 'pg-connection-string';
import type { DatatableLease } from '../connector/datatable_connector.js';
import type { DatatableRef } from '../connector/datatable_ref.js';
import { resolveDuration } from '../duration.js';
import { ConnectFailedError, ConnectionLostError, ViewerCacheError } from '../errors.js';
import { TypedEmitter } from '../events.js';
import type { Job } from '../job.js';
import { type Logger, silentLogger } from '../logger.js';
import { JobAuthorizations } from './access/job_authorizations.js';
import { RunDependencies } from './access/run_dependencies.js';
import { CatalogAdmin } from './admin/catalog_admin.js';
import { CatalogSnapshot } from './catalog/catalog_snapshot.js';
import type { Directory } from './catalog/directory.js';
import { migrateCatalog } from './catalog/migrations.js';
import type { Datatables, DatatablesTestHooks, RawDatatablesOptions } from './datatables_api.js';
import type { DatatablesEvents } from './datatables_events.js';
import { NEXT_LEASE } from './identity/sql/identity.js';
import { ViewerIdentities, type ViewerIdentity } from './identity/viewer_identity.js';
import { listSetLogins, type SetLoginInfo, wantedSetLogins } from './logins/login_gc.js';
import { LoginLeaser } from './logins/login_leaser.js';
import { LoginPools } from './logins/login_pools.js';
import { LoginRepair } from './logins/login_repair.js';
import { PasswordDeriver } from './logins/passwords.js';
import type { PooledLease } from './logins/pooled_lease.js';
import { RESET_SESSION } from './logins/pooled_lease.js';
import { RoleSetProtocol } from './logins/role_set_protocol.js';
import { SetLoginWarmer } from './logins/set_login_warmer.js';
import { CoalescingSocket } from './pg/coalescing_socket.js';
import { GuardedClient } from './pg/pg_clients.js';
import { isConnectionLost } from './pg/sqlstate.js';

export type { Datatables, DatatablesTestHooks, RawDatatablesOptions } from './datatables_api.js';

/** Connects, migrates (unless told not to) and loads the catalog. */
export function createDatatables(options: RawDatatablesOptions): Promise<Datatables> {
  return createDatatablesWithHooks(options, {});
}

/** {@link createDatatables} with test hooks (not exported from the package). */
export async function createDatatablesWithHooks(
  options: RawDatatablesOptions,
  hooks: DatatablesTestHooks,
): Promise<Datatables> {
  const service = new DatatableService(options, hooks);
  try {
    await service.start(options.migrate ?? true);
  } catch (err) {
    await service.close();
    throw err;
  }
  return service;
}

/** Wiring: the catalog, who may use what, leasing, and the admin API, put together. */
class DatatableService implements Datatables {
  readonly events = new TypedEmitter<DatatablesEvents>();
  readonly admin: CatalogAdmin;
  readonly fingerprint: Datatables['fingerprint'];
  readonly #pool: pg.Pool;
  readonly #snapshot: CatalogSnapshot;
  readonly #authorizations: JobAuthorizations;
  readonly #dependencies: RunDependencies;
  readonly #protocol: RoleSetProtocol;
  readonly #pools: LoginPools;
  readonly #leaser: LoginLeaser;
  readonly #warmer: SetLoginWarmer | null;
  readonly #identities: ViewerIdentities | null;
  readonly #directory: Directory | null;
  readonly #logger: Logger;
  #closed = false;

  constructor(options: RawDatatablesOptions, hooks: DatatablesTestHooks) {
    if (options === null || typeof options !== 'object')
      throw new TypeError('options are required');
    const adminConfig = toConfig(options.connection);
    const passwords = new PasswordDeriver(options.secretKey);
    if (options.directory !== undefined && typeof options.directory?.principals !== 'function') {
      throw new TypeError('directory must have a principals(workspace, email) method');
    }
    this.#directory = options.directory ?? null;
    this.#logger = options.logger ?? silentLogger;
    const pools = options.pools ?? {};
    const poolSize = pools.size ?? 4;
    const maxPools = pools.max ?? 100;
    if (!Number.isInteger(poolSize) || poolSize < 1)
      throw new TypeError('pools.size must be an integer ≥ 1');
    if (!Number.isInteger(maxPools) || maxPools < 1)
      throw new TypeError('pools.max must be an integer ≥ 1');
    const maxConnections = pools.maxConnections ?? 20;
    if (!Number.isInteger(maxConnections) || maxConnections < 1)
      throw new TypeError('pools.maxConnections must be an integer ≥ 1');
    const {
      user: _user,
      password: _password,
      database: _database,
      ...loginConfig
    } = options.loginConnection === undefined ? adminConfig : toConfig(options.loginConnection);
    const statementTimeoutMs = resolveDuration(
      pools.statementTimeout ?? 0,
      'pools.statementTimeout',
    );
    if (options.transactionPooler === true) {
      // Nothing session-scoped through a transaction pooler: each statement may meet another
      // backend. Refused at start rather than failing open per run.
      if (options.viewerIdentity ?? true) {
        throw new TypeError(
          'transactionPooler needs viewerIdentity: false (the viewer identity is bound to one backend for a lease)',
        );
      }
      if (statementTimeoutMs > 0) {
        throw new TypeError(
          'transactionPooler cannot carry pools.statementTimeout (a session setting); set statement_timeout on the pooler or the database',
        );
      }
    }
    const logger = this.#logger;
    const events = this.events;

    this.#pool = new pg.Pool({
      ...adminConfig,
      Client: GuardedClient,
      max: 4,
      application_name: 'viewer-cache-admin',
    });
    this.#pool.on('error', (err) => {
      // After close(), connections ending with the server are expected, not news.
      if (!this.#closed) logger.warn({ err: err.message }, 'catalog connection lost');
    });
    const catalog = options.catalog ?? {};
    this.#snapshot = new CatalogSnapshot({
      pool: this.#pool,
      // The admin connection's own application_name (from its URL) does not name the listener.
      listenConnection:
        options.listenConnection === undefined
          ? { ...adminConfig, application_name: undefined }
          : toConfig(options.listenConnection),
      events,
      logger,
      heartbeatMs: positive(
        resolveDuration(catalog.heartbeat ?? '1s', 'catalog.heartbeat'),
        'catalog.heartbeat',
      ),
      heartbeatTimeoutMs: positive(
        resolveDuration(catalog.heartbeatTimeout ?? '1s', 'catalog.heartbeatTimeout'),
        'catalog.heartbeatTimeout',
      ),
    });
    this.#authorizations = new JobAuthorizations(this.#snapshot, this.#directory);
    this.#dependencies = new RunDependencies((job) => this.#authorizations.of(job));
    const dependencies = this.#dependencies;
    this.fingerprint = Object.assign((job: Job) => dependencies.fingerprint(job), {
      track: (job: Job) => dependencies.track(job),
    });
    this.#protocol = new RoleSetProtocol({
      admin: this.#pool,
      adminConfig,
      passwords,
      events,
      logger,
      ...(hooks.beforeLoginStep ? { beforeStep: hooks.beforeLoginStep } : {}),
    });
    this.#pools = new LoginPools({
      base: { ...loginConfig, stream: () => new CoalescingSocket() },
      maxPools,
      poolSize,
      maxConnections,
      acquireTimeoutMs: resolveDuration(pools.acquireTimeout ?? '10s', 'pools.acquireTimeout'),
      idleTimeoutMs: resolveDuration(pools.idleTimeout ?? '30s', 'pools.idleTimeout'),
      statementTimeoutMs,
      ...((pools.checkOnRelease ?? true)
        ? { onRelease: (login: string) => this.#leaser.released(login) }
        : {}),
      logger,
    });
    this.#leaser = new LoginLeaser({
      pools: this.#pools,
      protocol: this.#protocol,
      repair: new LoginRepair({ admin: this.#pool, passwords, events, logger }),
      passwords,
      logger,
    });
    this.#warmer =
      (pools.prepareAhead ?? true) && this.#directory === null
        ? new SetLoginWarmer(this.#leaser, logger)
        : null;
    if (this.#warmer !== null) {
      const warmer = this.#warmer;
      events.on('catalog:refreshed', () => {
        const state = this.#snapshot.latest;
        if (state !== null) warmer.refreshed(state);
      });
    }
    this.#identities =
      (options.viewerIdentity ?? true) ? new ViewerIdentities(adminConfig, logger) : null;
    this.admin = new CatalogAdmin({
      pool: this.#pool,
      adminConfig,
      passwords,
      setLogins: this.#protocol,
      onLoginGone: (login) => {
        this.#pools.evict(login);
        this.#leaser.forget(login);
      },
      onCommitted: (generation) => this.#snapshot.invalidate(generation),
      ...(catalog.awaitPropagation === true
        ? { watchPropagation: () => this.#snapshot.watchPropagation() }
        : {}),
      onDatatableCreated: (database) => this.#identities?.install(database),
      logger,
    });
  }

  async start(migrate: boolean): Promise<void> {
    if (migrate) await migrateCatalog(this.#pool);
    await this.#snapshot.start();
  }

  get generation(): number {
    return this.#snapshot.generation;
  }

  get listenerUp(): boolean {
    return this.#snapshot.listenerUp;
  }

  get connections(): { open: number; lent: number; waiting: number } {
    return this.#pools.usage;
  }

  waitForGeneration(generation: number): Promise<void> {
    return this.#snapshot.waitForGeneration(generation);
  }

  async connect(job: Job, ref: DatatableRef): Promise<DatatableLease> {
    const access = ref.access.kind;
    const timed = this.events.has('datatable:resolved') || this.events.has('datatable:connected');
    const started = timed ? performance.now() : 0;
    try {
      const authorization = await this.#authorizations.of(job);
      // Recorded before the grant: a refusal the runnable catches is an answer it depends on.
      this.#dependencies.askedFor(job, ref, authorization);
      const { datatable, roles } = authorization.grant(ref);
      const afterResolve = timed ? performance.now() : 0;
      if (timed) this.events.emit('datatable:resolved', { ms: afterResolve - started, access });
      const lease = await this.#leaser.lease(roles, datatable.database);
      if (this.#identities !== null) this.#resetWithEpoch(lease, datatable.database);
      if (ref.access.kind === 'viewer' && this.#identities !== null) {
        // grant() refused a run with no viewer: here there is a signed-in or an embed viewer.
        const { endUserEmail, embed } = job.perms;
        await this.#bind(
          lease,
          datatable.database,
          endUserEmail !== null
            ? { email: endUserEmail, attributes: {} }
            : { email: embed!.email, attributes: embed!.attributes },
        );
      }
      if (timed)
        this.events.emit('datatable:connected', { ms: performance.now() - afterResolve, access });
      return lease;
    } catch (thrown) {
      const err =
        thrown instanceof ViewerCacheError
          ? thrown
          : new ConnectFailedError('could not connect to the data table', {
              cause: thrown,
              datatable: ref.name,
            });
      if (this.events.has('datatable:refused'))
        this.events.emit('datatable:refused', { code: err.code, access });
      throw err;
    }
  }

  async viewerHolds(job: Job, datatable: string, role: string): Promise<boolean> {
    const authorization = await this.#authorizations.of(job);
    this.#dependencies.checkedRole(job, datatable, role, authorization);
    return authorization.viewerHolds(datatable, role);
  }

  startedChild(job: Job, child: Job): void {
    this.#dependencies.startedChild(job, child);
  }

  /**
   * On a data-table with viewer identity, every lease's reset also draws the session's next
   * epoch (see sql/identity.ts), so any binding made during the lease is void once the
   * connection is back in its pool, and the next viewer lease knows the epoch to sign.
   */
  #resetWithEpoch(lease: PooledLease, database: string): void {
    const identities = this.#identities!;
    const { connection } = lease;
    lease.resetWith(
      () =>
        identities.installed(database)
          ? {
              // One Query message: the reset, then the new epoch (its last result).
              statement: `${RESET_SESSION}; ${NEXT_LEASE}`,
              onDone: (result) => {
                const last = Array.isArray(result) ? result[result.length - 1]! : result;
                identities.entered(connection, last.rows[0]!.epoch);
              },
              onFailed: (err) => {
                identities.left(connection);
                identities.forgetIfMissing(database, err);
              },
            }
          : { statement: RESET_SESSION, onDone: () => identities.left(connection) },
      async () => identities.left(connection),
    );
  }

  /**
   * Binds the viewer to the lent backend, from that backend, in front of the run's first
   * statement (see PooledLease.bindBeforeFirstQuery). The first viewer lease of a connection
   * (or of a database in this process) first installs and draws an epoch: one round trip, once.
   */
  async #bind(lease: PooledLease, database: string, identity: ViewerIdentity): Promise<void> {
    const identities = this.#identities!;
    const { connection } = lease;
    if (!identities.ready(database, connection)) {
      try {
        await identities.install(database);
        const { rows } = await lease.internalQuery(NEXT_LEASE);
        identities.entered(connection, rows[0]!.epoch);
      } catch (err) {
        await lease.release(true);
        identities.forgetIfMissing(database, err);
        if (isConnectionLost(err)) throw new ConnectionLostError(undefined, { cause: err });
        throw new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        });
      }
    }
    const statement = identities.bindingFor(database, connection, lease.backend, identity)!;
    lease.bindBeforeFirstQuery(
      [statement],
      (err) =>
        new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        }),
      () => identities.recheck(database),
    );
  }

  async listLogins(): Promise<SetLoginInfo[]> {
    return listSetLogins(await this.#snapshot.current(), this.#protocol);
  }

  async gcLogins(): Promise<string[]> {
    const state = await this.#snapshot.current();
    const directory = this.#directory;
    const wanted = await wantedSetLogins(state, (workspace, email) =>
      directory === null
        ? state.principals(workspace, email)
        : directory.principals(workspace, email),
    );
    const databases = await this.admin.databases();
    const retired: string[] = [];
    for (const { login } of await this.#protocol.list()) {
      if (wanted.has(login)) continue;
      await this.#protocol.retire(login, databases);
      this.#pools.evict(login);
      this.#leaser.forget(login);
      retired.push(login);
    }
    return retired;
  }

  async ping(): Promise<void> {
    await this.#pool.query('select 1');
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#warmer?.close();
    this.#leaser.close();
    await this.#snapshot.close();
    await this.#pools.close();
    await this.#identities?.close();
    await this.#pool.end().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
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
