import { createHash, randomBytes } from 'node:crypto';
import type pg from 'pg';
import type { JobTokenIssuer } from '../executor/executor.js';
import type { Job, JobPerms } from '../job.js';
import { type Logger, silentLogger } from '../logger.js';
import { permsFromJson, QUEUE_SCHEMA } from './job_records.js';

/** What a live job token stands for: its job's workspace and perms. */
export interface SharedJobTokenGrant {
  readonly jobId: string;
  readonly workspace: string;
  readonly perms: JobPerms;
}

export interface RawSharedJobTokensOptions {
  /** The database holding the queue's schema (see migrateQueue). */
  pool: pg.Pool;
  /** Longest a token lives if its job never ends (a worker killed mid-job). @default 60 s + 30 s */
  maxLifeMs?: number;
  /** @default silent */
  logger?: Logger;
}

const PREFIX = 'vcjob_';

/**
 * Job tokens shared by every server and worker of a deployment (child jobs, flow steps): a
 * random token whose hash is stored in Postgres with its job's grant while the job runs, and
 * deleted when it ends, so any server accepts it while the job runs and none does once it has
 * ended. A worker killed mid-job leaves a token that still dies at `maxLifeMs`.
 */
export class SharedJobTokens implements JobTokenIssuer {
  readonly #pool: pg.Pool;
  readonly #maxLifeMs: number;
  readonly #logger: Logger;
  readonly #byJob = new Map<string, Buffer>();

  constructor(options: RawSharedJobTokensOptions) {
    if (typeof options?.pool?.query !== 'function') throw new TypeError('pool must be a pg.Pool');
    this.#pool = options.pool;
    this.#maxLifeMs = options.maxLifeMs ?? 90_000;
    if (!Number.isInteger(this.#maxLifeMs) || this.#maxLifeMs <= 0)
      throw new TypeError('maxLifeMs must be a positive integer of milliseconds');
    this.#logger = options.logger ?? silentLogger;
  }

  /** Stored before the job's code runs: the token works from its first use. */
  async issue(job: Job): Promise<string> {
    const token = PREFIX + randomBytes(32).toString('base64url');
    const hash = digest(token);
    await this.#pool.query(
      `insert into ${QUEUE_SCHEMA}.job_token (token_hash, job_id, workspace, perms, expires_at)
       values ($1, $2, $3, $4, now() + make_interval(secs => $5::double precision / 1000))`,
      [hash, job.id, job.workspace, JSON.stringify(job.perms), this.#maxLifeMs],
    );
    this.#byJob.set(job.id, hash);
    return token;
  }

  /** Deleted when the job ends, before its result is handed back. */
  async revoke(job: Job): Promise<void> {
    const hash = this.#byJob.get(job.id);
    if (hash === undefined) return;
    this.#byJob.delete(job.id);
    try {
      await this.#pool.query(`delete from ${QUEUE_SCHEMA}.job_token where token_hash = $1`, [hash]);
    } catch (err) {
      // The token still dies at its expiry; the job's own outcome is not changed by this.
      this.#logger.warn({ code: (err as { code?: unknown }).code }, 'job token not deleted');
    }
  }

  /** The grant of a live token, or null (unknown, ended, expired, malformed). */
  async verify(token: string): Promise<SharedJobTokenGrant | null> {
    if (typeof token !== 'string' || !token.startsWith(PREFIX) || token.length > 100) return null;
    const { rows } = await this.#pool.query<{ job_id: string; workspace: string; perms: string }>(
      `select job_id, workspace, perms from ${QUEUE_SCHEMA}.job_token
        where token_hash = $1 and expires_at > now()`,
      [digest(token)],
    );
    const row = rows[0];
    if (row === undefined) return null;
    return { jobId: row.job_id, workspace: row.workspace, perms: permsFromJson(row.perms) };
  }
}

function digest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}
