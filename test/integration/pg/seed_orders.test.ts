import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor } from '../../helpers/orders_db.js';

// The seed's example end to end: an `orders` table with RLS by region, roles for EMEA and AMER,
// viewers in one, the other, both and neither (see helpers/orders_db.ts).
let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;

beforeAll(async () => {
  fx = await ordersDb();
  const { datatables } = fx;
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
  cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
});

afterAll(async () => {
  await fx?.close();
});

function run(path: string, viewer: string | null, via: 'cached' | 'direct' = 'cached') {
  return runFor(executor, path, app(viewer), via === 'cached' ? { through: cached } : {});
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
    expect((await run('whoami', 'alice@example.com')).value).toBe(fx.EMEA);
    expect((await run('whoami', 'carol@example.com')).value).toMatch(/^wm_set_[0-9a-f]{32}$/);
  });

  it('refuses dave (no roles) and an anonymous visitor (no viewer), and caches neither', async () => {
    await expect(run('orders', 'dave@example.com')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    await expect(run('orders', null)).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    await expect(run('orders', 'dave@example.com')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
  });
});
