import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';

// SPEC invariant 17: a change invalidates exactly what it changes. The fingerprint is what every
// reference would grant the job, without the catalog generation: a change that grants a viewer
// nothing new and takes nothing away leaves their entries alone; one that does is never served
// an old entry — not even after it is undone (a role disabled then enabled again).

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';

let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;
/** A role of the second data table, `other`, held by group emea (alice and carol). */
let OTHER: string;

const ids = (rows: Record<string, unknown>[]) => rows.map((row) => row['id'] as number);

beforeAll(async () => {
  fx = await ordersDb();
  OTHER = `${fx.prefix}other_reader`;
  await fx.datatables.admin.createDatatable(WS, 'other', { database: fx.db.name });
  await change(fx.datatables.admin.createRole(WS, 'other', OTHER, { tenants: ['group:emea'] }));
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      constant: { cacheTtlS: 300, fn: async () => 42 },
      other: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('other', { as: 'viewer' });
          return (await client.query('select 7 as n')).rows;
        },
      },
      holdsOther: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => ctx.hasRole('other', OTHER),
      },
      orders: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return ids((await client.query('select id from orders order by id')).rows);
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

async function run(viewer: string, path = 'orders') {
  const result = await runFor(executor, path, app(viewer), { through: cached });
  return { fromCache: result.fromCache, rows: result.value as number[] };
}

async function change(made: Promise<{ generation: number }>): Promise<void> {
  await fx.settle((await made).generation);
}

describe('a change invalidates exactly what it changes', () => {
  it('an unrelated change keeps other viewers hitting; the changed viewer misses', async () => {
    await run(ALICE);
    await run(BOB);
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });

    // Someone else joins a group: alice's and bob's authorization did not move.
    await change(fx.datatables.admin.addMembership(WS, 'zoe@example.com', 'group', 'apac'));
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });
    expect(await run(BOB)).toEqual({ fromCache: true, rows: ROWS['amer'] });

    // Bob joins APAC: his next run misses and shows the new rows; alice still hits.
    await change(fx.datatables.admin.addMembership(WS, BOB, 'group', 'apac'));
    const bob = await run(BOB);
    expect(bob.fromCache).toBe(false);
    expect(bob.rows).toEqual([...ROWS['amer']!, ...ROWS['apac']!].sort((a, b) => a - b));
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });
    await change(fx.datatables.admin.removeMembership(WS, BOB, 'group', 'apac'));
  });

  it('a role disabled then enabled again never brings back entries from before', async () => {
    expect((await run(ALICE)).fromCache).toBe(true);
    await change(fx.datatables.admin.disableRole(WS, fx.EMEA));
    await expect(run(ALICE)).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    await change(fx.datatables.admin.enableRole(WS, fx.EMEA));
    expect(await run(ALICE)).toEqual({ fromCache: false, rows: ROWS['emea'] });
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });
  });
});

describe('an entry depends on what its run asked, nothing else', () => {
  it("a runnable that never leases keeps hitting after its viewer's role change", async () => {
    await run(ALICE, 'constant');
    expect(await run(ALICE, 'constant')).toEqual({ fromCache: true, rows: 42 });
    await change(fx.datatables.admin.disableRole(WS, fx.EMEA));
    await change(fx.datatables.admin.removeMembership(WS, ALICE, 'group', 'emea'));
    expect(await run(ALICE, 'constant')).toEqual({ fromCache: true, rows: 42 });
    await change(fx.datatables.admin.addMembership(WS, ALICE, 'group', 'emea'));
    await change(fx.datatables.admin.enableRole(WS, fx.EMEA));
    expect(await run(ALICE, 'constant')).toEqual({ fromCache: true, rows: 42 });
  });

  it('a runnable using data table main keeps hitting after a change to other only', async () => {
    await run(ALICE);
    await run(ALICE, 'other');
    await run(ALICE, 'holdsOther');
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });
    expect(await run(ALICE, 'other')).toMatchObject({ fromCache: true });
    expect(await run(ALICE, 'holdsOther')).toEqual({ fromCache: true, rows: true });

    // Alice loses her role on `other`: what reads `other` misses, what reads `main` hits.
    await change(fx.datatables.admin.disableRole(WS, OTHER));
    expect(await run(ALICE)).toEqual({ fromCache: true, rows: ROWS['emea'] });
    await expect(run(ALICE, 'other')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    // A role check is a dependency too: it misses and answers anew.
    expect(await run(ALICE, 'holdsOther')).toEqual({ fromCache: false, rows: false });
    await change(fx.datatables.admin.enableRole(WS, OTHER));
    expect(await run(ALICE, 'other')).toMatchObject({ fromCache: false });
    expect(await run(ALICE, 'holdsOther')).toEqual({ fromCache: false, rows: true });
  });

  it('a change to main misses what reads main and keeps what reads other or checks a role', async () => {
    await run(ALICE, 'other');
    await run(ALICE, 'holdsOther');
    expect(await run(ALICE)).toMatchObject({ fromCache: true });
    await change(fx.datatables.admin.disableRole(WS, fx.EMEA));
    await expect(run(ALICE)).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    expect(await run(ALICE, 'other')).toMatchObject({ fromCache: true });
    expect(await run(ALICE, 'holdsOther')).toEqual({ fromCache: true, rows: true });
    await change(fx.datatables.admin.enableRole(WS, fx.EMEA));
    expect(await run(ALICE)).toEqual({ fromCache: false, rows: ROWS['emea'] });
  });
});
