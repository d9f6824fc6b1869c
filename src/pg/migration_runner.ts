import type pg from 'pg';
import { withPooledClient } from './pg_clients.js';
import { withTransaction } from './transaction.js';

/** One step of a schema: applied at most once, in the transaction that records it. */
export interface Migration {
  /** A positive integer; versions ascend through the list. */
  readonly version: number;
  readonly name: string;
  readonly statements: readonly string[];
}

/** What {@link runMigrations} brings up to date. */
export interface MigrationPlan {
  /** The schema the migrations create and are recorded in (`<schema>.migration`). */
  readonly schema: string;
  /** Advisory lock key (64-bit) that serialises every run of this plan, across processes. */
  readonly lock: bigint;
  /** Versioned, append-only: never edit a released migration, add the next one. */
  readonly migrations: readonly Migration[];
  /** What the schema is, for the refusal of a newer one (`'the catalog'`). */
  readonly subject: string;
}

/** A schema name used as is in SQL: a lowercase identifier that needs no quoting. */
const SCHEMA_RE = /^[a-z_][a-z0-9_]{0,62}$/;

/**
 * Brings `plan.schema` up to date. Safe to call from many processes at once: an advisory
 * transaction lock serialises them, and all the pending migrations are applied and recorded in
 * one transaction (so a failing one leaves the schema as it was). Refuses a schema whose
 * recorded version is newer than the plan's last, changing nothing.
 *
 * The library's catalog (`migrateCatalog`) and the reference server's schema are both migrated
 * this way; a platform can use it for its own schema beside them.
 *
 * @returns the versions applied by this call (empty when already current).
 * @throws {TypeError} when the plan is malformed (schema, lock, versions).
 */
export function runMigrations(pool: pg.Pool, plan: MigrationPlan): Promise<number[]> {
  const latest = checkPlan(plan);
  return withPooledClient(pool, (client) => migrate(client, plan, latest));
}

async function migrate(
  client: pg.PoolClient,
  { schema, lock, migrations, subject }: MigrationPlan,
  latest: number,
): Promise<number[]> {
  const applied: number[] = [];
  return withTransaction(client, async () => {
    await client.query('select pg_advisory_xact_lock($1)', [lock.toString()]);
    await client.query(`create schema if not exists ${schema}`);
    await client.query(
      `create table if not exists ${schema}.migration (
        version int primary key,
        name text not null,
        applied_at timestamptz not null default now()
      )`,
    );
    const { rows } = await client.query<{ version: number }>(
      `select version from ${schema}.migration`,
    );
    const done = new Set(rows.map((row) => row.version));
    const newest = Math.max(0, ...done);
    if (newest > latest) {
      throw new Error(
        `${subject} is at version ${newest}, newer than this build (${latest}): upgrade viewer-cache`,
      );
    }
    for (const migration of migrations) {
      if (done.has(migration.version)) continue;
      for (const statement of migration.statements) await client.query(statement);
      await client.query(`insert into ${schema}.migration (version, name) values ($1, $2)`, [
        migration.version,
        migration.name,
      ]);
      applied.push(migration.version);
    }
    return applied;
  });
}

/** The plan's last version, once the plan is known to be well formed. */
function checkPlan(plan: MigrationPlan): number {
  if (plan === null || typeof plan !== 'object')
    throw new TypeError('a migration plan is required');
  const { schema, lock, migrations, subject } = plan;
  if (typeof schema !== 'string' || !SCHEMA_RE.test(schema)) {
    throw new TypeError('schema must be a lowercase identifier ([a-z_][a-z0-9_]*)');
  }
  if (typeof lock !== 'bigint') throw new TypeError('lock must be a bigint (an advisory lock key)');
  if (typeof subject !== 'string' || subject.length === 0) {
    throw new TypeError('subject must name the schema (for its error messages)');
  }
  if (!Array.isArray(migrations)) throw new TypeError('migrations must be an array');
  let previous = 0;
  for (const migration of migrations) {
    const { version, name, statements } = migration ?? {};
    if (!Number.isInteger(version) || version <= previous) {
      throw new TypeError('migration versions must be positive integers, in ascending order');
    }
    if (typeof name !== 'string' || !Array.isArray(statements)) {
      throw new TypeError(`migration ${version} needs a name and an array of statements`);
    }
    if (!statements.every((statement) => typeof statement === 'string')) {
      throw new TypeError(`migration ${version}: every statement must be a string`);
    }
    previous = version;
  }
  return previous;
}
