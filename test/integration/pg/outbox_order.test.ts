import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { migrateServer, SERVER_SCHEMA } from '../../../src/server/process/server_migrations.js';
import { OUTBOX_PAGE, Outbox } from '../../../src/server/recipients/outbox.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';

// A recipient's outbox page is newest delivery first: by delivery time, not by id (ids of a
// batch's concurrent deliveries are not in delivery order), and past a page the newest stay.

let db: TestDatabase;
let pool: pg.Pool;

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  pool = new pg.Pool({ connectionString: db.url, max: 2 });
  await migrateServer(pool);
});

afterAll(async () => {
  await pool?.end();
  await db?.drop();
});

it('pages newest first by delivery time, whatever the ids', async () => {
  const n = OUTBOX_PAGE + 20;
  // Ids ascend while delivery times descend: id order is exactly the wrong order.
  await pool.query(
    `insert into ${SERVER_SCHEMA}.outbox (workspace, recipient, batch, runnable, created_at, result)
     select 'acme', 'ada@acme.test', gen_random_uuid(), 'f/r', now() - i * interval '1 second',
            jsonb_build_object('i', i)
       from generate_series(1, $1) as i`,
    [n],
  );
  const items = await new Outbox(pool).list('acme', 'ada@acme.test');
  expect(items).toHaveLength(OUTBOX_PAGE);
  const times = items.map((item) => Date.parse(item.createdAt));
  expect(times).toEqual([...times].sort((a, b) => b - a));
  expect(items[0]).toMatchObject({ result: { i: 1 } });
  expect(items.at(-1)).toMatchObject({ result: { i: OUTBOX_PAGE } });
});
