/*
 * Transactions through the query proxy. A runnable on an agent sends `BEGIN`, its statements and
 * `COMMIT` (or `ROLLBACK`) as it would in process; the proxy holds one lease for them — the job's
 * recorded viewer's, as for a single statement — bound to the job and to an unguessable id, and
 * within bounds of time and statements. However the transaction ends (the agent commits or rolls
 * back, a bound passes, the job or the agent ends, the server stops), it is rolled back unless it
 * committed, and the lease goes back reset (or is closed).
 */
import { createHash, randomBytes } from 'node:crypto';
import pg from 'pg';
import type { DatatableConnector, DatatableLease } from '../connector/datatable_connector.js';
import type { DatatableRef } from '../connector/datatable_ref.js';
import { type Duration, resolveDuration } from '../duration.js';
import {
  AgentProtocolError,
  JobTokenInvalidError,
  StatementRefusedError,
  TransactionEndedError,
  TransactionLimitError,
  TransactionUnknownError,
} from '../errors.js';
import type { Job } from '../job.js';
import {
  AGENT_PROTOCOL_VERSION,
  boundedStatement,
  copyBoundOf,
  type ProxiedQuery,
  type ProxiedQueryResult,
  type RawQueryProxyLimits,
  type ResolvedLimits,
  type RunningJobs,
  referenceOf,
  resolveLimits,
  runProxiedQuery,
} from './query_proxy.js';
import { type TransactionControl, transactionVerdict } from './statement_allowlist.js';
import { syntaxErrorOf } from './syntax_error.js';

/** The bounds of the proxy's transactions. */
export interface RawProxyTransactionLimits {
  /** Longest a transaction may stay open, from its BEGIN. @default '30s' */
  maxDuration?: Duration;
  /** Longest a transaction may wait for its next statement. @default '10s' */
  idleTimeout?: Duration;
  /** Most statements one transaction may run (BEGIN, COMMIT, ROLLBACK not counted). @default 1000 */
  maxStatements?: number;
  /** Most transactions one job may hold open at once. @default 4 */
  maxPerJob?: number;
}

/**
 * A proxied statement that may belong to a transaction. `transaction` is the id its BEGIN was
 * answered with, or `null` from a caller that keeps transactions but has none open; a caller that
 * sends neither (an agent of the previous release) is served as before — `BEGIN` refused as a
 * statement kind — so a BEGIN it sends never opens a transaction it would not follow.
 */
export interface ProxiedTransactionQuery extends ProxiedQuery {
  readonly transaction?: string | null;
}

/**
 * The answer: rows, and, when the statement opened or ended a transaction, its id or `null` (in
 * `json` too). A statement that failed and ended its transaction (a COMMIT Postgres refused) is
 * marked: {@link endedItsTransaction}.
 */
export interface ProxiedTransactionResult extends ProxiedQueryResult {
  readonly transaction?: string | null;
}

const ENDED = new WeakSet<object>();

/** Whether `err` was the answer of a statement that also ended its transaction (none is open). */
export function endedItsTransaction(err: unknown): boolean {
  return err !== null && typeof err === 'object' && ENDED.has(err);
}

interface Open {
  readonly state: 'open';
  readonly job: Job;
  readonly ref: DatatableRef;
  readonly lease: DatatableLease;
  statements: number;
  /** Requests of this transaction run one after another. */
  turn: Promise<void>;
  busy: number;
  idle: NodeJS.Timeout | undefined;
  readonly deadline: NodeJS.Timeout;
}

interface Ended {
  readonly state: 'ended';
  readonly job: Job;
  readonly ref: DatatableRef;
  /** Why the proxy rolled it back (said to the runnable; no literal of the job's). */
  readonly reason: string;
}

type Entry = Open | Ended;

interface ResolvedTransactionLimits {
  readonly maxDurationMs: number;
  readonly idleMs: number;
  readonly maxStatements: number;
  readonly maxPerJob: number;
}

const TRANSACTION_PREFIX = 'vcx_';
/** Ended transactions remembered (to answer E_TRANSACTION_ENDED, not UNKNOWN), at most. */
const MAX_ENDED = 10_000;

const EMPTY: ProxiedTransactionResult = Object.freeze({
  rows: [],
  rowCount: null,
  json: '{"rows":[],"rowCount":null}',
});

