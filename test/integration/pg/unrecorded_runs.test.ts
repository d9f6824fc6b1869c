import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createExecutor,
  type JobExecutor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, ROWS, WS } from '../../helpers/orders_db.js';

// A run whose data-table connections reach the catalog through another job object than the one
// the cache tracks (a layer between them copied the job) used to be learned as "depends on
// nothing": the set was stored and shared, every later lookup keyed blind to roles, and a viewer
// who lost a role was still served the rows of the entry written before. Watched failing on the
// old RunDependencies: the learned row was `{}` and the repeat after the revocation a hit with
// carol's AMER rows too.

const CAROL = 'carol@example.com';

let fx: OrdersDb;

beforeAll(async () => {
  fx = await ordersDb();
});

afterAll(async () => {
  await fx?.close();
});

describe('a run whose statements were not recorded against its job is never learned', () => {
  it('learns nothing from it, and a role change still reaches the key', async () => {
    const executor = createExecutor({
      datatables: fx.datatables,
      runnables: {
        orders: {
          cacheTtlS: 300,
          fn: async (_args, ctx) => {
            const client = await ctx.datatable('main', { as: 'viewer' });
            const { rows } = await client.query('select id from orders order by id');
            return rows.map((row) => row['id'] as number);
          },
        },
      },
    });
    // The copy: the executor (and so the connector) sees another object than the cache.
    const copying: JobExecutor = { run: (job, options) => executor.run({ ...job }, options) };
    const cached = withResultCache(copying, {
      store: new MemoryCacheStore(),
      fingerprint: fx.datatables.fingerprint,
    });
    const run = async () => {
      const job = executor.createJob({
        workspace: WS,
        path: 'orders',
        runAs: PUBLISHER,
        origin: app(CAROL),
      });
      const result = await cached.run(job);
      return { fromCache: result.fromCache, value: result.value };
    };

    expect(await run()).toEqual({ fromCache: false, value: [1, 2, 3] });
    // Nothing learned (no row at all; the old code stored `members = {}`)…
    const learned = await fx.sql.query(
      `select everything, members from viewer_cache.learned_set where path = 'orders'`,
    );
    expect(learned.rows).toEqual([]);
    // …and the result stored under the full fingerprint, which a repeat finds.
    expect(await run()).toEqual({ fromCache: true, value: [1, 2, 3] });

    // Carol leaves AMER: her next run is a miss with EMEA's rows, never the entry from before.
    const { generation } = await fx.datatables.admin.removeMembership(WS, CAROL, 'group', 'amer');
    await fx.settle(generation);
    expect(await run()).toEqual({ fromCache: false, value: ROWS['emea'] });
  });
});
