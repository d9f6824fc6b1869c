import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor } from '../../helpers/orders_db.js';

// Aggregate-only access: a runnable asks whether its viewer holds a data-table role, or
// declares one it requires, and refuses with E_ROLE_REQUIRED — before any of its code runs for a
// declared requirement. A refusal is never cached.

let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;
let bodyRan = 0;

beforeAll(async () => {
  fx = await ordersDb();
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      totals: {
        cacheTtlS: 60,
        requiresRole: { datatable: 'main', role: fx.EMEA },
        fn: async (_args, ctx) => {
          bodyRan++;
          const db = await ctx.datatable('main', { as: 'viewer' });
          return (await db.query('select count(*)::int as n from orders')).rows[0];
        },
      },
      asks: {
        fn: async (_args, ctx) => ({
          emea: await ctx.hasRole('main', fx.EMEA),
          amer: await ctx.hasRole('main', fx.AMER),
        }),
      },
      demands: {
        fn: async (_args, ctx) => {
          await ctx.requireRole('main', fx.AMER);
          return 'amer only';
        },
      },
    },
  });
  cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: fx.datatables.fingerprint,
  });
});

afterAll(async () => {
  await fx?.close();
});

describe('role checks for runnables', () => {
  it('ctx.hasRole answers for the viewer, and false without one', async () => {
    expect((await runFor(executor, 'asks', app('alice@example.com'))).value).toEqual({
      emea: true,
      amer: false,
    });
    expect((await runFor(executor, 'asks', app('carol@example.com'))).value).toEqual({
      emea: true,
      amer: true,
    });
    expect((await runFor(executor, 'asks', app(null))).value).toEqual({ emea: false, amer: false });
  });

  it('ctx.requireRole refuses with a coded error naming the data table and role', async () => {
    await expect(runFor(executor, 'demands', app('alice@example.com'))).rejects.toMatchObject({
      code: 'E_ROLE_REQUIRED',
      status: 403,
      datatable: 'main',
      role: fx.AMER,
    });
    expect((await runFor(executor, 'demands', app('bob@example.com'))).value).toBe('amer only');
  });

  it('a declared requirement refuses before any code runs, and the refusal is not cached', async () => {
    const before = bodyRan;
    for (let i = 0; i < 2; i++) {
      await expect(
        runFor(executor, 'totals', app('bob@example.com'), { through: cached }),
      ).rejects.toMatchObject({ code: 'E_ROLE_REQUIRED' });
    }
    expect(bodyRan).toBe(before);
    expect(cached.stats.stored).toBe(0);
    const ok = await runFor(executor, 'totals', app('alice@example.com'), { through: cached });
    expect(ok.value).toEqual({ n: 2 });
    expect(bodyRan).toBe(before + 1);
  });

  it('a malformed requirement is refused at registration', () => {
    expect(() =>
      createExecutor({
        datatables: fx.datatables,
        runnables: { bad: { requiresRole: { datatable: 'main', role: 'admin' }, fn: () => 1 } },
      }),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_ROLE_NAME' }));
  });
});
