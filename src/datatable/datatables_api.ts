import type pg from 'pg';
import type { DatatableConnector } from '../connector/datatable_connector.js';
import type { FingerprintTracking } from '../connector/fingerprint.js';
import type { Duration } from '../duration.js';
import type { TypedEmitter } from '../events.js';
import type { Job } from '../job.js';
import type { Logger } from '../logger.js';
import type { CatalogAdmin } from './admin/catalog_admin.js';
import type { Directory, Principals } from './catalog/directory.js';
import type { DatatablesEvents } from './datatables_events.js';
import type { JobExplanation } from './datatables_explain.js';
import type { SetLoginInfo } from './logins/login_gc.js';
import type { RoleSetStepHook } from './logins/role_set_protocol.js';

/* The data-table layer's public shape: its options and the Datatables interface. */

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
  /**
   * A direct connection for the catalog's LISTEN client, when `connection` goes through a
   * transaction-mode pooler (PgBouncer), where LISTEN does not work. One per process. An
   * `application_name` given here (in the URL or the config) names the backend in
   * `pg_stat_activity`; otherwise it is `viewer-cache-listener`.
   * @default `connection`
   */
  listenConnection?: string | pg.ClientConfig;
  /**
   * Where data-table *login* connections go, when not where `connection` goes: host, port, ssl
   * (user, password and database are each login's own and ignored here), e.g. a PgBouncer.
   * @default `connection`'s host and port
   */
  loginConnection?: string | pg.ClientConfig;
  /**
   * `loginConnection` is a transaction-mode pooler (PgBouncer `pool_mode = transaction`):
   * login connections then rely on nothing session-scoped. The viewer identity is bound inside
   * each of a run's transactions instead of once per lease (transaction-local, signed for that
   * transaction). The pooler must reset every backend after each transaction
   * (`server_reset_query_always = 1`; probed at start). `pools.statementTimeout` is a session
   * setting and is refused (set it on the pooler or the database instead).
   * @default false
   */
  transactionPooler?: boolean;
  /** Catalog freshness. */
  catalog?: {
    /**
     * How often the LISTEN connection proves it is alive (a generation read through it). With
     * the listener silently dead, a change goes unnoticed for at most `heartbeat +
     * heartbeatTimeout`; meanwhile every run confirms the generation with Postgres.
     * @default '1s'
     */
    heartbeat?: Duration;
    /** @default '1s' */
    heartbeatTimeout?: Duration;
    /**
     * Each admin change returns only once every other live process acknowledged it (at most
     * `heartbeat + heartbeatTimeout`), so any run that starts anywhere after it returns sees the
     * change. Costs the slowest process's notification round trip per change (milliseconds);
     * every process acknowledges either way. Changes to governing tables' rows, made by other
     * connections, are not covered. @default false
     */
    awaitPropagation?: boolean;
  };
  /**
   * With an OpenTelemetry SDK registered, each statement a runnable sends gets a span named by
   * its operation (`SELECT`, …). `true` adds the statement's text as `db.query.text`, with every
   * literal replaced by `?` (strings, numbers, dollar-quoted bodies). Off by default: even
   * sanitized, a statement names the tables and columns a viewer's app reads. @default false
   */
  traceStatementText?: boolean;
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
    /**
     * Connections open at most across all login pools of this process; idle pools are closed
     * first to make room, then leases wait for a connection to come back.
     * @default 20
     */
    maxConnections?: number;
    /** Longest a lease waits for room under `maxConnections` (then E_CONNECT_FAILED). @default '10s' */
    acquireTimeout?: Duration;
    /** @default '30s' */
    idleTimeout?: Duration;
    /** `statement_timeout` of login connections; 0 = none. @default 0 */
    statementTimeout?: Duration;
    /**
     * Prepare a set login as soon as the catalog shows a new combination of roles (a membership
     * or tenant change), rather than on the viewer's first run. Built-in directory only.
     * @default true
     */
    prepareAhead?: boolean;
    /**
     * After each job, check (off the request path, one admin query per login at a time) that
     * the runnable did not change its login — password, per-role settings, attributes,
     * memberships — and take the login back if it did (SPEC invariant 15). Turning it off
     * leaves such a change in place until the next authentication failure or pool open.
     * @default true
     */
    checkOnRelease?: boolean;
  };
  /**
   * Bind the run's viewer to every `?as=viewer` connection, so that policies can read it with
   * `viewer_cache.viewer_email()` (and `viewer_cache.viewer_attribute(name)`); the functions are
   * installed in each data-table database. After a connection's first viewer lease (one round
   * trip, once) it costs no round trip of its own: the binding rides in front of the run's first
   * statement, which then takes the extended protocol, and each reset draws the connection's
   * next epoch. A warm miss measured ≈ 0.1 ms more with it on a 2-core host
   * (`bench/warm_miss.ts`).
   * @default true
   */
  viewerIdentity?: boolean;
  /** @default silent */
  logger?: Logger;
}

