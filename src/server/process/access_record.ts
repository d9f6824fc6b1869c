/*
 * The access record, for teams that serve regulated rows and must answer "who was shown what,
 * when": one row per run of the HTTP API (workspace, app, runnable, origin kind, outcome, code,
 * time) with the viewer as a keyed hash — HMAC-SHA-256 under a key derived from the deployment
 * secret — so an administrator who knows an email can list that person's accesses (the CLI's
 * `access-record list --user`), and a reader of the table alone learns no email. Never rows,
 * args, keys or tokens.
 *
 * Off the request path: rows are buffered and written in batches (one multi-row insert per
 * second, or per 500 rows), so a hit gains no round trip. A buffer the database does not take is
 * kept and retried (up to 20 000 rows, then the oldest are dropped and counted), and a warning
 * says so once per outage.
 */
import { createHmac, hkdfSync } from 'node:crypto';
import stableStringify from 'fast-json-stable-stringify';
import type pg from 'pg';
import type { Job, Logger } from '../../index.js';
import { SERVER_SCHEMA } from './server_migrations.js';

/** How a run of the HTTP API ended, as the record says it. */
export type AccessOutcome = 'hit' | 'miss' | 'refused' | 'failed';

/** One run as the record keeps it (the viewer still in clear: hashed before it is buffered). */
export interface Access {
  readonly job: Job;
  readonly app: string | null;
  /** The run's origin kind (`app`, `embed`, `direct`, `job-token`, …). */
  readonly origin: string;
  readonly outcome: AccessOutcome;
  readonly code: string | null;
}

/** A row as `access-record list` shows it. */
export interface AccessRow {
  readonly at: string;
  readonly workspace: string;
  readonly app: string | null;
  readonly runnable: string;
  readonly origin: string;
  readonly outcome: AccessOutcome;
  readonly code: string | null;
}

const FLUSH_MS = 1000;
const FLUSH_ROWS = 500;
const MAX_BUFFERED = 20_000;

interface Buffered {
  readonly at: Date;
  readonly workspace: string;
  readonly app: string | null;
  readonly runnable: string;
  readonly origin: string;
  readonly outcome: AccessOutcome;
  readonly code: string | null;
  readonly viewer: Buffer | null;
}

/** The viewer's keyed hash: the same for the writer and for whoever lists, given the secret. */
export class ViewerHasher {
  readonly #key: Buffer;

  constructor(secretKey: string) {
    this.#key = Buffer.from(
      hkdfSync('sha256', secretKey, 'viewer-cache', 'access record viewer', 32),
    );
  }

  /** The hash of a run's viewer: its email, or the embed identity it was signed for; else null. */
  ofJob(job: Job): Buffer | null {
    const { endUserEmail, embed } = job.perms;
    if (endUserEmail !== null) return this.ofEmail(job.workspace, endUserEmail);
    if (embed !== undefined)
      return this.#hash(`${job.workspace}\u0000embed\u0000${stableStringify(embed)}`);
    return null;
  }

  ofEmail(workspace: string, email: string): Buffer {
    return this.#hash(`${workspace}\u0000user\u0000${email.toLowerCase()}`);
  }

  #hash(text: string): Buffer {
    return createHmac('sha256', this.#key).update(text).digest();
  }
}

export class AccessRecord {
  readonly #pool: pg.Pool;
  readonly #hasher: ViewerHasher;
  readonly #logger: Logger;
  readonly #retentionDays: number;
  #buffer: Buffered[] = [];
  #timer: NodeJS.Timeout | null = null;
  #sweeper: NodeJS.Timeout | null = null;
  #flushing: Promise<void> | null = null;
  #failing = false;
  #closed = false;
  /** Rows dropped because the database did not take them for too long. */
  dropped = 0;

  constructor(
    pool: pg.Pool,
    secretKey: string,
    options: { logger: Logger; retentionDays: number },
  ) {
    this.#pool = pool;
    this.#hasher = new ViewerHasher(secretKey);
    this.#logger = options.logger;
    this.#retentionDays = options.retentionDays;
  }

