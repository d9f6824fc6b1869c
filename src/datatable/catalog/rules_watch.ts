import pg from 'pg';
import { type Logger, silentLogger } from '../../logger.js';
import { GuardedClient, withPooledClient } from '../../pg/pg_clients.js';
import { CLOSE_WAIT_MS, settleWithin } from '../../util/settle_within.js';
import type { CatalogState } from './catalog_state.js';
import { CATALOG_CHANNEL } from './migrations.js';
import { READ_RULES_DIGEST, RULES_TRIGGERS_ON, recordRulesDigest } from './sql/rules.js';

/** How a data table's rule changes reach the cache. */
export type RulesMode = 'event-trigger' | 'digest';

export interface RulesWatchOptions {
  /** Pool on the catalog database. */
  pool: pg.Pool;
  /** The privileged connection; pointed at each other data-table database to read its digest. */
  adminConfig: pg.ClientConfig;
  /** How often each database is checked. */
  intervalMs: number;
  /** A check not answered within this long fails (the database stays unconfirmed). */
  timeoutMs: number;
  /** The latest catalog state (which data tables live in which database). */
  latest: () => CatalogState | null;
  /** A digest moved and was recorded at `generation`: stop serving the state before it. */
  onCommitted: (generation: number) => void;
  logger?: Logger;
  /** Test hook: called before each database's check; throwing fails that check. */
  beforeCheck?: (database: string) => void;
}

interface Watched {
  mode: RulesMode | null;
  /** Start (performance.now) of the last check that confirmed the version. */
  confirmedAt: number;
}

/** The databases of a state's data tables. */
function databasesOf(state: CatalogState): Set<string> {
  const databases = new Set<string>();
  for (const workspace of state.workspaces())
    for (const { database } of state.datatables(workspace)) databases.add(database);
  return databases;
}

/**
 * Whether each data-table database's rules version (CatalogState.rulesVersion, part of every
 * grant) is confirmed — SPEC invariant 22.
 *
 * Mechanism A, the event trigger: in the catalog's database, migration 7 installs (as a
 * superuser) event triggers that bump the version of that database's data tables in the DDL's
 * own transaction, with the generation and a NOTIFY: the catalog snapshot's freshness covers
 * it. Each check here only proves the triggers are still there (one catalog read).
 *
 * Mechanism B, the digest: any other database (or the catalog's, without the triggers) has a
 * digest of its rules read every `intervalMs`; a digest that moved is recorded in the catalog
 * with a fresh version, a generation bump and a NOTIFY, so every process moves with it.
 *
 * Fail closed: a database whose last confirming check started more than `intervalMs +
 * timeoutMs` ago (down, slow, or this process stalled) is unconfirmed, and every answer that
 * connects there is keyed on a value no entry was stored under (see JobAuthorization): such
 * runs execute, and nothing they store is ever served. Runs of other data tables keep hitting.
 * The check runs in the background; the hit path reads {@link confirmed} without I/O.
 */
export class RulesWatch {
  readonly #options: RulesWatchOptions;
  readonly #logger: Logger;
  readonly #boundMs: number;
  readonly #watched = new Map<string, Watched>();
  /** Pools on data-table databases other than the catalog's, opened for digests. */
  readonly #pools = new Map<string, pg.Pool>();
  /** Data tables whose mode was said, with the mode ("once per data table"). */
  readonly #said = new Map<string, RulesMode>();
  /** When each database's last check failed (cleared when one succeeds). */
  readonly #failedAt = new Map<string, number>();
  #catalogDatabase = '';
  /** Confirmed databases, and until when all of them stay confirmed without another check. */
  #confirmed: ReadonlySet<string> = new Set();
  #until = Number.NEGATIVE_INFINITY;
  #timer: NodeJS.Timeout | undefined;
  #checking: Promise<void> | null = null;
  #closed = false;
  readonly #reads = new Set<Promise<unknown>>();

