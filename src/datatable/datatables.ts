/*
 * datatable/ — data tables as the viewer. This file is the front door: createDatatables, and
 * the service that wires the rooms together and hands each request down to them. Beside it:
 * the public shape (datatables_api.ts), the options resolved once (datatables_options.ts) and
 * the events (datatables_events.ts). The rooms, each importing only those beneath it:
 * pg/ ← catalog/ ← access/ ← logins/ ← identity/ and admin/; none imports this floor.
 */

import type { Span, Tracer } from '@opentelemetry/api';
import pg from 'pg';
import type { DatatableLease } from '../connector/datatable_connector.js';
import type { DatatableRef } from '../connector/datatable_ref.js';
import { type Duration, resolveDuration } from '../duration.js';
import {
  ConnectFailedError,
  ConnectionLostError,
  DatatableUnreachableError,
  ViewerCacheError,
} from '../errors.js';
import { TypedEmitter } from '../events.js';
import type { Job } from '../job.js';
import type { Logger } from '../logger.js';
import { CoalescingSocket } from '../pg/coalescing_socket.js';
import { GuardedClient } from '../pg/pg_clients.js';
import { unreachableReason } from '../pg/sqlstate.js';
import { inSpan, sdkTracer } from '../tracing.js';
import { JobAuthorizations } from './access/job_authorizations.js';
import { LearnedSets } from './access/learned_sets.js';
import { RunDependencies } from './access/run_dependencies.js';
import { CatalogAdmin } from './admin/catalog_admin.js';
import { CatalogSnapshot } from './catalog/catalog_snapshot.js';
import type { Directory, Principals } from './catalog/directory.js';
import { LEARNED_CHANNEL, migrateCatalog } from './catalog/migrations.js';
import { type RulesMode, RulesWatch } from './catalog/rules_watch.js';
import { checkSecretKey } from './catalog/secret_check.js';
import type { Datatables, DatatablesTestHooks, RawDatatablesOptions } from './datatables_api.js';
import type { DatatablesEvents } from './datatables_events.js';
import { explainJob, type JobExplanation } from './datatables_explain.js';
import { type ResolvedDatatablesOptions, resolveDatatablesOptions } from './datatables_options.js';
import { ViewerBinding, viewerIdentityOf } from './identity/viewer_binding.js';
import { ViewerIdentities } from './identity/viewer_identity.js';
import { listSetLogins, type SetLoginInfo, wantedSetLogins } from './logins/login_gc.js';
import { LoginLeaser } from './logins/login_leaser.js';
import { LoginPools } from './logins/login_pools.js';
import { LoginRepair } from './logins/login_repair.js';
import { probePooler } from './logins/pooler_probe.js';
import { RoleSetProtocol } from './logins/role_set_protocol.js';
import { SetLoginWarmer } from './logins/set_login_warmer.js';
import { SESSION_LOGIN_GONE } from './logins/sql/logins.js';
import { traceLease } from './traced_lease.js';

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
  const resolved = resolveDatatablesOptions(options);
  const service = new DatatableService(resolved, hooks);
  try {
    await service.start(resolved);
  } catch (err) {
    await service.close();
    throw err;
  }
  return service;
}

/** How long a learned set goes unread before `gcLearnedSets` collects it, by default. */
const LEARNED_SET_IDLE = '30d';

/** Wiring: the catalog, who may use what, leasing, and the admin API, put together. */
class DatatableService implements Datatables {
  readonly events = new TypedEmitter<DatatablesEvents>();
  readonly admin: CatalogAdmin;
  readonly fingerprint: Datatables['fingerprint'];
  readonly #traceStatementText: boolean;
  readonly #pool: pg.Pool;
  readonly #snapshot: CatalogSnapshot;
  readonly #rules: RulesWatch;
  readonly #authorizations: JobAuthorizations;
  readonly #dependencies: RunDependencies;
  readonly #learnedSets: LearnedSets;
  readonly #protocol: RoleSetProtocol;
  readonly #pools: LoginPools;
  readonly #leaser: LoginLeaser;
  readonly #warmer: SetLoginWarmer | null;
  readonly #identities: ViewerIdentities | null;
  readonly #binding: ViewerBinding | null;
  readonly #directory: Directory | null;
  readonly #logger: Logger;
  #closed = false;

