import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createExecutor,
  MemoryCacheStore,
  type RunnableDefinition,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, WS } from '../../helpers/orders_db.js';

// Learned dependency sets of runnable versions no longer served used to stay for ever: one row
// per version ever run. `gcLearnedSets` collects those no process read or grew for `idle`
// (30 days by default), bounded per call; a load records the use. Watched failing on the old
// code: no `used_at`, no `gcLearnedSets`.

const ALICE = 'alice@example.com';

let fx: OrdersDb;

beforeAll(async () => {
  fx = await ordersDb();
});

afterAll(async () => {
  await fx?.close();
});

const rowsOf = async () =>
  (
    await fx.sql.query<{ path: string }>('select path from viewer_cache.learned_set order by path')
  ).rows.map((row) => row.path);

describe('learned sets of versions no longer served are collected', () => {
  it('collects the idle ones, bounded per call, keeps those in use, and a load records a use', async () => {
    const orders: RunnableDefinition = {
      cacheTtlS: 300,
      fn: async (_args, ctx) => {
        const client = await ctx.datatable('main', { as: 'viewer' });
        return (await client.query('select count(*)::int as n from orders')).rows[0]?.['n'];
      },
    };
    // Three runnables standing for three versions (one no longer served, …).
    const executor = createExecutor({
      datatables: fx.datatables,
      runnables: { v1: orders, v2: orders, v3: orders },
    });
    const job = (path: string) =>
      executor.createJob({ workspace: WS, path, runAs: PUBLISHER, origin: app(ALICE) });
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: fx.datatables.fingerprint,
    });
    // Three versions of the runnable, each run once: a learned set each.
    for (const path of ['v1', 'v2', 'v3']) await cached.run(job(path));
    expect(await rowsOf()).toEqual(['v1', 'v2', 'v3']);

    // v1 and v2 last used 40 days ago (no longer served), v3 today.
    await fx.sql.query(
      `update viewer_cache.learned_set set used_at = now() - interval '40 days' where path in ('v1', 'v2')`,
    );
    // Bounded: one per call here.
    expect(await fx.datatables.gcLearnedSets({ maxRows: 1 })).toBe(1);
    expect(await rowsOf()).toHaveLength(2);
    expect(await fx.datatables.gcLearnedSets()).toBe(1);
    expect(await rowsOf()).toEqual(['v3']);
    expect(await fx.datatables.gcLearnedSets()).toBe(0);

    // A process that reads v3's set records the use: not collected with a 1-hour idle.
    await fx.sql.query(
      `update viewer_cache.learned_set set used_at = now() - interval '2 hours' where path = 'v3'`,
    );
    const other = await fx.open({ migrate: false });
    await other.fingerprint(job('v3'));
    expect(await fx.datatables.gcLearnedSets({ idle: '1h' })).toBe(0);
    expect(await rowsOf()).toEqual(['v3']);

    await expect(fx.datatables.gcLearnedSets({ maxRows: 0 })).rejects.toThrow(/maxRows/);
  });
});
