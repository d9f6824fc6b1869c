import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  LATEST_CATALOG_VERSION,
  migrateCatalog,
} from '../../../src/datatable/catalog/migrations.js';
import { adminUrlFor, asAdmin, uniquePrefix } from '../../helpers/pg.js';

// The catalog migrates itself, safely from many processes at once: on a fresh, empty database
// (not the migrated template) five pools race; each version is applied exactly once.

const name = `${uniquePrefix()}fresh`;
const pools: pg.Pool[] = [];

beforeAll(async () => {
  await asAdmin('postgres', (c) => c.query(`create database ${name}`));
  for (let i = 0; i < 5; i++) {
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

const versions = () =>
  asAdmin(name, async (c) =>
    (
      await c.query<{ version: number }>('select version from viewer_cache.migration order by 1')
    ).rows.map((row) => row.version),
  );

it('five processes migrate an empty database at once: all succeed, each version applied once', async () => {
  const applied = await Promise.all(pools.map((pool) => migrateCatalog(pool)));
  const all = Array.from({ length: LATEST_CATALOG_VERSION }, (_, i) => i + 1);
  // One of them did the work; the others found it done.
  expect(applied.filter((versions) => versions.length > 0)).toEqual([all]);
  expect(applied.flat().sort()).toEqual(all);
  expect(await versions()).toEqual(all);
  const tables = await asAdmin(name, async (c) =>
    (
      await c.query<{ t: string }>(
        `select table_name as t from information_schema.tables
          where table_schema = 'viewer_cache' order by 1`,
      )
    ).rows.map((row) => row.t),
  );
  expect(tables).toEqual(
    expect.arrayContaining([
      'datatable',
      'generation',
      'membership',
      'migration',
      'role',
      'role_set',
    ]),
  );
});

it('a second run applies nothing', async () => {
  expect(await Promise.all(pools.map((pool) => migrateCatalog(pool)))).toEqual(pools.map(() => []));
  expect(await versions()).toHaveLength(LATEST_CATALOG_VERSION);
});

it('refuses a catalog newer than this build, and changes nothing', async () => {
  await asAdmin(name, (c) =>
    c.query(`insert into viewer_cache.migration (version, name) values ($1, 'from the future')`, [
      LATEST_CATALOG_VERSION + 1,
    ]),
  );
  try {
    await expect(migrateCatalog(pools[0]!)).rejects.toThrow(/newer than this build/);
  } finally {
    await asAdmin(name, (c) =>
      c.query('delete from viewer_cache.migration where version = $1', [
        LATEST_CATALOG_VERSION + 1,
      ]),
    );
  }
  expect(await migrateCatalog(pools[0]!)).toEqual([]);
});
