import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { withTransaction } from '../../../src/index.js';
import { testDatabaseForThisTest, uniquePrefix } from '../../helpers/pg.js';

// The one begin/commit/rollback: what the function wrote stays when it resolves, goes when it
// throws (and the error is the function's), and a snapshot read writes nothing.

describe('withTransaction', () => {
  it('commits what resolved, rolls back what threw, and refuses writes in a snapshot', async () => {
    const db = await testDatabaseForThisTest(uniquePrefix());
    const client = new pg.Client({ connectionString: db.url });
    client.on('error', () => {});
    await client.connect();
    try {
      await client.query('create table t (n int)');
      expect(
        await withTransaction(client, async (c) => {
          await c.query('insert into t values (1)');
          return 'kept';
        }),
      ).toBe('kept');
      const boom = new Error('the runnable failed');
      await expect(
        withTransaction(client, async (c) => {
          await c.query('insert into t values (2)');
          throw boom;
        }),
      ).rejects.toBe(boom);
      await expect(
        withTransaction(client, (c) => c.query('insert into t values (3)'), { snapshot: true }),
      ).rejects.toMatchObject({ code: '25006' });
      const { rows } = await client.query<{ n: number }>('select n from t order by n');
      expect(rows.map((row) => row.n)).toEqual([1]);
      // The connection is usable afterwards: no transaction left open on it.
      expect((await client.query('select 1 as one')).rows[0]).toEqual({ one: 1 });
    } finally {
      await client.end();
    }
  });
});
