import type pg from 'pg';
import type {
  DatatableClient,
  DatatableLease,
  DatatableQueryResult,
} from '../../connector/datatable_connector.js';
import { ConnectionLostError } from '../../errors.js';
import type { Logger } from '../../logger.js';
import { type LeadStatement, queryWithLead } from '../../pg/lead_query.js';
import {
  CANNOT_RUN_IN_BLOCK,
  INSUFFICIENT_PRIVILEGE,
  isConnectionLost,
  NO_IDENTITY,
  SYNTAX_ERROR,
  sqlstateOf,
} from '../../pg/sqlstate.js';
import { refusalOf } from './statement_refusals.js';

/**
 * What a release runs on the connection (one Query message) before pooling it, then `onDone`
 * with pg's result; `onFailed` if it fails (the connection is then closed).
 */
export interface ResetPlan {
  readonly statement: string;
  readonly onDone?: (result: pg.QueryResult | pg.QueryResult[]) => void;
  readonly onFailed?: (err: unknown) => void;
}

/**
 * What a connection runs before it is pooled again: DISCARD ALL, as the sequence its
 * documentation gives (PostgreSQL 15–18), minus DISCARD PLANS. Dropping every cached plan made
 * the next lease re-plan the identity functions' statements (100–250 µs of server time per
 * lease here) and bought no isolation: the plan cache re-plans on its own when the role,
 * row_security or search_path a plan was made under changes, and prepared statements go with
 * DEALLOCATE ALL. Unlike DISCARD ALL, the sequence would run inside a transaction a runnable
 * left open, so release() destroys such a connection instead (see release()).
 */
export const RESET_SESSION =
  'close all; set session authorization default; reset all; deallocate all; unlisten *; ' +
  'select pg_catalog.pg_advisory_unlock_all(); discard temp; discard sequences';

const DISCARD_ONLY: ResetPlan = { statement: RESET_SESSION };

/**
 * Asks, off the lent connection (which may sit in an aborted transaction), whether a backend's
 * login is gone; and what to do when it is (let the login's connections go, forget its password).
 */
export interface StaleSessions {
  gone(pid: number): Promise<boolean>;
  onGone(login: string): void;
}

/**
 * A pooled connection lent to one job. The runnable only ever sees {@link DatatableClient}.
 *
 * The lease listens for `'error'` on its client from checkout until the client is back in the
 * pool or destroyed: a backend terminated mid-job (a retired login, an operator, a restart)
 * fails that job with `E_CONNECTION_LOST` instead of crashing the process, and the broken
 * client is destroyed, never pooled.
 */
