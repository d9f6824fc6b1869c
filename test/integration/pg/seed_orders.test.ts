import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatatables, type Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  type RunOrigin,
  withResultCache,
} from '../../../src/index.js';
import { asAdmin, createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';

// The seed's example end to end: an `orders` table with RLS by region, roles for EMEA and AMER,
// viewers in one, the other, both and neither.
const prefix = uniquePrefix();
const EMEA = `${prefix}sales_emea`;
const AMER = `${prefix}sales_amer`;
const WS = 'demo';

let db: TestDatabase;
let datatables: Datatables;
let executor: Executor;
let cached: CachedExecutor;

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  datatables = await createDatatables({ connection: db.url, secretKey: 'k'.repeat(32) });
  await datatables.admin.createDatatable(WS, 'main', { database: db.name });
  await datatables.admin.createRole(WS, 'main', EMEA, { tenants: ['group:emea'] });
  await datatables.admin.createRole(WS, 'main', AMER, { tenants: ['group:amer'] });
  await asAdmin(db.name, async (c) => {
    await c.query(
      `create table orders (id int primary key, region text not null, amount int not null)`,
    );
    await c.query(
      `insert into orders values (1, 'emea', 10), (2, 'amer', 20), (3, 'emea', 30), (4, 'apac', 40)`,
    );
    await c.query(`alter table orders enable row level security`);
    await c.query(`grant select on orders to ${EMEA}, ${AMER}`);
    await c.query(
      `create policy emea on orders for select using (region = 'emea' and pg_has_role(current_user, '${EMEA}', 'member'))`,
    );
    await c.query(
      `create policy amer on orders for select using (region = 'amer' and pg_has_role(current_user, '${AMER}', 'member'))`,
    );
  });
  for (const [email, group] of [
    ['alice@example.com', 'emea'],
    ['bob@example.com', 'amer'],
    ['carol@example.com', 'emea'],
    ['carol@example.com', 'amer'],
  ] as const) {
    await datatables.admin.addMembership(WS, email, 'group', group);
  }
  const latest = await datatables.admin.addMembership(WS, 'x@example.com', 'group', 'none');
  await datatables.waitForGeneration(latest.generation);

  executor = createExecutor({
    datatables,
    runnables: {
      orders: {
        cacheTtlS: 60,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return (await client.query('select id from orders order by id')).rows.map((r) => r['id']);
        },
      },
      orders_sql: {
        kind: 'sql',
        database: 'datatable://main?as=viewer',
        sql: 'select id from orders order by id',
        cacheTtlS: 60,
      },
      orders_child: { fn: (_args, ctx) => ctx.runChild('orders') },
      whoami: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return (await client.query('select current_user as u')).rows[0]!['u'];
        },
      },
    },
  });
  cached = withResultCache(executor, { store: new MemoryCacheStore(), scope: datatables.scope });
});

afterAll(async () => {
  await datatables?.close();
  await db?.drop();
});

function app(email: string | null): RunOrigin {
  return { kind: 'app', session: email === null ? null : { email } };
}

async function run(path: string, viewer: string | null, via: 'cached' | 'direct' = 'cached') {
  const job = executor.createJob({
    workspace: WS,
    path,
    runAs: 'publisher@example.com',
    origin: app(viewer),
  });
  return (via === 'cached' ? cached : executor).run(job);
}

const expected: Record<string, number[]> = {
  'alice@example.com': [1, 3],
  'bob@example.com': [2],
  'carol@example.com': [1, 2, 3],
};

describe('orders as the viewer', () => {
  for (const [viewer, ids] of Object.entries(expected)) {
    it(`${viewer} sees exactly their rows: TS, SQL, child job, then a cache hit`, async () => {
      expect((await run('orders', viewer, 'direct')).value).toEqual(ids);
      expect((await run('orders_sql', viewer, 'direct')).value).toEqual(ids.map((id) => ({ id })));
      expect((await run('orders_child', viewer, 'direct')).value).toEqual(ids);
      const first = await run('orders', viewer);
      const second = await run('orders', viewer);
      expect(first.value).toEqual(ids);
      expect(second.fromCache).toBe(true);
      expect(second.value).toEqual(ids);
    });
  }

  it('connects carol through a set login and alice through her one role', async () => {
    expect((await run('whoami', 'alice@example.com')).value).toBe(EMEA);
    expect((await run('whoami', 'carol@example.com')).value).toMatch(/^wm_set_[0-9a-f]{32}$/);
  });

  it('refuses dave (no roles) and an anonymous visitor (no viewer), and caches neither', async () => {
    await expect(run('orders', 'dave@example.com')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    await expect(run('orders', null)).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    await expect(run('orders', 'dave@example.com')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
  });
});
