import type pg from 'pg';
import { canonicalEmbedViewer } from '../embed_viewer.js';
import { InvalidJobError } from '../errors.js';
import { canonicalRoleScope, type Job, type JobPerms, type RunOrigin } from '../job.js';
import { runMigrations } from '../pg/migration_runner.js';

/** Where the queue keeps its job records and job tokens (in the server's database). */
export const QUEUE_SCHEMA = 'viewer_cache_queue';
const QUEUE_MIGRATION_LOCK = 0x7663717565756531n;

/**
 * The job records: what the server recorded at run start (perms with the viewer, origin, args),
 * keyed by job id. A worker reads the viewer from here, never from the queue message.
 * `state`: queued → running (attempts counts the claims: a stalled job is claimed at most twice)
 * → done. Args and perms are kept as the JSON text the server wrote (jsonb would reorder keys and
 * renormalise numbers: the worker must see exactly what the key was built from).
 */
const MIGRATIONS = [
  {
    version: 1,
    name: 'job records and job tokens',
    statements: [
      `create table ${QUEUE_SCHEMA}.job (
        id text primary key,
        workspace text not null,
        path text not null,
        hash text not null,
        args text not null,
        perms text not null,
        origin text not null,
        cache_ttl_s double precision,
        state text not null default 'queued' check (state in ('queued', 'running', 'done')),
        attempts int not null default 0,
        created_at timestamptz not null default now(),
        deadline timestamptz not null
      )`,
      `create index job_deadline on ${QUEUE_SCHEMA}.job (deadline)`,
      // Shared job tokens (child jobs, flow steps): a hash of the token, the job's grant, and
      // how long it may live at most; deleted the moment the job ends.
      `create table ${QUEUE_SCHEMA}.job_token (
        token_hash bytea primary key,
        job_id text not null,
        workspace text not null,
        perms text not null,
        expires_at timestamptz not null
      )`,
      `create index job_token_expires on ${QUEUE_SCHEMA}.job_token (expires_at)`,
    ],
  },
] as const;

/**
 * Creates (or brings up to date) the queue's tables in the database `pool` reaches: run it once
 * per deployment before servers and workers start (both call it; it is safe to run concurrently).
 */
export function migrateQueue(pool: pg.Pool): Promise<number[]> {
  return runMigrations(pool, {
    schema: QUEUE_SCHEMA,
    lock: QUEUE_MIGRATION_LOCK,
    migrations: MIGRATIONS,
    subject: 'the job queue schema',
  });
}

/** Writes the record of `job` (server side, before enqueueing). */
export async function insertJobRecord(
  pool: pg.Pool,
  job: Job,
  origin: RunOrigin['kind'] | 'unknown',
  deadlineMs: number,
): Promise<void> {
  await pool.query(
    `insert into ${QUEUE_SCHEMA}.job
       (id, workspace, path, hash, args, perms, origin, cache_ttl_s, deadline)
     values ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9::double precision / 1000))`,
    [
      job.id,
      job.workspace,
      job.runnable.path,
      job.runnable.hash,
      JSON.stringify(job.args),
      JSON.stringify(job.perms),
      origin,
      job.cacheTtlS ?? null,
      deadlineMs,
    ],
  );
}

/**
 * Claims the record for a run (worker side): a queued job, or a running one whose first worker
 * was lost (one retry). `null` when there is none to claim: unknown, of another workspace,
 * finished, given up by the server, past its deadline, or already retried.
 */
export async function claimJobRecord(
  pool: pg.Pool,
  workspace: string,
  id: string,
): Promise<Job | null> {
  const { rows } = await pool.query<{
    id: string;
    workspace: string;
    path: string;
    hash: string;
    args: string;
    perms: string;
    cache_ttl_s: number | null;
  }>(
    `update ${QUEUE_SCHEMA}.job set state = 'running', attempts = attempts + 1
      where id = $1 and workspace = $2 and state in ('queued', 'running') and attempts < 2
        and deadline > now()
      returning id, workspace, path, hash, args, perms, cache_ttl_s`,
    [id, workspace],
  );
  const row = rows[0];
  if (row === undefined) return null;
  return Object.freeze({
    id: row.id,
    workspace: row.workspace,
    runnable: Object.freeze({ path: row.path, hash: row.hash }),
    args: JSON.parse(row.args) as Record<string, unknown>,
    perms: permsFromJson(row.perms),
    ...(row.cache_ttl_s === null ? {} : { cacheTtlS: row.cache_ttl_s }),
  });
}

/** Marks the record finished: a replay of its message is refused from now on. */
export async function finishJobRecord(pool: pg.Pool, id: string): Promise<void> {
  await pool.query(`update ${QUEUE_SCHEMA}.job set state = 'done' where id = $1`, [id]);
}

/** Deletes records (server side, once answered or given up) and any token they left. */
export async function deleteJobRecords(pool: pg.Pool, ids: readonly string[]): Promise<void> {
  await pool.query(`delete from ${QUEUE_SCHEMA}.job where id = any($1::text[])`, [ids]);
}

/** Deletes records and tokens past their deadline (a server that died while waiting). */
export async function sweepJobRecords(pool: pg.Pool): Promise<void> {
  await pool.query(`delete from ${QUEUE_SCHEMA}.job where deadline < now() - interval '1 hour'`);
  await pool.query(`delete from ${QUEUE_SCHEMA}.job_token where expires_at < now()`);
}

/**
 * Perms read back from JSON, through the same canonical forms the job was built with: a
 * malformed record fails closed (E_INVALID_JOB) rather than running with a guessed viewer.
 */
export function permsFromJson(text: string): JobPerms {
  const raw = JSON.parse(text) as Record<string, unknown>;
  const { email, endUserEmail } = raw;
  if (typeof email !== 'string' || email.length === 0)
    throw new InvalidJobError('job record without perms.email');
  if (endUserEmail !== null && (typeof endUserEmail !== 'string' || endUserEmail.length === 0))
    throw new InvalidJobError('job record with a malformed viewer');
  const roleScope = canonicalRoleScope(raw['roleScope'] ?? undefined);
  const embed = raw['embed'] === undefined ? undefined : canonicalEmbedViewer(raw['embed']);
  return Object.freeze({
    email,
    endUserEmail,
    ...(roleScope === undefined ? {} : { roleScope }),
    ...(embed === undefined ? {} : { embed }),
  });
}