export class PooledLease implements DatatableLease {
  #client: pg.PoolClient | null;
  #broken: Error | null = null;
  readonly #logger: Logger;
  readonly #onError = (err: Error) => {
    this.#broken ??= err;
  };
  readonly #login: string;
  /** What resets the connection before it goes back (see resetWith). */
  #reset: () => ResetPlan = () => DISCARD_ONLY;
  /** Runs if the connection is destroyed instead (best effort). */
  #onDestroy: (() => Promise<void>) | null = null;
  /** Sent in front of the next statement (see bindBeforeFirstQuery). */
  #pendingBind: readonly LeadStatement[] | null = null;
  /**
   * Through a transaction pooler: the binding sent in front of the first statement of each of
   * the run's transactions, signed afresh each time (see bindEveryTransaction).
   */
  #everyTransaction: (() => readonly LeadStatement[]) | null = null;
  /** The binding, sent inside a transaction the run opened and has not ended yet. */
  #openLead: readonly LeadStatement[] | null = null;
  /** The run's last statement (settled or not): the next one waits for it. */
  #turn: Promise<void> = Promise.resolve();
  #bindSent = false;
  #onBindFailed: ((err: unknown) => Error) | null = null;
  #bindFailure: Error | null = null;
  /** Told when a statement is refused the identity this lease bound (see ViewerIdentities.recheck). */
  #onIdentityRefused: (() => void) | null = null;
  readonly #onReleased: (lease: PooledLease, login: string) => void;
  readonly #shed: () => boolean;
  readonly #stale: StaleSessions | null;
  readonly client: DatatableClient;
  /** The pg client lent, as an opaque identity (what its backend's epoch is recorded by). */
  readonly connection: object;

  constructor(
    client: pg.PoolClient,
    login: string,
    logger: Logger,
    onReleased: (lease: PooledLease, login: string) => void,
    /** Whether a clean connection should be closed instead of pooled (others wait for room). */
    shed: () => boolean = () => false,
    stale: StaleSessions | null = null,
  ) {
    this.#shed = shed;
    this.#stale = stale;
    this.#client = client;
    this.connection = client;
    this.#login = login;
    this.#logger = logger;
    this.#onReleased = onReleased;
    client.on('error', this.#onError);
    // A frozen facade with no data properties: no credentials, no pool, no way to reconnect,
    // and `JSON.stringify` of it is `{}` should a runnable return it.
    this.client = Object.freeze({
      query: <Row = Record<string, unknown>>(text: string, values?: readonly unknown[]) =>
        this.query(text, values) as Promise<DatatableQueryResult<Row>>,
    });
  }

  /** Which backend this is: pid and client socket, to bind an identity to exactly it. */
  get backend(): { pid: number; clientAddress: string | null; clientPort: number | null } {
    const client = this.#client as unknown as { processID?: number } | null;
    const stream = this.#client === null ? undefined : socketOf(this.#client);
    return {
      pid: client?.processID ?? 0,
      clientAddress: stream?.localAddress ?? null,
      clientPort: stream?.localPort ?? null,
    };
  }

  /**
   * Replaces the reset run before the connection may be pooled again (it must succeed, or the
   * connection is closed), and what to do when it is closed instead. `plan` is asked at
   * release, when the run is over.
   */
  resetWith(plan: () => ResetPlan, onDestroy: () => Promise<void>): void {
    this.#reset = plan;
    this.#onDestroy = onDestroy;
  }

  /** Runs one of the library's own statements, before the connection is handed to a runnable. */
  async internalQuery(text: string): Promise<pg.QueryResult> {
    const client = this.#client;
    if (client === null) throw new Error('this data-table connection was released');
    return client.query(text);
  }

  /**
   * Sends `statements` (the viewer's binding) in front of the run's next statement, in the same
   * Sync (see LeadQuery): the binding costs no round trip of its own, and a run that never
   * queries binds nothing. If one fails, every statement of the run fails with `onFailed(err)`
   * and the connection is closed, never pooled. `onRefused` hears of a statement refused the
   * identity although the binding went out.
   */
  bindBeforeFirstQuery(
    statements: readonly LeadStatement[],
    onFailed: (err: unknown) => Error,
    onRefused: () => void,
  ): void {
    this.#pendingBind = statements;
    this.#onBindFailed = onFailed;
    this.#onIdentityRefused = onRefused;
  }

  /**
   * Through a transaction pooler, where each transaction may meet another backend: `lead()`
   * (a binding local to one transaction) goes in front of the first statement of each of the
   * run's transactions, in the same Sync, so it is in force for exactly that transaction and
   * void after it. Failures as for bindBeforeFirstQuery.
   */
  bindEveryTransaction(
    lead: () => readonly LeadStatement[],
    onFailed: (err: unknown) => Error,
    onRefused: () => void,
  ): void {
    this.#everyTransaction = lead;
    this.#onBindFailed = onFailed;
    this.#onIdentityRefused = onRefused;
  }

  /**
   * Runs one of the run's statements. Statements the runnable sends without waiting for each
   * other go out one after another: pg queues a query sent while another runs, which it
   * deprecates and pg 9 refuses.
   */
  query(text: string, values?: readonly unknown[]): Promise<DatatableQueryResult> {
    const sent = this.#turn.then(() => this.#statement(text, values));
    this.#turn = sent.then(noop, noop);
    return sent;
  }

  async #statement(text: string, values?: readonly unknown[]): Promise<DatatableQueryResult> {
    // In turn (see query): a first statement still in flight, which may yet lose the binding
    // (if it fails, its implicit transaction rolls the binding back), is done by now.
    const client = this.#usable();
    const config = values === undefined ? text : { text, values: [...values] };
    try {
      // In turn, so the transaction status is that of the statement about to go out.
      const every = this.#everyTransaction;
      const lead =
        every === null ? this.#pendingBind : client.getTransactionStatus() === 'I' ? every() : null;
      const result =
        lead === null
          ? await client.query(config)
          : await this.#queryWithLead(client, lead, config);
      this.#afterStatement(client, result);
      const own = Array.isArray(result) ? result[result.length - 1] : result;
      return { rows: own?.rows ?? [], rowCount: own?.rowCount ?? null };
    } catch (err) {
      if (err === this.#bindFailure) throw err;
      if (isConnectionLost(err)) {
        this.#broken ??= err as Error;
        throw new ConnectionLostError(undefined, { cause: err });
      }
      this.#afterStatement(client, null);
      const code = sqlstateOf(err);
      if (code === NO_IDENTITY && this.#bindSent) this.#onIdentityRefused?.();
      if (code === INSUFFICIENT_PRIVILEGE && (await this.#loginGone(client))) {
        // Not the runnable's refusal: the session outlived its login (dropped under it, by a
        // retire whose TERMINATE missed it while it was starting, or by an operator). Never
        // pooled again, and the login is prepared afresh; the run may be retried.
        this.#broken ??= err as Error;
        throw new ConnectionLostError(
          'the login of this data-table connection was dropped while it was open; retry',
          { cause: err },
        );
      }
      throw refusalOf(code, err) ?? err;
    }
  }

  /** Whether this session's login no longer exists (asked on another connection). */
  async #loginGone(client: pg.PoolClient): Promise<boolean> {
    const stale = this.#stale;
    const pid = (client as unknown as { processID?: number }).processID;
    if (stale === null || pid === undefined) return false;
    const gone = await stale.gone(pid).catch(() => false);
    if (gone) stale.onGone(this.#login);
    return gone;
  }

  #usable(): pg.PoolClient {
    const client = this.#client;
    if (client === null)
      throw new Error('this data-table connection was released when its job ended');
    if (this.#bindFailure !== null) throw this.#bindFailure;
    if (this.#broken !== null) throw new ConnectionLostError(undefined, { cause: this.#broken });
    return client;
  }

  /** The run's statement with the pending binding in front of it, in one Sync (see LeadQuery). */
  async #queryWithLead(
    client: pg.PoolClient,
    lead: readonly LeadStatement[],
    config: string | pg.QueryConfig,
  ): Promise<pg.QueryResult | pg.QueryResult[]> {
    this.#pendingBind = null;
    this.#bindSent = true;
    const sent = queryWithLead(
      client,
      lead,
      typeof config === 'string' ? { text: config } : config,
    );
    try {
      const result = await sent.result;
      this.#leadDone(client, lead, result);
      return result;
    } catch (err) {
      if (isConnectionLost(err)) throw err;
      this.#leadDone(client, lead, null);
      if (sent.leadFailed()) {
        // Never pooled again, and every later statement of the run refused the same way.
        this.#bindFailure = this.#onBindFailed!(err);
        throw this.#bindFailure;
      }
      const code = sqlstateOf(err);
      if (code !== CANNOT_RUN_IN_BLOCK && !(code === SYNTAX_ERROR && typeof config === 'string'))
        throw err;
      if (this.#everyTransaction !== null) {
        // A binding outside the statement's own transaction would be void for it: a statement
        // that refuses a transaction block runs unbound (reads of the identity raise); a text of
        // several statements runs inside a transaction of its own that carries the binding.
        if (code === CANNOT_RUN_IN_BLOCK) return await this.#usable().query(config);
        return await this.#severalInTransaction(config as string);
      }
      // The statement never ran, and the binding was rolled back with it: it refuses to run
      // inside a transaction block (VACUUM, CREATE INDEX CONCURRENTLY…), which the binding in
      // front made, or a text without parameters did not parse as one statement (it may hold
      // several, which only the simple protocol takes). Bind on its own, then send it as is —
      // unless the job ended meanwhile (it did not wait for this statement): the connection is
      // being reset and pooled, and nothing of the run may reach it after that.
      for (const statement of lead)
        await this.#usable().query({ text: statement.text, values: [...statement.values] });
      this.#pendingBind = null;
      this.#openLead = null;
      return await this.#usable().query(config);
    }
  }

  /** A text of several statements, in one transaction opened with the binding in front. */
  async #severalInTransaction(text: string): Promise<pg.QueryResult | pg.QueryResult[]> {
    const client = this.#usable();
    const sent = queryWithLead(client, this.#everyTransaction!(), { text: 'begin' });
    try {
      await sent.result;
    } catch (err) {
      if (sent.leadFailed() && !isConnectionLost(err)) {
        this.#bindFailure = this.#onBindFailed!(err);
        throw this.#bindFailure;
      }
      throw err;
    }
    try {
      const result = await client.query(text);
      if (client.getTransactionStatus() === 'T') await client.query('commit');
      return result;
    } catch (err) {
      if (!isConnectionLost(err) && client.getTransactionStatus() !== 'I')
        await client.query('rollback').catch(noop);
      throw err;
    }
  }

  /**
   * Where the binding stands after the statement it was sent with: committed with it, rolled
   * back (sent again in front of the next statement), or inside a transaction the run opened.
   */
  #leadDone(
    client: pg.PoolClient,
    lead: readonly LeadStatement[],
    result: pg.QueryResult | pg.QueryResult[] | null,
  ): void {
    // Bound per transaction: the next transaction carries its own.
    if (this.#everyTransaction !== null) return;
    if (client.getTransactionStatus() === 'I') {
      if (result === null || commandOf(result) === 'ROLLBACK') this.#pendingBind = lead;
    } else {
      this.#openLead = lead;
    }
  }

  /** A transaction that holds the binding ended: unless it committed, bind again. */
  #afterStatement(client: pg.PoolClient, result: pg.QueryResult | pg.QueryResult[] | null): void {
    const open = this.#openLead;
    if (open === null || client.getTransactionStatus() !== 'I') return;
    this.#openLead = null;
    if (result === null || commandOf(result) !== 'COMMIT') this.#pendingBind ??= open;
  }

  /**
   * Returns the connection: reset (RESET_SESSION) and pooled, or destroyed when `destroy` is
   * true (a job that timed out mid-query), the connection broke, a transaction is still open,
   * or the reset fails.
   */
  async release(destroy: boolean): Promise<void> {
    const client = this.#client;
    if (client === null) return;
    this.#client = null;
    // A runnable that left a transaction open (or failed) would have the reset run inside it,
    // and the connection pooled mid-transaction: such a connection is closed instead, here or,
    // when the transaction was opened by a statement still in flight, after the reset.
    const plan =
      destroy ||
      this.#broken !== null ||
      this.#bindFailure !== null ||
      client.getTransactionStatus() !== 'I'
        ? null
        : this.#reset();
    if (plan === null) {
      this.#onDestroy?.().catch(() => {});
      this.#finish(client, this.#broken ?? true);
      return;
    }
    // Not awaited: the job's result need not wait for the reset; the connection is simply not
    // back in the pool until it is clean. The error listener stays on until then. After the
    // run's statement in flight, if any (one it did not wait for): never two at once; those it
    // sent but that had not gone out yet are refused (the connection is released).
    this.#turn
      .then(() => client.query(plan.statement))
      .then(
        (result: pg.QueryResult | pg.QueryResult[]) => {
          if (client.getTransactionStatus() !== 'I') {
            // A statement the run sent without awaiting it (BEGIN) opened a transaction after the
            // check above: the reset ran inside it, and a ROLLBACK by the next job would undo it.
            this.#onDestroy?.().catch(() => {});
            this.#finish(client, true);
            return;
          }
          plan.onDone?.(result);
          this.#finish(client, this.#broken ?? this.#shed());
        },
        (err: unknown) => {
          this.#logger.debug(
            { err: (err as Error).message },
            'connection reset failed; closing it',
          );
          plan.onFailed?.(err);
          this.#onDestroy?.().catch(() => {});
          this.#finish(client, true);
        },
      );
  }

  /** Destroys the connection now (the pools are closing); a query in flight fails. */
  abandon(): void {
    const client = this.#client;
    if (client === null) return;
    this.#client = null;
    this.#broken ??= new Error('data-table pools closed');
    this.#finish(client, true);
  }

  #finish(client: pg.PoolClient, destroy: Error | boolean): void {
    // A late 'error' after release is not unhandled either: the pools' clients are
    // GuardedClients, which always listen (adding a no-op here on every release leaked one
    // listener per reuse).
    client.off('error', this.#onError);
    client.release(destroy);
    this.#onReleased(this, this.#login);
  }
}

function noop(): void {}

/** The socket under a pg client (not in its public types). */
function socketOf(
  client: pg.PoolClient,
): { localAddress?: string; localPort?: number } | undefined {
  return (
    client as unknown as { connection?: { stream?: { localAddress?: string; localPort?: number } } }
  ).connection?.stream;
}

/** The command tag of the last statement of a result. */
function commandOf(result: pg.QueryResult | pg.QueryResult[]): string | undefined {
  return Array.isArray(result) ? result[result.length - 1]?.command : result.command;
}