  constructor(options: RulesWatchOptions) {
    this.#options = options;
    this.#logger = options.logger ?? silentLogger;
    this.#boundMs = options.intervalMs + options.timeoutMs;
  }

  /** The longest a rule change goes unnoticed under the digest (README, docs/rules-changes.md). */
  get boundMs(): number {
    return this.#boundMs;
  }

  /** First check of every database (after the catalog's first load), then one per interval. */
  async start(): Promise<void> {
    const { rows } = await this.#options.pool.query<{ name: string }>(
      'select current_database() as name',
    );
    this.#catalogDatabase = rows[0]!.name;
    await this.check();
    this.#timer = setInterval(() => void this.check(), this.#options.intervalMs);
    this.#timer.unref();
  }

  /**
   * The databases whose rules version is confirmed now: the same object until the set changes
   * (memos compare it by identity). No I/O.
   */
  confirmed(): ReadonlySet<string> {
    const now = performance.now();
    if (now <= this.#until) return this.#confirmed;
    this.#recompute(now);
    return this.#confirmed;
  }

  /**
   * Checks now, unless every database of `state` is confirmed or failed its last check less
   * than an interval ago (then waiting would only repeat the failure on the run's path): for
   * runs that found a database unconfirmed — a data table registered since the last check, or
   * a check that is late.
   */
  async confirm(state: CatalogState): Promise<void> {
    const confirmed = this.confirmed();
    const now = performance.now();
    for (const database of databasesOf(state)) {
      if (confirmed.has(database)) continue;
      const failed = this.#failedAt.get(database);
      if (failed !== undefined && now - failed < this.#options.intervalMs) continue;
      await this.check();
      return;
    }
  }

  /** How each database's rules reach the cache, as last checked (null: not checked yet). */
  modeOf(database: string): RulesMode | null {
    return this.#watched.get(database)?.mode ?? null;
  }

  /** Checks every data-table database once (concurrent callers share one pass). */
  check(): Promise<void> {
    if (this.#checking !== null) return this.#checking;
    const pass = this.#checkAll().finally(() => {
      this.#checking = null;
    });
    this.#checking = pass;
    return pass;
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#confirmed = new Set();
    this.#until = Number.NEGATIVE_INFINITY;
    await settleWithin(this.#reads, CLOSE_WAIT_MS);
    await Promise.all([...this.#pools.values()].map((pool) => pool.end().catch(() => {})));
  }

  async #checkAll(): Promise<void> {
    const state = this.#options.latest();
    if (state === null || this.#closed) return;
    const byDatabase = new Map<string, { workspace: string; name: string }[]>();
    for (const workspace of state.workspaces()) {
      for (const { name, database } of state.datatables(workspace)) {
        const list = byDatabase.get(database) ?? [];
        list.push({ workspace, name });
        byDatabase.set(database, list);
      }
    }
    for (const database of this.#watched.keys()) {
      if (!byDatabase.has(database)) this.#watched.delete(database);
    }
    let triggersOn: Promise<boolean> | null = null;
    await Promise.all(
      [...byDatabase].map(async ([database, datatables]) => {
        const started = performance.now();
        try {
          this.#options.beforeCheck?.(database);
          let mode: RulesMode = 'digest';
          if (database === this.#catalogDatabase) {
            triggersOn ??= this.#timed(this.#options.pool, RULES_TRIGGERS_ON).then(
              (rows) => rows[0]?.['on'] === true,
            );
            if (await triggersOn) mode = 'event-trigger';
          }
          if (mode === 'digest') await this.#digest(database);
          this.#confirm(database, mode, started, datatables);
          this.#failedAt.delete(database);
        } catch (err) {
          this.#failedAt.set(database, performance.now());
          if (!this.#closed)
            this.#logger.warn(
              { database, err: (err as Error).message },
              'could not confirm the rules of a data-table database; its entries are not served until it answers',
            );
        }
      }),
    );
    this.#recompute(performance.now());
  }

  /** Reads the database's digest and records it in the catalog if it moved. */
  async #digest(database: string): Promise<void> {
    const rows = await this.#timed(this.#poolFor(database), READ_RULES_DIGEST);
    const digest = String(rows[0]?.['digest'] ?? '');
    const recorded = await this.#timed(this.#options.pool, recordRulesDigest(CATALOG_CHANNEL), [
      database,
      digest,
    ]);
    const generation = recorded[0]?.['value'];
    if (generation !== undefined && generation !== null)
      this.#options.onCommitted(Number(generation));
  }

  #confirm(
    database: string,
    mode: RulesMode,
    started: number,
    datatables: readonly { workspace: string; name: string }[],
  ): void {
    if (this.#closed) return;
    const watched = this.#watched.get(database);
    if (watched === undefined) this.#watched.set(database, { mode, confirmedAt: started });
    else {
      watched.mode = mode;
      watched.confirmedAt = Math.max(watched.confirmedAt, started);
    }
    for (const { workspace, name } of datatables) {
      const key = `${workspace}\0${name}`;
      const said = this.#said.get(key);
      if (said === mode) continue;
      this.#said.set(key, mode);
      const how =
        mode === 'event-trigger'
          ? 'rule changes (policies, grants, views, functions) reach the cache through an event trigger, in the same transaction'
          : `rule changes (policies, grants, views, functions) reach the cache through a digest read every ${this.#options.intervalMs} ms (bound ${this.#boundMs} ms); install the event trigger (migration 7 as a superuser) to make them immediate`;
      const fields = { workspace, datatable: name, mode, boundMs: this.#boundMs };
      // A data table that fell back from the trigger (dropped or disabled) is news.
      if (said === 'event-trigger') this.#logger.warn(fields, how);
      else this.#logger.info(fields, how);
    }
  }

  #recompute(now: number): void {
    const confirmed = new Set<string>();
    let until = Number.POSITIVE_INFINITY;
    for (const [database, watched] of this.#watched) {
      const expires = watched.confirmedAt + this.#boundMs;
      if (expires < now) continue;
      confirmed.add(database);
      until = Math.min(until, expires);
    }
    if (this.#closed) {
      this.#confirmed = new Set();
      this.#until = Number.NEGATIVE_INFINITY;
      return;
    }
    this.#until = until;
    const same =
      confirmed.size === this.#confirmed.size &&
      [...confirmed].every((d) => this.#confirmed.has(d));
    if (!same) this.#confirmed = confirmed;
  }

  /** A query on `pool` within the timeout; close() waits for it. */
  #timed(pool: pg.Pool, text: string, values?: unknown[]): Promise<Record<string, unknown>[]> {
    if (this.#closed) return Promise.reject(new Error('the rules watch is closed'));
    let timer: NodeJS.Timeout | undefined;
    const query = withPooledClient(pool, async (client) => {
      const { rows } = await client.query<Record<string, unknown>>(text, values);
      return rows;
    });
    this.#reads.add(query);
    const forget = () => this.#reads.delete(query);
    query.then(forget, forget);
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`no answer within ${this.#options.timeoutMs} ms`)),
        this.#options.timeoutMs,
      );
    });
    return Promise.race([query, timeout]).finally(() => clearTimeout(timer));
  }

  #poolFor(database: string): pg.Pool {
    if (database === this.#catalogDatabase) return this.#options.pool;
    let pool = this.#pools.get(database);
    if (pool === undefined) {
      pool = new pg.Pool({
        Client: GuardedClient,
        ...this.#options.adminConfig,
        database,
        max: 1,
        idleTimeoutMillis: 30_000,
        allowExitOnIdle: true,
        application_name: 'viewer-cache-rules',
      });
      // An idle connection's failure: the next check reports its own.
      pool.on('error', () => {});
      this.#pools.set(database, pool);
    }
    return pool;
  }
}