/** Hooks for tests; not part of the public options. */
export interface DatatablesTestHooks {
  /** Called before each step of the set-login protocol; throw to simulate a crash there. */
  beforeLoginStep?: RoleSetStepHook;
  /** Called before each rules check of a data-table database; throw to make it fail. */
  beforeRulesCheck?: (database: string) => void;
}

/**
 * Data tables as the viewer: the {@link DatatableConnector} to give {@link createExecutor}, the
 * `fingerprint` to give {@link withResultCache}, and the catalog admin API.
 */
export interface Datatables extends DatatableConnector {
  /**
   * The authorization fingerprint of a job, for `withResultCache({ fingerprint })`: what the
   * data-table references and role checks its runnable was seen to make are granted (see
   * `run_dependencies.ts`). With `track`, the cache stores each result under what its run
   * actually depended on.
   */
  readonly fingerprint: ((job: Job) => string | Promise<string>) & {
    readonly track: (job: Job) => FingerprintTracking;
  };
  readonly admin: CatalogAdmin;
  readonly events: Pick<TypedEmitter<DatatablesEvents>, 'on' | 'off'>;
  /** Generation of the catalog state in memory. */
  readonly generation: number;
  /**
   * Login connections of this process: open (≤ `pools.maxConnections`), lent to jobs, and
   * leases waiting for room.
   */
  readonly connections: { open: number; lent: number; waiting: number };
  /** Whether the LISTEN connection is up (else every run reads the generation from Postgres). */
  readonly listenerUp: boolean;
  /** Resolves once this process has loaded `generation` (or newer). */
  waitForGeneration(generation: number): Promise<void>;
  /**
   * "Next run" for writers of governing tables: call after committing rows on a connection of
   * your own; resolves once every live process's next run sees the catalog as of `generation`
   * (default: the generation in Postgres when called, which includes every write committed
   * before). A process that does not answer is waited for at most heartbeat + timeout, by when
   * it has stopped trusting its memory. `missing` counts those.
   */
  awaitPropagation(
    generation?: number,
  ): Promise<{ generation: number; acknowledged: number; missing: number }>;
  /**
   * Drops every cache entry whose run depended on data table `datatable`, in every process (its
   * rules version moves: SPEC invariant 22), for rule changes the library cannot see — a
   * policy reading another database, a function reading the clock. Resolves once every live
   * process acknowledged it (`acknowledged`), or the staleness bound passed (`missing` counts
   * those that did not answer; they have stopped trusting their memory by then).
   * @throws {UnknownDatatableError} E_UNKNOWN_DATATABLE when the workspace has no such data table.
   */
  invalidateDatatable(
    workspace: string,
    datatable: string,
  ): Promise<{ generation: number; acknowledged: number; missing: number }>;
  /**
   * How rule changes in the data table's database reach this process: `event-trigger` (in the
   * DDL's transaction), `digest` (read every heartbeat; bound heartbeat + timeout), or null
   * before its first check (or no such data table).
   */
  rulesMode(workspace: string, datatable: string): 'event-trigger' | 'digest' | null;
  /** Set logins, with the names of the roles they hold. */
  listLogins(): Promise<SetLoginInfo[]>;
  /**
   * Retires set logins that no viewer known to the catalog resolves to any more (and orphans
   * without a row). With a plugged-in directory only `user:` tenants are known, so a login still
   * in use may be retired; it is recreated on its next use.
   */
  gcLogins(): Promise<string[]>;
  /**
   * Collects the learned dependency sets of runnable versions no process has read or grown for
   * `idle` (default 30 days): versions no longer served. At most `maxRows` (default 10,000) in one
   * call, in batches of 1,000. Always safe: a version without a set is keyed on the full
   * fingerprint until its runs learn it again. Resolves to how many were removed.
   * @throws {TypeError} a bad `idle` or `maxRows`
   */
  gcLearnedSets(options?: { idle?: Duration; maxRows?: number }): Promise<number>;
  /**
   * Who `email` is in `workspace`'s directory: their groups and folders, and whether they are a
   * workspace admin (membership kind `admin`) — from a catalog no older than the call (the
   * built-in directory), or the plugged-in directory's answer. For an application's own checks
   * (the reference server lets only an app's publisher or a workspace admin fan a run out).
   */
  principals(workspace: string, email: string): Promise<Principals>;
  /**
   * What the data tables would do for `job` now (for `viewer-cache explain`): its runnable
   * version's learned dependency set, each question's roles and login (or refusal code), and
   * the digest of the fingerprint its cache key carries. Never a password, a row or a token.
   */
  explain(job: Job): Promise<JobExplanation>;
  /** Checks the catalog database answers (for readiness probes). */
  ping(): Promise<void>;
  /** Closes every connection; connections still lent are destroyed. Always resolves. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}
