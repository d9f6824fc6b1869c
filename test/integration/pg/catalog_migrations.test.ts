import { expect, it } from 'vitest';
import {
  CATALOG_VERSIONS,
  LATEST_CATALOG_VERSION,
  migrateCatalog,
} from '../../../src/datatable/catalog/migrations.js';
import { asAdmin, emptyDatabaseForThisFile, uniquePrefix } from '../../helpers/pg.js';

// The catalog's own migrations, on a fresh, empty database (not the migrated template): every
// version applied, the catalog's tables there. The runner itself (concurrent processes, a newer
// schema refused, a failing step rolled back) is tested once, in migration_runner.test.ts.

const name = `${uniquePrefix()}fresh`;

const pools = emptyDatabaseForThisFile(name, 5);

const versions = () =>
  asAdmin(name, async (c) =>
    (
      await c.query<{ version: number }>('select version from viewer_cache.migration order by 1')
    ).rows.map((row) => row.version),
  );

it('migrates an empty database: every version once, the catalog tables in place', async () => {
  const applied = await Promise.all(pools.map((pool) => migrateCatalog(pool)));
  const all = [...CATALOG_VERSIONS];
  // Five pools at once, as five processes starting together: one did the work.
  expect(applied.filter((versions) => versions.length > 0)).toEqual([all]);
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
      'governing_table',
      'governing_version',
      'membership',
      'migration',
      'role',
      'role_set',
    ]),
  );
  expect(await Promise.all(pools.map((pool) => migrateCatalog(pool)))).toEqual(pools.map(() => []));
});

it('refuses a catalog newer than this build, naming the catalog', async () => {
  await asAdmin(name, (c) =>
    c.query(`insert into viewer_cache.migration (version, name) values ($1, 'from the future')`, [
      LATEST_CATALOG_VERSION + 1,
    ]),
  );
  try {
    await expect(migrateCatalog(pools[0]!)).rejects.toThrow(
      `the catalog is at version ${LATEST_CATALOG_VERSION + 1}, newer than this build (${LATEST_CATALOG_VERSION}): upgrade viewer-cache`,
    );
  } finally {
    await asAdmin(name, (c) =>
      c.query('delete from viewer_cache.migration where version = $1', [
        LATEST_CATALOG_VERSION + 1,
      ]),
    );
  }
});
