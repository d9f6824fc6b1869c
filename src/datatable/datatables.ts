import pg from 'pg';
import { parse as parseConnectionString, toClientConfig } from 'pg-connection-string';
import { type Duration, resolveDuration } from '../duration.js';
import {
  ConnectFailedError,
  NoDefaultRoleError,
  NoRolesError,
  NoViewerError,
  RoleNotPermittedError,
  UnknownDatatableError,
  UnknownRoleError,
  ViewerCacheError,
} from '../errors.js';
import { TypedEmitter } from '../events.js';
import type { DatatableConnector, DatatableLease } from '../executor/datatable_connector.js';
import type { Job } from '../job.js';
import { type Logger, silentLogger } from '../logger.js';
import { CatalogAdmin } from './catalog_admin.js';
import { type CatalogRole, CatalogSnapshot, type CatalogState } from './catalog_snapshot.js';
import type { DatatableRef } from './datatable_ref.js';
import type { DatatablesEvents } from './datatables_events.js';
import type { Directory, Principals } from './directory.js';
import { Fingerprinter } from './fingerprint.js';
import { LoginAuthFailed, LoginPools } from './login_pools.js';
import { migrateCatalog } from './migrations.js';
import { PasswordDeriver } from './passwords.js';
import { mayUseRole, resolveRoles } from './resolve_roles.js';
import { type LoginCredentials, RoleSetLogins, type RoleSetStep } from './role_set_login.js';

export interface RawDatatablesOptions {
  /**
   * Privileged connection to the catalog database, as a URL or pg config. The data-table
   * databases must be on the same cluster (roles are cluster-wide). The role needs CREATEROLE
   * and ADMIN on the data-table roles (the role that created them has it); a superuser works.
   */
  connection: string | pg.ClientConfig;
  /**
   * Secret (≥ 32 bytes) from which managed login passwords are derived. Keep it in a secret
   * store: with it and the catalog, anyone can log in as any data-table role.
   */
  secretKey: string | Uint8Array;
  /** Group/folder memberships. @default the built-in directory in the catalog */
  directory?: Directory;
  /** Apply catalog migrations on start. @default true */
  migrate?: boolean;
  /** Login connection pools. */
  pools?: {
    /** Pools (logins × databases) kept open at most. @default 100 */
    max?: number;
    /** Connections per login. @default 4 */
    size?: number;
    /** @default '30s' */
    idleTimeout?: Duration;
    /** `statement_timeout` of login connections; 0 = none. @default 0 */
    statementTimeout?: Duration;
  };
  /** @default silent */
  logger?: Logger;
  /** Test hook: called before each step of the set-login protocol; throw to simulate a crash. */
  beforeLoginStep?: (step: RoleSetStep, login: string) => void | Promise<void>;
}

/**
 * Data tables as the viewer: the {@link DatatableConnector} to give {@link createExecutor}, the
 * `fingerprint` to give {@link withResultCache}, and the catalog admin API.
 */
export interface Datatables extends DatatableConnector {
  /** The authorization fingerprint of a job, for `withResultCache({ fingerprint })`. */
  readonly fingerprint: (job: Job) => string | Promise<string>;
  readonly admin: CatalogAdmin;
  readonly events: Pick<TypedEmitter<DatatablesEvents>, 'on' | 'off'>;
  /** Generation of the catalog state in memory. */
  readonly generation: number;
  /** Whether the LISTEN connection is up (else every run reads the generation from Postgres). */
  readonly listenerUp: boolean;
  /** Resolves once this process has loaded `generation` (or newer). */
  waitForGeneration(generation: number): Promise<void>;
  /** Set logins, with the names of the roles they hold. */
  listLogins(): Promise<{ login: string; roles: string[]; hasRow: boolean; canLogin: boolean }[]>;
  /**
   * Retires set logins that no viewer known to the catalog resolves to any more (and orphans
   * without a row). With a plugged-in directory only `user:` tenants are known, so a login still
   * in use may be retired; it is recreated on its next use.
   */
  gcLogins(): Promise<string[]>;
  /** Checks the catalog database answers (for readiness probes). */
  ping(): Promise<void>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Connects, migrates (unless told not to) and loads the catalog. */
export async function createDatatables(options: RawDatatablesOptions): Promise<Datatables> {
  const service = new DatatableService(options);
  try {
    await service.start(options.migrate ?? true);
  } catch (err) {
    await service.close();
    throw err;
  }
  return service;
}

class DatatableService implements Datatables {
  readonly events = new TypedEmitter<DatatablesEvents>();
  readonly admin: CatalogAdmin;
  readonly fingerprint: (job: Job) => string | Promise<string>;
  readonly #pool: pg.Pool;
  readonly #snapshot: CatalogSnapshot;
  readonly #setLogins: RoleSetLogins;
  readonly #pools: LoginPools;
  readonly #passwords: PasswordDeriver;
  readonly #directory: Directory | null;
  readonly #logger: Logger;
  #closed = false;

