import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { type Migration, type MigrationPlan, runMigrations } from '../../../src/index.js';
import { adminUrlFor, asAdmin, emptyDatabaseForThisFile, uniquePrefix } from '../../helpers/pg.js';

// The one migration runner, under the catalog's and the server's schemas alike: on a fresh,
// empty database five pools race and each version is applied exactly once; a newer schema is
// refused untouched; a failing migration leaves nothing behind; a later build applies only what
// is new. (catalog_migrations and server_migrations test what each schema holds.)

const name = `${uniquePrefix()}runner`;
const SCHEMA = 'runner_test';

const V1: Migration = {
  version: 1,
  name: 'things',
  statements: [`create table ${SCHEMA}.thing (id int primary key)`],
};
const V2: Migration = {
  version: 2,
  name: 'more things',
  statements: [
    `alter table ${SCHEMA}.thing add column label text`,
    `insert into ${SCHEMA}.thing (id, label) values (1, 'one')`,
  ],
};
const plan = (migrations: readonly Migration[]): MigrationPlan => ({
  schema: SCHEMA,
  lock: 0x7275_6e6e_6572n,
  migrations,
  subject: 'the test schema',
});

const pools = emptyDatabaseForThisFile(name, 5);

const recorded = () =>
  asAdmin(name, async (c) =>
    (
      await c.query<{ version: number }>(`select version from ${SCHEMA}.migration order by 1`)
    ).rows.map((row) => row.version),
  );
const exists = (relation: string) =>
  asAdmin(name, async (c) => (await c.query('select to_regclass($1) as t', [relation])).rows[0].t);

describe('runMigrations', () => {
  it('five processes migrate an empty database at once: all succeed, each version applied once', async () => {
    const applied = await Promise.all(pools.map((pool) => runMigrations(pool, plan([V1]))));
    // One of them did the work; the others found it done.
    expect(applied.filter((versions) => versions.length > 0)).toEqual([[1]]);
    expect(await recorded()).toEqual([1]);
    expect(await Promise.all(pools.map((pool) => runMigrations(pool, plan([V1]))))).toEqual(
      pools.map(() => []),
    );
  });

  it('a failing migration leaves nothing of the run behind (all pending steps, one transaction)', async () => {
    const broken: Migration = { version: 3, name: 'broken', statements: ['select 1/0'] };
    await expect(runMigrations(pools[0]!, plan([V1, V2, broken]))).rejects.toThrow(/division/);
    expect(await recorded()).toEqual([1]);
    expect(
      await asAdmin(
        name,
        async (c) =>
          (
            await c.query(
              `select count(*)::int as n from information_schema.columns
              where table_schema = $1 and table_name = 'thing' and column_name = 'label'`,
              [SCHEMA],
            )
          ).rows[0].n,
      ),
    ).toBe(0);
  });

  it('a later build applies only what is new', async () => {
    expect(await runMigrations(pools[1]!, plan([V1, V2]))).toEqual([2]);
    expect(await recorded()).toEqual([1, 2]);
    expect(await exists(`${SCHEMA}.thing`)).toBe(`${SCHEMA}.thing`);
  });

  it('refuses a schema newer than the plan, naming it, and changes nothing', async () => {
    await expect(runMigrations(pools[2]!, plan([V1]))).rejects.toThrow(
      'the test schema is at version 2, newer than this build (1): upgrade viewer-cache',
    );
    expect(await recorded()).toEqual([1, 2]);
  });

  it.each<[string, Partial<MigrationPlan>, RegExp]>([
    ['a schema that would need quoting', { schema: 'Runner; drop' }, /schema must be/],
    ['a lock that is not a bigint', { lock: 7 as never }, /lock must be a bigint/],
    ['no subject', { subject: '' }, /subject must name/],
    ['versions out of order', { migrations: [V2, V1] }, /ascending order/],
    ['a version 0', { migrations: [{ ...V1, version: 0 }] }, /positive integers/],
    [
      'a statement that is not text',
      { migrations: [{ ...V1, statements: [1 as never] }] },
      /every statement must be a string/,
    ],
  ])('refuses a plan with %s (TypeError, before connecting)', (_, change, message) => {
    const idle = new pg.Pool({ connectionString: adminUrlFor(name), max: 1 });
    try {
      expect(() => runMigrations(idle, { ...plan([V1]), ...change })).toThrow(TypeError);
      expect(() => runMigrations(idle, { ...plan([V1]), ...change })).toThrow(message);
      expect(idle.totalCount).toBe(0);
    } finally {
      void idle.end();
    }
  });
});
