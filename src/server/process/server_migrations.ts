import type pg from 'pg';
import { type Migration, runMigrations } from '../../index.js';

/**
 * The reference server's own schema. The library's catalog (`viewer_cache`) knows nothing of
 * bearer tokens: they are this server's concept, so their table and its migrations live here.
 */
export const SERVER_SCHEMA = 'viewer_cache_server';
/** Serialises server migrations across processes ('vcserver' in ASCII). */
const MIGRATION_LOCK = 0x7663736572766572n;

/** Versioned, append-only: never edit a released migration, add the next one. */
const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'api tokens',
    statements: [
      // Bearer tokens, stored as SHA-256 only.
      `create table ${SERVER_SCHEMA}.api_token (
        token_hash bytea primary key,
        workspace text not null,
        email text not null,
        label text,
        created_at timestamptz not null default now()
      )`,
      // Databases made before the server owned its schema kept tokens in the library's catalog
      // (`viewer_cache.api_token`, catalog migration 2): carry them over, so they keep working.
      `do $$ begin
         if to_regclass('viewer_cache.api_token') is not null then
           insert into ${SERVER_SCHEMA}.api_token (token_hash, workspace, email, label, created_at)
             select token_hash, workspace, email, label, created_at from viewer_cache.api_token
             on conflict (token_hash) do nothing;
         end if;
       end $$`,
      // Bumped by every revocation; each process polls it to drop its token cache (tokens.ts).
      `create table ${SERVER_SCHEMA}.token_generation (
        id boolean primary key default true check (id),
        value bigint not null
      )`,
      `insert into ${SERVER_SCHEMA}.token_generation (id, value) values (true, 1)`,
    ],
  },
  {
    version: 2,
    name: 'scoped api tokens',
    statements: [
      // The catalog ids (role OIDs) a token is scoped to; NULL = unscoped. Never empty: an
      // empty scope would grant nothing, and `token create` refuses it before it gets here.
      `alter table ${SERVER_SCHEMA}.api_token add column role_scope bigint[]
         check (role_scope is null or cardinality(role_scope) > 0)`,
    ],
  },
  {
    version: 3,
    name: 'outbox',
    statements: [
      // What a per-recipient job delivered to each recipient: their result, or the code of their
      // refusal. Read back only by the recipient (GET /api/w/:workspace/outbox).
      `create table ${SERVER_SCHEMA}.outbox (
        id bigint generated always as identity primary key,
        workspace text not null,
        recipient text not null,
        batch uuid not null,
        runnable text not null,
        created_at timestamptz not null default now(),
        result jsonb,
        error_code text,
        from_cache boolean not null default false,
        check ((result is null) <> (error_code is null))
      )`,
      `create index outbox_recipient on ${SERVER_SCHEMA}.outbox (workspace, recipient, id desc)`,
    ],
  },
  {
    version: 4,
    name: 'embed keys',
    statements: [
      // Public halves only: the signing key goes to the host once (`embed-key create`) and is
      // never stored. A revoked key stays (revoked_at set) so its links are refused by code.
      // Revocations bump token_generation, which every process already polls (embed_keys.ts).
      `create table ${SERVER_SCHEMA}.embed_key (
        workspace text not null,
        kid text not null check (kid ~ '^[A-Za-z0-9_-]{1,64}$'),
        alg text not null check (alg in ('EdDSA', 'ES256')),
        public_jwk jsonb not null check (not (public_jwk ? 'd')),
        label text,
        created_at timestamptz not null default now(),
        revoked_at timestamptz,
        primary key (workspace, kid)
      )`,
    ],
  },
  {
    version: 5,
    name: 'outbox retention',
    statements: [
      // Deliveries are kept for a retention (VIEWER_CACHE_OUTBOX_RETENTION_MS): the sweep
      // deletes by age, oldest first.
      `create index outbox_created on ${SERVER_SCHEMA}.outbox (created_at)`,
    ],
  },
  {
    version: 6,
    name: 'agent tokens',
    statements: [
      // Agent workers' bearer tokens, SHA-256 only, like api_token: a token lets an agent of
      // `worker_group` take that group's jobs of `workspace`, and nothing else (agent_tokens.ts).
      // Revocations bump token_generation, which every process already polls.
      `create table ${SERVER_SCHEMA}.agent_token (
        token_hash bytea primary key,
        workspace text not null,
        worker_group text not null check (worker_group ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
        label text,
        created_at timestamptz not null default now()
      )`,
    ],
  },
  {
    version: 7,
    name: 'access record',
    statements: [
      // Who was shown what, when (opt-in: VIEWER_CACHE_ACCESS_RECORD=on): one row per run of the
      // HTTP API, the viewer as a keyed hash only (an administrator who knows an email can list
      // that person's rows with the CLI; a reader of the table alone learns no email). Never
      // rows, args or tokens. Swept by age (VIEWER_CACHE_ACCESS_RECORD_RETENTION_DAYS).
      `create table ${SERVER_SCHEMA}.access_record (
        id bigint generated always as identity primary key,
        at timestamptz not null,
        workspace text not null,
        app text,
        runnable text not null,
        origin text not null,
        outcome text not null check (outcome in ('hit', 'miss', 'refused', 'failed')),
        code text,
        viewer_hash bytea
      )`,
      `create index access_record_viewer on ${SERVER_SCHEMA}.access_record (viewer_hash, at desc)`,
      `create index access_record_at on ${SERVER_SCHEMA}.access_record (at)`,
    ],
  },
];

export const LATEST_SERVER_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

/** Brings the server's schema up to date with the library's runner (see `runMigrations`). */
export function migrateServer(pool: pg.Pool): Promise<number[]> {
  return runMigrations(pool, {
    schema: SERVER_SCHEMA,
    lock: MIGRATION_LOCK,
    migrations: MIGRATIONS,
    subject: 'the server schema',
  });
}