/**
 * The query proxy with transactions: {@link ProxyTransactions.run} answers every proxied
 * statement — one on its own exactly as {@link runProxiedQuery}, a `BEGIN` by opening a
 * transaction, a statement naming one inside it. Each statement inside still passes the same
 * allowlist (no role change, no `set_config`, one statement), and the same per-statement
 * bounds. The transaction id (`vcx_` + 256 random bits, kept only as its SHA-256) answers only
 * to the job it was opened for: another job's token, or the same token once the job ended, gets
 * `E_TRANSACTION_UNKNOWN` or `E_JOB_TOKEN_INVALID`, and nothing runs.
 *
 * Bounds: open at most `maxDuration` from BEGIN and `idleTimeout` between statements, at most
 * `maxStatements` statements, `maxPerJob` open per job. The lease also carries
 * `idle_in_transaction_session_timeout` (idle bound + 1 s), so Postgres ends it should this
 * process stall. Call {@link ProxyTransactions.endJob} when a job ends (its transactions are
 * rolled back) and {@link ProxyTransactions.close} when the server stops.
 */
export class ProxyTransactions {
  readonly #connector: DatatableConnector;
  readonly #limits: ResolvedLimits;
  readonly #bounds: ResolvedTransactionLimits;
  readonly #rawLimits: RawQueryProxyLimits | undefined;
  /** By the SHA-256 of the id. */
  readonly #entries = new Map<string, Entry>();
  readonly #byJob = new Map<Job, Set<string>>();
  #closed = false;

  constructor(options: {
    readonly connector: DatatableConnector;
    readonly limits?: RawQueryProxyLimits;
    readonly transactions?: RawProxyTransactionLimits;
  }) {
    this.#connector = options.connector;
    this.#rawLimits = options.limits;
    this.#limits = resolveLimits(options.limits);
    this.#bounds = resolveTransactionLimits(options.transactions);
  }

