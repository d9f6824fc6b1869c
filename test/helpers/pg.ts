import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, inject, onTestFinished } from 'vitest';

/** The superuser URL of the cluster under test, pointed at `database`. */
export function adminUrlFor(database: string): string {
  const url = new URL(inject('pgAdminUrl'));
  url.pathname = `/${database}`;
  return url.toString();
}

/** A short random prefix for role names: roles are cluster-wide, test files run in parallel. */
export function uniquePrefix(): string {
  return `t${randomBytes(4).toString('hex')}_`;
}

/** Runs statements as the superuser on `database`. */
export async function asAdmin<T>(
  database: string,
  fn: (client: pg.Client) => Promise<T>,
): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrlFor(database) });
  // Terminated by another file's fault test: the statement running fails on its own.
  client.on('error', () => {});
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * A new, empty database (not the migrated template) for this file's migration tests, with
 * `count` one-connection superuser pools on it: created before the file's tests, its pools
 * ended and the database dropped after them. The returned array is filled once they start.
 */
export function emptyDatabaseForThisFile(name: string, count: number): readonly pg.Pool[] {
  const pools: pg.Pool[] = [];
  beforeAll(async () => {
    await asAdmin('postgres', (c) => c.query(`create database ${name}`));
    for (let i = 0; i < count; i++) {
      const pool = new pg.Pool({ connectionString: adminUrlFor(name), max: 1 });
      // An idle connection terminated by someone else (another suite's fault test) is not a crash.
      pool.on('error', () => {});
      pools.push(pool);
    }
  });
  afterAll(async () => {
    await Promise.allSettled(pools.map((pool) => pool.end()));
    await asAdmin('postgres', (c) => c.query(`drop database if exists ${name} with (force)`));
  });
  return pools;
}

export interface TestDatabase {
  /** Database name; the catalog schema is already migrated in it. */
  readonly name: string;
  /** Superuser URL of it. */
  readonly url: string;
  /** Drops every role starting with `prefix` (and set logins holding them), then the database. */
  drop(): Promise<void>;
}

/**
 * A fresh database cloned from the migrated template. Roles created with `prefix` are dropped
 * with it, together with any `wm_set_` login that holds one of them.
 */
export async function createTestDatabase(
  prefix: string,
  /** Without the migrated catalog: an empty database, as a first deployment finds it. */
  options: { empty?: boolean } = {},
): Promise<TestDatabase> {
  const name = `${prefix}db`;
  if (options.empty === true) {
    await asAdmin('postgres', (c) => c.query(`create database ${name}`));
  } else {
    await asAdmin('postgres', (c) =>
      c.query(`create database ${name} template ${inject('pgTemplate')}`),
    );
    // A clone shares the template's catalog id; each test database is its own catalog.
    await asAdmin(name, (c) =>
      c.query('update viewer_cache.generation set catalog_id = gen_random_uuid()::text'),
    );
  }
  return {
    name,
    url: adminUrlFor(name),
    async drop() {
      await asAdmin(name, async (c) => {
        const { rows } = await c.query<{ rolname: string }>(
          `select distinct l.rolname from pg_auth_members m
             join pg_roles r on r.oid = m.roleid join pg_roles l on l.oid = m.member
            where r.rolname like $1 and l.rolname like 'wm\\_set\\_%'
           union
           select rolname from pg_roles where rolname like $1`,
          [`${prefix}%`],
        );
        for (const { rolname } of rows) {
          await c.query(
            `select pg_terminate_backend(pid) from pg_stat_activity where usename = $1`,
            [rolname],
          );
          await c.query(`drop owned by ${pg.escapeIdentifier(rolname)}`);
        }
        for (const { rolname } of rows)
          await c.query(`drop role if exists ${pg.escapeIdentifier(rolname)}`);
      });
      await asAdmin('postgres', (c) => c.query(`drop database if exists ${name} with (force)`));
    },
  };
}

/** A test database dropped when the current test finishes. */
export async function testDatabaseForThisTest(prefix: string): Promise<TestDatabase> {
  const db = await createTestDatabase(prefix);
  onTestFinished(() => db.drop());
  return db;
}