  constructor(options: RawDatatablesOptions) {
    if (options === null || typeof options !== 'object')
      throw new TypeError('options are required');
    const adminConfig = toConfig(options.connection);
    this.#passwords = new PasswordDeriver(options.secretKey);
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
    const { user: _user, password: _password, database: _database, ...loginConfig } = adminConfig;

    this.#pool = new pg.Pool({ ...adminConfig, max: 4, application_name: 'viewer-cache-admin' });
    this.#pool.on('error', (err) => {
      // After close(), connections ending with the server are expected, not news.
      if (!this.#closed) this.#logger.warn({ err: err.message }, 'catalog connection lost');
    });
    this.#snapshot = new CatalogSnapshot({
      pool: this.#pool,
      listenConnection: adminConfig,
      logger: this.#logger,
    });
    this.#snapshot.events.on('catalog:refreshed', (event) =>
      this.events.emit('catalog:refreshed', event),
    );
    this.#snapshot.events.on('catalog:listener', (event) =>
      this.events.emit('catalog:listener', event),
    );
    this.#setLogins = new RoleSetLogins({
      admin: this.#pool,
      adminConfig,
      loginConfig,
      passwords: this.#passwords,
      events: this.events,
      logger: this.#logger,
      ...(options.beforeLoginStep ? { beforeStep: options.beforeLoginStep } : {}),
    });
    this.#pools = new LoginPools({
      base: loginConfig,
      maxPools,
      poolSize,
      idleTimeoutMs: resolveDuration(pools.idleTimeout ?? '30s', 'pools.idleTimeout'),
      statementTimeoutMs: resolveDuration(pools.statementTimeout ?? 0, 'pools.statementTimeout'),
      logger: this.#logger,
    });
    this.admin = new CatalogAdmin({
      pool: this.#pool,
      adminConfig,
      passwords: this.#passwords,
      setLogins: this.#setLogins,
      onLoginGone: (login) => {
        this.#pools.evict(login);
        this.#setLogins.forget(login);
      },
      onCommitted: (generation) => this.#snapshot.invalidate(generation),
      logger: this.#logger,
    });
    const fingerprints = new Fingerprinter(this.#snapshot, this.#directory);
    this.fingerprint = (job) => fingerprints.of(job);
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

  waitForGeneration(generation: number): Promise<void> {
    return this.#snapshot.waitForGeneration(generation);
  }

  async connect(job: Job, ref: DatatableRef): Promise<DatatableLease> {
    const access = ref.access.kind;
    const timed = this.events.has('datatable:resolved') || this.events.has('datatable:connected');
    const started = timed ? performance.now() : 0;
    try {
      const state = this.#snapshot.freshState() ?? (await this.#snapshot.current());
      const datatable = state.datatable(job.workspace, ref.name);
      if (datatable === undefined) {
        throw new UnknownDatatableError(
          `no data table ${JSON.stringify(ref.name)} in this workspace`,
        );
      }
      const resolved = await this.#resolve(state, job, ref, datatable.name, datatable.defaultRole);
      let credentials = await resolved.credentials(datatable.database);
      const afterResolve = timed ? performance.now() : 0;
      if (timed) this.events.emit('datatable:resolved', { ms: afterResolve - started, access });
      let lease: DatatableLease;
      try {
        lease =
          credentials.lease ??
          (await this.#pools.lease(datatable.database, credentials.login, credentials.password));
      } catch (err) {
        if (!(err instanceof LoginAuthFailed) || !resolved.isSet) throw err;
        // Retired or taken back by another process since we cached it: read the row again.
        this.#setLogins.forget(credentials.login);
        credentials = await resolved.credentials(datatable.database);
        lease = await this.#pools.lease(
          datatable.database,
          credentials.login,
          credentials.password,
        );
      }
      if (timed)
        this.events.emit('datatable:connected', { ms: performance.now() - afterResolve, access });
      return lease;
    } catch (thrown) {
      const err =
        thrown instanceof ViewerCacheError
          ? thrown
          : new ConnectFailedError('could not connect to the data table', { cause: thrown });
      if (this.events.has('datatable:refused'))
        this.events.emit('datatable:refused', { code: err.code, access });
      throw err;
    }
  }

  /** Which login serves this request; refuses (fail closed) when none may. */
  async #resolve(
    state: CatalogState,
    job: Job,
    ref: DatatableRef,
    datatable: string,
    defaultRole: number | null,
  ): Promise<{
    isSet: boolean;
    /** The login to connect as; on a set login's first use, with the connection that proved it. */
    credentials(database: string): Promise<LoginCredentials & { lease?: DatatableLease }>;
  }> {
    const own = (role: CatalogRole) => ({
      isSet: false,
      credentials: async () => ({
        login: role.name,
        password: this.#passwords.password(`role:${role.oid}`, role.secret),
      }),
    });
    switch (ref.access.kind) {
      case 'viewer': {
        // The viewer is perms.endUserEmail and nothing else; never perms.email.
        const viewer = job.perms.endUserEmail;
        if (viewer === null) throw new NoViewerError();
        const principals = await this.#principals(state, job.workspace, viewer);
        const roles = resolveRoles(state, job.workspace, viewer, principals, datatable);
        if (roles.length === 0) throw new NoRolesError();
        if (roles.length === 1) return own(roles[0]!);
        const oids = roles.map((role) => role.oid);
        return {
          isSet: true,
          credentials: (database) =>
            this.#setLogins.ensure(oids, database, (login) =>
              this.#pools.lease(database, login.login, login.password),
            ),
        };
      }
      case 'role': {
        const role = state.roleByName(job.workspace, ref.access.role);
        if (role === undefined || role.datatable !== datatable) {
          throw new UnknownRoleError(`no role ${ref.access.role} on this data table`);
        }
        const principals = await this.#principals(state, job.workspace, job.perms.email);
        if (!mayUseRole(role, job.perms.email, principals)) {
          throw new RoleNotPermittedError(
            role.enabled ? 'the runner is not a tenant of that role' : 'that role is disabled',
          );
        }
        return own(role);
      }
      case 'default': {
        if (defaultRole === null) throw new NoDefaultRoleError();
        const role = state.role(defaultRole);
        if (role === undefined || !role.enabled || !role.safe) {
          throw new RoleNotPermittedError('the default role of this data table is disabled');
        }
        return own(role);
      }
    }
  }

  async #principals(state: CatalogState, workspace: string, email: string): Promise<Principals> {
    return this.#directory === null
      ? state.principals(workspace, email)
      : this.#directory.principals(workspace, email);
  }

  async listLogins(): Promise<
    { login: string; roles: string[]; hasRow: boolean; canLogin: boolean }[]
  > {
    const state = await this.#snapshot.current();
    const logins = await this.#setLogins.list();
    return logins.map(({ roleOids, ...rest }) => ({
      ...rest,
      roles: roleOids.map((oid) => state.role(oid)?.name ?? `#${oid}`),
    }));
  }

  async gcLogins(): Promise<string[]> {
    const state = await this.#snapshot.current();
    const wanted = new Set<string>();
    for (const workspace of state.workspaces()) {
      for (const email of state.knownEmails(workspace)) {
        const principals = await this.#principals(state, workspace, email);
        const byDatatable = new Map<string, number[]>();
        for (const role of resolveRoles(state, workspace, email, principals)) {
          byDatatable.set(role.datatable, [...(byDatatable.get(role.datatable) ?? []), role.oid]);
        }
        for (const oids of byDatatable.values()) {
          if (oids.length > 1) wanted.add(RoleSetLogins.loginName(oids));
        }
      }
    }
    const databases = await this.admin.databases();
    const retired: string[] = [];
    for (const { login } of await this.#setLogins.list()) {
      if (wanted.has(login)) continue;
      await this.#setLogins.retire(login, databases);
      this.#pools.evict(login);
      retired.push(login);
    }
    return retired;
  }

  async ping(): Promise<void> {
    await this.#pool.query('select 1');
  }

  async close(): Promise<void> {
    this.#closed = true;
    await this.#snapshot.close();
    await this.#pools.close();
    await this.#pool.end().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
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
