import { createHash } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { migrateCatalog } from '../../../src/datatable/catalog/migrations.js';
import { ApiTokens } from '../../../src/server/credentials/tokens.js';
import {
  LATEST_SERVER_VERSION,
  migrateServer,
} from '../../../src/server/process/server_migrations.js';
import { adminUrlFor, asAdmin, uniquePrefix } from '../../helpers/pg.js';

// The reference server owns its schema (`viewer_cache_server`); the library's catalog no longer
// creates the server's token table. A catalog migrated by an older build, whose migration 2
// created `viewer_cache.api_token`, keeps its tokens working.

const fresh = `${uniquePrefix()}fresh`;
const legacy = `${uniquePrefix()}legacy`;
const pools: pg.Pool[] = [];
const TOKEN = `vct_${'L'.repeat(43)}`;

const poolFor = (database: string) => {
  const pool = new pg.Pool({ connectionString: adminUrlFor(database), max: 1 });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
};

const regclass = (database: string, name: string) =>
  asAdmin(database, async (c) => (await c.query('select to_regclass($1) as t', [name])).rows[0].t);

beforeAll(async () => {
  await asAdmin('postgres', async (c) => {
    await c.query(`create database ${fresh}`);
    await c.query(`create database ${legacy}`);
  });
  // What an older build left: the catalog at version 3 with the token table of migration 2.
  await migrateCatalog(poolFor(legacy));
  await asAdmin(legacy, async (c) => {
    await c.query(`create table viewer_cache.api_token (
      token_hash bytea primary key, workspace text not null, email text not null, label text,
      created_at timestamptz not null default now())`);
    await c.query(
      `insert into viewer_cache.api_token (token_hash, workspace, email, label) values ($1, 'demo', 'alice@example.com', 'old')`,
      [createHash('sha256').update(TOKEN).digest()],
    );
  });
});

afterAll(async () => {
  await Promise.allSettled(pools.map((pool) => pool.end()));
  await asAdmin('postgres', async (c) => {
    await c.query(`drop database if exists ${fresh} with (force)`);
    await c.query(`drop database if exists ${legacy} with (force)`);
  });
});

it("the catalog's migrations no longer create the server's token table", async () => {
  await migrateCatalog(poolFor(fresh));
  expect(await regclass(fresh, 'viewer_cache.api_token')).toBeNull();
});

it("a fresh database gets every version of the server's schema, once", async () => {
  // The runner (concurrent processes, a newer schema refused) is tested in migration_runner.test.ts.
  const all = Array.from({ length: LATEST_SERVER_VERSION }, (_, i) => i + 1);
  expect(await migrateServer(poolFor(fresh))).toEqual(all);
  for (const table of ['api_token', 'token_generation', 'outbox', 'embed_key']) {
    expect(await regclass(fresh, `viewer_cache_server.${table}`)).toBe(
      `viewer_cache_server.${table}`,
    );
  }
  expect(await migrateServer(poolFor(fresh))).toEqual([]);
});

it("an older catalog's tokens keep working after the server's migration", async () => {
  const pool = poolFor(legacy);
  // Every server migration, from the first: the old tokens are carried over by the first one.
  expect(await migrateServer(pool)).toEqual(
    Array.from({ length: LATEST_SERVER_VERSION }, (_, i) => i + 1),
  );
  const tokens = new ApiTokens(pool);
  expect(await tokens.verify(TOKEN)).toEqual({ workspace: 'demo', email: 'alice@example.com' });
  expect(await tokens.list('demo')).toEqual([
    expect.objectContaining({ email: 'alice@example.com', label: 'old' }),
  ]);
  // And a revocation now is final: the row goes from the server's table.
  expect(await tokens.revoke('demo', { email: 'alice@example.com' })).toBe(1);
  expect(await new ApiTokens(pool).verify(TOKEN)).toBeNull();
});