  constructor(options: ResolvedDatatablesOptions, hooks: DatatablesTestHooks) {
    const { adminConfig, passwords, pools, catalog } = options;
    this.#directory = options.directory;
    this.#logger = options.logger;
    const logger = this.#logger;
    const events = this.events;

    this.#traceStatementText = options.traceStatementText;
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
    this.#snapshot = new CatalogSnapshot({
      pool: this.#pool,
      listenConnection: options.listenConfig,
      events,
      logger,
      heartbeatMs: catalog.heartbeatMs,
      heartbeatTimeoutMs: catalog.heartbeatTimeoutMs,
      ackKey: passwords.deriveKey('propagation acknowledgements'),
      // A learned set that grew elsewhere: read it again on this process's next run of it.
      channels: {
        [LEARNED_CHANNEL]: (payload) => {
          const announced = LearnedSets.parseAnnouncement(payload);
          if (announced !== null) this.#dependencies.forget(announced.digest, announced.size);
        },
      },
    });
    this.#rules = new RulesWatch({
      pool: this.#pool,
      adminConfig,
      intervalMs: catalog.heartbeatMs,
      timeoutMs: catalog.heartbeatTimeoutMs,
      latest: () => this.#snapshot.latest,
      onCommitted: (generation) => this.#snapshot.invalidate(generation),
      logger,
      ...(hooks.beforeRulesCheck ? { beforeCheck: hooks.beforeRulesCheck } : {}),
    });
    this.#authorizations = new JobAuthorizations(this.#snapshot, this.#directory, this.#rules);
    const learned = new LearnedSets({
      pool: this.#pool,
      key: passwords.deriveKey('learned dependency sets'),
      logger,
    });
    this.#learnedSets = learned;
    this.#dependencies = new RunDependencies((job) => this.#authorizations.of(job), {
      shared: {
        load: (version) => learned.load(version),
        save: (version, set) => learned.save(version, set),
        digest: (version) => LearnedSets.digest(version),
        hearsAnnouncements: () => this.#snapshot.listenerUp,
      },
    });
    // Announcements missed while the listener was down: every version is read again.
    events.on('catalog:listener', ({ up }) => {
      if (up) this.#dependencies.forgetAll();
    });
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
      base: { ...options.loginConfig, stream: () => new CoalescingSocket() },
      maxPools: pools.max,
      poolSize: pools.size,
      maxConnections: pools.maxConnections,
      acquireTimeoutMs: pools.acquireTimeoutMs,
      idleTimeoutMs: pools.idleTimeoutMs,
      statementTimeoutMs: pools.statementTimeoutMs,
      ...(pools.checkOnRelease
        ? { onRelease: (login: string) => this.#leaser.released(login) }
        : {}),
      sessionLoginGone: async (pid) =>
        (await this.#pool.query<{ gone: boolean }>(SESSION_LOGIN_GONE, [pid])).rows[0]?.gone ===
        true,
      onLoginGone: (login) => this.#leaser.forget(login),
      logger,
    });
    this.#leaser = new LoginLeaser({
      pools: this.#pools,
      protocol: this.#protocol,
      repair: new LoginRepair({ admin: this.#pool, passwords, events, logger }),
      passwords,
      events,
      logger,
    });
    this.#warmer =
      pools.prepareAhead && this.#directory === null
        ? new SetLoginWarmer(this.#leaser, logger)
        : null;
    if (this.#warmer !== null) {
      const warmer = this.#warmer;
      events.on('catalog:refreshed', () => {
        const state = this.#snapshot.latest;
        if (state !== null) warmer.refreshed(state);
      });
    }
    this.#identities = options.viewerIdentity ? new ViewerIdentities(adminConfig, logger) : null;
    this.#binding =
      this.#identities === null
        ? null
        : new ViewerBinding(this.#identities, {
            perTransaction: options.transactionPooler,
          });
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
      ...(catalog.awaitPropagation
        ? { watchPropagation: () => this.#snapshot.watchPropagation() }
        : {}),
      onDatatableCreated: (database) => this.#identities?.install(database),
      logger,
    });
  }

  async start(options: ResolvedDatatablesOptions): Promise<void> {
    if (options.transactionPooler) {
      // Refused before anything is lent: a pooler that keeps a SET between transactions would
      // hand a runnable's SET ROLE to the next run of its login.
      const met = await probePooler({ ...options.adminConfig, ...options.loginConfig });
      if (!met)
        this.#logger.warn(
          'transactionPooler: the pooler probe never met its backend again (session mode, or a busy pool): could not confirm server_reset_query_always = 1',
        );
    }
    if (options.migrate) await migrateCatalog(this.#pool);
    // A key of its own for this use: never a password or another MAC.
    await checkSecretKey(this.#pool, options.passwords.deriveKey('secret-check'));
    await this.#snapshot.start();
    await this.#rules.start();
  }

  rulesMode(workspace: string, datatable: string): RulesMode | null {
    const found = this.#snapshot.latest?.datatable(workspace, datatable);
    return found === undefined ? null : this.#rules.modeOf(found.database);
  }

  async invalidateDatatable(
    workspace: string,
    datatable: string,
  ): Promise<{ generation: number; acknowledged: number; missing: number }> {
    const { generation } = await this.admin.bumpRulesVersion(workspace, datatable);
    return this.#snapshot.awaitPropagation(generation);
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

  awaitPropagation(
    generation?: number,
  ): Promise<{ generation: number; acknowledged: number; missing: number }> {
    return this.#snapshot.awaitPropagation(generation);
  }

  connect(job: Job, ref: DatatableRef): Promise<DatatableLease> {
    // Asked per call (one property read): connecting is off the hit path.
    const tracer = sdkTracer();
    if (tracer === null) return this.#connect(job, ref, null, null);
    return inSpan(
      tracer,
      'viewer_cache.datatable.connect',
      { 'viewer_cache.datatable.access': ref.access.kind },
      (span) => this.#connect(job, ref, span, tracer),
    );
  }

  async #connect(
    job: Job,
    ref: DatatableRef,
    span: Span | null,
    tracer: Tracer | null,
  ): Promise<DatatableLease> {
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
      // The kind of login, never its name: a role's own, or a set's (several roles).
      span?.setAttribute(
        'viewer_cache.login.kind',
        roles.length > 1 ? 'set' : roles.length === 1 ? 'role' : 'default',
      );
      let lease = await this.#leaser.lease(roles, datatable.database);
      if (this.#binding !== null) {
        // grant() refused `?as=viewer` for a run with no viewer: here there is one.
        // A narrowed viewer request is the viewer too: fewer roles, the same identity.
        lease =
          access === 'viewer' || access === 'narrowed'
            ? await this.#binding.bind(lease, datatable.database, viewerIdentityOf(job.perms))
            : this.#binding.bind(lease, datatable.database, null);
      }
      if (timed)
        this.events.emit('datatable:connected', { ms: performance.now() - afterResolve, access });
      return tracer === null
        ? lease
        : traceLease(lease, tracer, datatable.database, this.#traceStatementText);
    } catch (thrown) {
      // The data table's database down (refused, terminated while connecting, timed out) is
      // said as such, whichever step met it (the catalog read, the login, the binding). A
      // connection that was up and then ended (an operator's pg_terminate_backend) stays
      // E_CONNECTION_LOST: the database answers, the next run gets a fresh connection.
      const unreachable = thrown instanceof ConnectionLostError ? null : unreachableReason(thrown);
      const err =
        unreachable !== null
          ? new DatatableUnreachableError(
              `data table "${ref.name}" is unavailable: its database is unreachable (${unreachable}); retry once it is back`,
              { cause: thrown, datatable: ref.name },
            )
          : thrown instanceof ViewerCacheError
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

  async gcLearnedSets(options: { idle?: Duration; maxRows?: number } = {}): Promise<number> {
    const idleMs = resolveDuration(options.idle ?? LEARNED_SET_IDLE, 'idle');
    const maxRows = options.maxRows ?? 10_000;
    if (!Number.isSafeInteger(maxRows) || maxRows < 1)
      throw new TypeError('maxRows must be a positive integer');
    if (idleMs < 1) throw new TypeError('idle must be positive');
    return this.#learnedSets.collect(idleMs, maxRows);
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

  async explain(job: Job): Promise<JobExplanation> {
    const [authorization, set, fingerprint, datatables] = await Promise.all([
      this.#authorizations.of(job),
      this.#dependencies.learned(job),
      this.#dependencies.fingerprint(job),
      this.admin.listDatatables(job.workspace),
    ]);
    return explainJob(
      job,
      authorization,
      set,
      datatables.map((d) => d.name),
      fingerprint,
    );
  }

  async principals(workspace: string, email: string): Promise<Principals> {
    if (this.#directory !== null) return this.#directory.principals(workspace, email);
    return (await this.#snapshot.current()).principals(workspace, email);
  }

  async ping(): Promise<void> {
    await this.#pool.query('select 1');
  }

  async close(): Promise<void> {
    this.#closed = true;
    // Background work first, while the pools it uses are still open: each waits for what it
    // has under way and starts nothing more (nothing logs a pool ended under it).
    await this.#warmer?.close();
    await this.#leaser.close();
    await this.#rules.close();
    await this.#snapshot.close();
    await this.#pools.close();
    await this.#identities?.close();
    await this.#pool.end().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
