import type pg from 'pg';
import { type Migration, runMigrations } from '../../pg/migration_runner.js';
import { CREATE_RULES_TRIGGERS, createRulesChanged } from './sql/rules.js';

/** Schema of the catalog tables, in the catalog database. */
export const CATALOG_SCHEMA = 'viewer_cache';
/** NOTIFY channel on which every catalog change announces its new generation. */
export const CATALOG_CHANNEL = 'viewer_cache_catalog';
/** NOTIFY channel on which a learned dependency set that grew announces itself (its digest). */
export const LEARNED_CHANNEL = 'viewer_cache_learned';
/** Advisory lock key that serialises migrations across processes ('vcmigrat' in ASCII). */
const MIGRATION_LOCK = 0x76636d6967726174n;

/**
 * Versioned, append-only. Never edit a released migration: add the next one.
 */
const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'catalog',
    statements: [
      `create table viewer_cache.datatable (
        workspace text not null,
        name text not null,
        database text not null,
        default_role oid,
        primary key (workspace, name)
      )`,
      // oid is the catalog id: the Postgres role's OID, stable across renames. `secret` is the
      // nonce the role's login password is derived from (see passwords.ts), never the password.
      `create table viewer_cache.role (
        oid oid primary key,
        workspace text not null,
        datatable text not null,
        name text not null,
        enabled boolean not null default true,
        tenants text[] not null default '{}',
        secret bytea not null,
        created_at timestamptz not null default now(),
        foreign key (workspace, datatable) references viewer_cache.datatable (workspace, name)
      )`,
      `create table viewer_cache.membership (
        workspace text not null,
        email text not null,
        kind text not null check (kind in ('group', 'folder', 'admin')),
        name text not null,
        primary key (workspace, email, kind, name)
      )`,
      // A row names a set login that can authenticate with the password derived from `secret`.
      `create table viewer_cache.role_set (
        login name primary key,
        role_oids oid[] not null unique,
        secret bytea not null,
        created_at timestamptz not null default now()
      )`,
      `create table viewer_cache.generation (
        id boolean primary key default true check (id),
        value bigint not null
      )`,
      `insert into viewer_cache.generation (id, value) values (true, 1)`,
    ],
  },
  {
    version: 2,
    name: 'api tokens',
    // Once created the reference server's token table; the server now owns that table in its
    // own schema (src/server/process/server_migrations.ts). Kept as an empty step so the version numbers
    // of catalogs already migrated stay valid; catalogs that ran it keep the old table, which
    // the server's migration copies from.
    statements: [],
  },
  {
    version: 3,
    name: 'catalog identity',
    statements: [
      // A random id per catalog, hashed into every authorization fingerprint: two deployments
      // sharing a Redis with equal workspace names, OIDs and generations never share a key.
      `alter table viewer_cache.generation
         add column catalog_id text not null default gen_random_uuid()::text`,
    ],
  },
  {
    version: 4,
    name: 'role versions',
    statements: [
      // Bumped whenever a role is disabled or enabled, and part of every grant in the
      // fingerprint: entries computed before a disable never come back with a re-enable.
      'alter table viewer_cache.role add column version bigint not null default 0',
    ],
  },
  {
    version: 5,
    name: 'governing tables',
    statements: [
      // Tables whose rows govern who sees what (an entitlements table): a change to their rows
      // reaches every process's fingerprint through the catalog generation (see governing.ts).
      `create table viewer_cache.governing_table (
        workspace text not null,
        datatable text not null,
        relation oid not null,
        viewer_column text,
        primary key (workspace, datatable, relation)
      )`,
      // The last change per table ('' = any row) and per viewer named in a changed row.
      `create table viewer_cache.governing_version (
        relation oid not null,
        viewer text not null,
        version text not null,
        primary key (relation, viewer)
      )`,
      `create function viewer_cache.governing_changed() returns trigger
         language plpgsql security definer
         set search_path = pg_catalog, pg_temp
       as $vc$
       declare
         col text := TG_ARGV[0];
         rows_from text := TG_ARGV[1];
         affected text[];
         stamp text := pg_current_xact_id()::text;
         generation bigint;
       begin
         if TG_OP = 'TRUNCATE' or col = '' then
           affected := array[''];
         elsif rows_from = 'new' then
           execute format('select array_agg(distinct %I::text) from new_rows', col) into affected;
         elsif rows_from = 'old' then
           execute format('select array_agg(distinct %I::text) from old_rows', col) into affected;
         else
           execute format(
             'select array_agg(distinct v) from (select %I::text as v from new_rows
                                                 union all select %I::text from old_rows) x',
             col, col) into affected;
         end if;
         if affected is null then
           return null; -- a statement that touched no row changes nothing
         end if;
         insert into viewer_cache.governing_version (relation, viewer, version)
         select TG_RELID, coalesce(v, ''), stamp from unnest(affected) v
         on conflict (relation, viewer) do update set version = excluded.version;
         update viewer_cache.generation set value = value + 1 returning value into generation;
         perform pg_notify('${CATALOG_CHANNEL}', generation::text);
         return null;
       end
       $vc$`,
      'revoke all on function viewer_cache.governing_changed() from public',
    ],
  },
  {
    version: 6,
    name: 'learned dependency sets',
    statements: [
      // What runs of one runnable version were seen to ask (access/learned_sets.ts), shared by
      // every process so each computes the same fingerprint from its first request. `mac` is an
      // HMAC under the deployment's secret over the canonical row: a row that does not verify
      // (forged, truncated, another deployment's) counts as not learned.
      `create table viewer_cache.learned_set (
        workspace text not null,
        path text not null,
        hash text not null,
        everything boolean not null,
        members text[] not null,
        mac bytea not null,
        updated_at timestamptz not null default now(),
        primary key (workspace, path, hash)
      )`,
      'revoke all on viewer_cache.learned_set from public',
    ],
  },
  {
    version: 7,
    name: 'rules versions',
    statements: [
      // What a role may read lives in Postgres too (policies, grants, views, functions): its
      // version per data table is part of every grant, hence of the fingerprint (rules_watch.ts).
      // `version` is a transaction id, never reused; `digest` is the last digest of the rules
      // read where no event trigger reports changes (null under the trigger).
      `create table viewer_cache.rules_version (
        workspace text not null,
        datatable text not null,
        version text not null,
        digest text,
        primary key (workspace, datatable),
        foreign key (workspace, datatable) references viewer_cache.datatable (workspace, name)
          on delete cascade
      )`,
      createRulesChanged(CATALOG_CHANNEL),
      'revoke all on function viewer_cache.rules_changed() from public',
      CREATE_RULES_TRIGGERS,
    ],
  },
  {
    version: 8,
    name: 'secret key check',
    statements: [
      // One row: a check value of the deployment's secret key (a keyed hash of a fixed label,
      // never the key), recorded by the first process that opens the catalog. A process started
      // with another key is refused (secret_check.ts) instead of taking the logins back.
      `create table viewer_cache.secret_check (
        only_row boolean primary key default true check (only_row),
        check_value bytea not null,
        created_at timestamptz not null default now()
      )`,
      'revoke all on viewer_cache.secret_check from public',
    ],
  },
  {
    version: 9,
    name: 'learned sets: last use',
    statements: [
      // When a process last read or grew each learned set (touched at most hourly), so sets of
      // versions no longer served can be collected (LearnedSets.collect). A missing set is
      // always safe: it is the full fingerprint until runs learn it again.
      'alter table viewer_cache.learned_set add column used_at timestamptz not null default now()',
      'create index learned_set_used_at on viewer_cache.learned_set (used_at)',
    ],
  },
];

/** Every version this build knows, ascending (numbers reserved by other changes may be missing). */
export const CATALOG_VERSIONS: readonly number[] = MIGRATIONS.map((m) => m.version);

/** The newest migration version this build knows. */
export const LATEST_CATALOG_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

/**
 * Brings the catalog schema up to date. Safe to call from many processes at once: an advisory
 * transaction lock serialises them, and each migration is applied at most once, in the same
 * transaction that records it. Refuses to run against a catalog newer than this build.
 *
 * @returns the versions applied by this call (empty when already current).
 */
export function migrateCatalog(pool: pg.Pool): Promise<number[]> {
  return runMigrations(pool, {
    schema: CATALOG_SCHEMA,
    lock: MIGRATION_LOCK,
    migrations: MIGRATIONS,
    subject: 'the catalog',
  });
}