  /** Transactions open now (each holds one lease). */
  get open(): number {
    let n = 0;
    for (const entry of this.#entries.values()) if (entry.state === 'open') n++;
    return n;
  }

  /**
   * Runs one proxied statement for the job `jobs` resolves the token to (see the class comment).
   *
   * @throws what {@link runProxiedQuery} throws, and {@link TransactionUnknownError},
   *   {@link TransactionEndedError}, {@link TransactionLimitError}.
   */
  async run(query: ProxiedTransactionQuery, jobs: RunningJobs): Promise<ProxiedTransactionResult> {
    if (query === null || typeof query !== 'object' || query.protocol !== AGENT_PROTOCOL_VERSION) {
      throw new AgentProtocolError();
    }
    const { transaction } = query;
    // A caller that does not keep transactions: today's one-statement proxy, BEGIN refused.
    if (transaction === undefined) return this.#single(query, jobs);
    if (transaction !== null && typeof transaction !== 'string') {
      throw new StatementRefusedError('transaction must be an id or null');
    }
    // As for one statement: the request is checked before the token is looked up.
    const ref = referenceOf(query.reference);
    if (typeof query.sql !== 'string') throw new StatementRefusedError('sql must be a string');
    const verdict = await transactionVerdict(query.sql);
    if (verdict !== null && 'syntaxError' in verdict) throw syntaxErrorOf(verdict);
    if (verdict !== null && 'refusal' in verdict) {
      throw new StatementRefusedError(
        `${StatementRefusedError.defaultMessage} (${verdict.refusal}: ${verdict.node})`,
      );
    }
    const control = verdict === null ? null : verdict.control;
    if (transaction === null) {
      if (control === null) return this.#single(query, jobs);
      const job = await jobOf(query.jobToken, jobs);
      if (control === 'begin') return this.#begin(job, ref, query.sql);
      // COMMIT or ROLLBACK with none open: Postgres warns and does nothing; so does the proxy.
      if (control !== 'savepoint') return EMPTY;
      throw transactionBlockOnly();
    }
    const job = await jobOf(query.jobToken, jobs);
    const key = keyOf(transaction);
    const entry = this.#entries.get(key);
    if (entry === undefined || entry.job !== job || !sameRef(entry.ref, ref)) {
      throw new TransactionUnknownError();
    }
    if (entry.state === 'ended') {
      // As Postgres answers statements of an aborted transaction, until the runnable's ROLLBACK.
      if (control !== 'rollback') throw new TransactionEndedError(entry.reason);
      this.#forget(key, job);
      return {
        ...EMPTY,
        transaction: null,
        json: '{"rows":[],"rowCount":null,"transaction":null}',
      };
    }
    return this.#inTurn(entry, () => this.#statement(key, entry, query, control));
  }

  /** The job ended: its open transactions are rolled back, and its ids forgotten. */
  async endJob(job: Job): Promise<void> {
    const keys = this.#byJob.get(job);
    if (keys === undefined) return;
    this.#byJob.delete(job);
    const ending: Promise<void>[] = [];
    for (const key of keys) {
      const entry = this.#entries.get(key);
      this.#entries.delete(key);
      if (entry?.state === 'open') ending.push(this.#rollBack(entry, entry.busy > 0));
    }
    await Promise.all(ending);
  }

  /** The server stops: every open transaction is rolled back and its lease released. */
  async close(): Promise<void> {
    this.#closed = true;
    const jobs = [...this.#byJob.keys()];
    await Promise.all(jobs.map((job) => this.endJob(job)));
  }

  #single(query: ProxiedQuery, jobs: RunningJobs): Promise<ProxiedQueryResult> {
    return runProxiedQuery(query, {
      jobs,
      connector: this.#connector,
      ...(this.#rawLimits === undefined ? {} : { limits: this.#rawLimits }),
    });
  }

  async #begin(job: Job, ref: DatatableRef, sql: string): Promise<ProxiedTransactionResult> {
    if (this.#closed) throw new TransactionEndedError('the server is stopping');
    const mine = this.#byJob.get(job);
    let open = 0;
    for (const key of mine ?? []) if (this.#entries.get(key)?.state === 'open') open++;
    if (open >= this.#bounds.maxPerJob) {
      throw new TransactionLimitError(
        `this job holds ${open} open transactions, the most the query proxy allows (maxPerJob)`,
      );
    }
    const lease = await this.#connector.connect(job, ref);
    try {
      // The runnable's own BEGIN (its isolation level and access mode), then the bounds, local
      // to the transaction: whatever ends it takes them back.
      await lease.query(sql);
      if (this.#connector.proxied !== true) {
        await lease.query(
          "select pg_catalog.set_config('statement_timeout', $1, true), pg_catalog.set_config('standard_conforming_strings', 'on', true), pg_catalog.set_config('idle_in_transaction_session_timeout', $2, true)",
          [String(this.#limits.timeoutMs), String(this.#bounds.idleMs + 1000)],
        );
      }
    } catch (err) {
      await lease.query('rollback').catch(() => {});
      await lease.release(false);
      throw err;
    }
    const id = TRANSACTION_PREFIX + randomBytes(32).toString('base64url');
    const key = keyOf(id);
    const entry: Open = {
      state: 'open',
      job,
      ref,
      lease,
      statements: 0,
      turn: Promise.resolve(),
      busy: 0,
      idle: undefined,
      deadline: setTimeout(() => {
        void this.#expire(
          key,
          entry,
          `it was open longer than ${this.#bounds.maxDurationMs} ms, the query proxy's bound`,
        );
      }, this.#bounds.maxDurationMs),
    };
    entry.deadline.unref();
    this.#entries.set(key, entry);
    let keys = this.#byJob.get(job);
    if (keys === undefined) {
      keys = new Set();
      this.#byJob.set(job, keys);
    }
    keys.add(key);
    this.#armIdle(key, entry);
    if (this.#closed) {
      await this.endJob(job);
      throw new TransactionEndedError('the server is stopping');
    }
    return {
      ...EMPTY,
      transaction: id,
      json: `{"rows":[],"rowCount":null,"transaction":${JSON.stringify(id)}}`,
    };
  }

  async #statement(
    key: string,
    entry: Open,
    query: ProxiedQuery,
    control: TransactionControl | null,
  ): Promise<ProxiedTransactionResult> {
    // Ended while this one waited its turn.
    const now = this.#entries.get(key);
    if (now !== entry) {
      if (now?.state === 'ended') throw new TransactionEndedError(now.reason);
      throw new TransactionUnknownError();
    }
    // BEGIN inside: Postgres warns and changes nothing.
    if (control === 'begin') return EMPTY;
    if (control === 'commit' || control === 'rollback') {
      this.#forget(key, entry.job);
      clearTimeout(entry.idle);
      clearTimeout(entry.deadline);
      let done: { rows: Record<string, unknown>[]; rowCount: number | null };
      try {
        done = await entry.lease.query(query.sql);
      } catch (err) {
        // A COMMIT Postgres refused (a deferred constraint, a serialization failure) ended the
        // transaction too: rolled back. The caller hears both.
        await this.#rollBack(entry, false);
        if (err !== null && typeof err === 'object') ENDED.add(err);
        throw err;
      }
      // Ended: the lease is reset and pooled (closed, should a transaction still be open).
      await entry.lease.release(false).catch(() => {});
      return {
        rows: done.rows,
        rowCount: done.rowCount,
        transaction: null,
        json: JSON.stringify({ rows: done.rows, rowCount: done.rowCount, transaction: null }),
      };
    }
    if (entry.statements >= this.#bounds.maxStatements) {
      await this.#expire(
        key,
        entry,
        `it ran ${this.#bounds.maxStatements} statements, the most the query proxy allows in one transaction`,
      );
      throw new TransactionLimitError(
        `the transaction ran ${this.#bounds.maxStatements} statements, the most the query proxy allows in one (maxStatements): it was rolled back`,
      );
    }
    entry.statements++;
    const params = query.params ?? [];
    if (!Array.isArray(params)) throw new StatementRefusedError('params must be an array');
    const copy = copyBoundOf(query.copy, this.#limits);
    const ran = { destroy: false };
    clearTimeout(entry.idle);
    entry.busy++;
    try {
      return await boundedStatement(entry.lease, query.sql, params, copy, this.#limits, ran);
    } finally {
      entry.busy--;
      if (ran.destroy) {
        await this.#expire(
          key,
          entry,
          'a statement of it ran past the query proxy time bound',
          true,
        );
      } else if (this.#entries.get(key) === entry) {
        this.#armIdle(key, entry);
      }
    }
  }

  #inTurn<T>(entry: Open, fn: () => Promise<T>): Promise<T> {
    const next = entry.turn.then(fn);
    entry.turn = next.then(noop, noop);
    return next;
  }

  #armIdle(key: string, entry: Open): void {
    clearTimeout(entry.idle);
    entry.idle = setTimeout(() => {
      void this.#expire(
        key,
        entry,
        `it waited longer than ${this.#bounds.idleMs} ms for its next statement, the query proxy's bound`,
      );
    }, this.#bounds.idleMs);
    entry.idle.unref();
  }

  /** A bound passed: rolled back now, remembered as ended until the runnable's ROLLBACK. */
  async #expire(key: string, entry: Open, reason: string, destroy = false): Promise<void> {
    if (this.#entries.get(key) !== entry) return;
    const ended: Ended = { state: 'ended', job: entry.job, ref: entry.ref, reason };
    this.#entries.set(key, ended);
    this.#trimEnded();
    // A statement still running is not waited for: the connection is closed (Postgres rolls
    // back), never pooled mid-transaction.
    await this.#rollBack(entry, destroy || entry.busy > 0);
  }

  /** Rolls `entry` back (unless it already ended) and gives its lease back reset, or closed. */
  async #rollBack(entry: Open, destroy: boolean): Promise<void> {
    clearTimeout(entry.idle);
    clearTimeout(entry.deadline);
    let broken = destroy;
    if (!broken) {
      await entry.lease.query('rollback').catch(() => {
        broken = true;
      });
    }
    await entry.lease.release(broken).catch(() => {});
  }

  #forget(key: string, job: Job): void {
    this.#entries.delete(key);
    const keys = this.#byJob.get(job);
    keys?.delete(key);
    if (keys?.size === 0) this.#byJob.delete(job);
  }

  #trimEnded(): void {
    if (this.#entries.size <= MAX_ENDED) return;
    for (const [key, entry] of this.#entries) {
      if (this.#entries.size <= MAX_ENDED) return;
      if (entry.state === 'ended') this.#forget(key, entry.job);
    }
  }
}

async function jobOf(token: unknown, jobs: RunningJobs): Promise<Job> {
  const job = typeof token === 'string' && token.length > 0 ? await jobs.jobOfToken(token) : null;
  if (job === null) throw new JobTokenInvalidError();
  return job;
}

function keyOf(id: string): string {
  return createHash('sha256').update(id).digest('base64');
}

function sameRef(a: DatatableRef, b: DatatableRef): boolean {
  return a.name === b.name && JSON.stringify(a.access) === JSON.stringify(b.access);
}

/** SAVEPOINT, RELEASE or ROLLBACK TO outside a transaction: Postgres's own 25P01. */
function transactionBlockOnly(): pg.DatabaseError {
  const err = new pg.DatabaseError('SAVEPOINT can only be used in transaction blocks', 0, 'error');
  err.severity = 'ERROR';
  err.code = '25P01';
  return err;
}

function resolveTransactionLimits(
  raw: RawProxyTransactionLimits | undefined,
): ResolvedTransactionLimits {
  const maxDurationMs = resolveDuration(raw?.maxDuration ?? '30s', 'transactions.maxDuration');
  const idleMs = resolveDuration(raw?.idleTimeout ?? '10s', 'transactions.idleTimeout');
  if (maxDurationMs < 1) throw new TypeError('transactions.maxDuration must be at least 1 ms');
  if (idleMs < 1) throw new TypeError('transactions.idleTimeout must be at least 1 ms');
  const maxStatements = raw?.maxStatements ?? 1000;
  const maxPerJob = raw?.maxPerJob ?? 4;
  if (!Number.isSafeInteger(maxStatements) || maxStatements < 1) {
    throw new TypeError('transactions.maxStatements must be a positive integer');
  }
  if (!Number.isSafeInteger(maxPerJob) || maxPerJob < 1) {
    throw new TypeError('transactions.maxPerJob must be a positive integer');
  }
  return { maxDurationMs, idleMs, maxStatements, maxPerJob };
}

function noop(): void {}
