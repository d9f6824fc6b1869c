import type pg from 'pg';
import { canonicalEmbedViewer } from '../embed_viewer.js';
import { InvalidJobError } from '../errors.js';
import { canonicalRoleScope, type JobPerms } from '../job.js';
import { runMigrations } from '../pg/migration_runner.js';

/**
 * The queue's schema in the server's database. Its tables held the job records and job tokens
 * of earlier versions; records now travel sealed in the queue message (sealed_job.ts) and tokens
 * live in Redis (shared_job_tokens.ts), so nothing writes them. Kept (migrations only append)
 * so that servers of both versions can share a database during a rolling upgrade.
 */
export const QUEUE_SCHEMA = 'viewer_cache_queue';
const QUEUE_MIGRATION_LOCK = 0x7663717565756531n;

/** The job records and job tokens of earlier versions (see QUEUE_SCHEMA): no longer written. */
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