  /** Sweeps rows older than the retention now and every hour. */
  start(): void {
    const sweep = () => {
      this.#pool
        .query(
          `delete from ${SERVER_SCHEMA}.access_record where at < now() - make_interval(days => $1)`,
          [this.#retentionDays],
        )
        .catch((err: { code?: unknown }) =>
          this.#logger.warn({ code: err.code }, 'access record sweep failed'),
        );
    };
    sweep();
    this.#sweeper = setInterval(sweep, 3_600_000);
    this.#sweeper.unref();
  }

  /** Buffers one run; written within a second. */
  record(access: Access): void {
    if (this.#closed) return;
    if (this.#buffer.length >= MAX_BUFFERED) {
      this.#buffer.shift();
      this.dropped++;
    }
    this.#buffer.push({
      at: new Date(),
      workspace: access.job.workspace,
      app: access.app,
      runnable: access.job.runnable.path,
      origin: access.origin,
      outcome: access.outcome,
      code: access.code,
      viewer: this.#hasher.ofJob(access.job),
    });
    if (this.#buffer.length >= FLUSH_ROWS) void this.flush();
    else if (this.#timer === null) {
      this.#timer = setTimeout(() => void this.flush(), FLUSH_MS);
      this.#timer.unref();
    }
  }

  /** Writes what is buffered (one statement); resolves once written or kept for a retry. */
  flush(): Promise<void> {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    this.#flushing ??= this.#write().finally(() => {
      this.#flushing = null;
    });
    return this.#flushing;
  }

  async #write(): Promise<void> {
    const rows = this.#buffer;
    if (rows.length === 0) return;
    this.#buffer = [];
    try {
      await this.#pool.query(
        `insert into ${SERVER_SCHEMA}.access_record
           (at, workspace, app, runnable, origin, outcome, code, viewer_hash)
         select * from unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::text[], $7::text[], $8::bytea[])`,
        [
          rows.map((r) => r.at),
          rows.map((r) => r.workspace),
          rows.map((r) => r.app),
          rows.map((r) => r.runnable),
          rows.map((r) => r.origin),
          rows.map((r) => r.outcome),
          rows.map((r) => r.code),
          rows.map((r) => r.viewer),
        ],
      );
      if (this.#failing) {
        this.#failing = false;
        this.#logger.info({ rows: rows.length }, 'access record written again');
      }
    } catch (err) {
      // Kept, in order, in front of what came meanwhile; retried on the next flush.
      this.#buffer = [...rows, ...this.#buffer].slice(-MAX_BUFFERED);
      if (!this.#failing) {
        this.#failing = true;
        this.#logger.warn(
          { code: (err as { code?: unknown }).code, buffered: this.#buffer.length },
          'access record not written; kept in memory and retried',
        );
      }
      if (!this.#closed && this.#timer === null) {
        this.#timer = setTimeout(() => void this.flush(), FLUSH_MS);
        this.#timer.unref();
      }
    }
  }

  /** Writes what is left (once), then stops. */
  async close(): Promise<void> {
    if (this.#sweeper !== null) clearInterval(this.#sweeper);
    await this.flush();
    this.#closed = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
  }
}

/** The accesses of one viewer, newest first (the CLI's `access-record list --user`). */
export async function listAccesses(
  pool: pg.Pool,
  secretKey: string,
  workspace: string,
  email: string,
  limit = 100,
): Promise<AccessRow[]> {
  const hash = new ViewerHasher(secretKey).ofEmail(workspace, email);
  const { rows } = await pool.query<AccessRow>(
    `select to_char(at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as at, workspace, app,
            runnable, origin, outcome, code
       from ${SERVER_SCHEMA}.access_record
      where viewer_hash = $1 and workspace = $2
      order by at desc, id desc
      limit $3`,
    [hash, workspace, limit],
  );
  return rows;
}
