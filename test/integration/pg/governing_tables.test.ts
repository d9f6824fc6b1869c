import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor, WS } from '../../helpers/orders_db.js';
import { asAdmin, createTestDatabase, uniquePrefix } from '../../helpers/pg.js';

// Governing tables (the RLS guide's entitlements table): a change to their rows — insert,
// update, delete, truncate, by anyone, through any connection — makes the affected viewers'
// next run miss in every process, while viewers the change does not name keep hitting.

const ALICE = 'alice@example.com';
const CAROL = 'carol@example.com';

let fx: OrdersDb;
let other: Datatables;
const stacks: { executor: Executor; cached: CachedExecutor }[] = [];

function stack(datatables: Datatables) {
  const executor = createExecutor({
    datatables,
    runnables: {
      shipments: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer' });
          return (await db.query('select id from shipments order by id')).rows.map((r) => r['id']);
        },
      },
    },
  });
  const cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
  stacks.push({ executor, cached });
  return { executor, cached };
}

async function run(which: number, viewer: string) {
  const { executor, cached } = stacks[which]!;
  const result = await runFor(executor, 'shipments', app(viewer), { through: cached });
  return { fromCache: result.fromCache, ids: result.value as number[] };
}

/** Waits until every process has the catalog generation a direct write produced. */
async function settled(): Promise<void> {
  const { rows } = await fx.sql.query('select value from viewer_cache.generation');
  await fx.settle(Number(rows[0]!['value']));
  await other.waitForGeneration(Number(rows[0]!['value']));
}

beforeAll(async () => {
  fx = await ordersDb();
  await asAdmin(fx.db.name, async (c) => {
    await c.query('create table entitlements (email text not null, region text not null)');
    await c.query(`insert into entitlements values ('${ALICE}', 'emea'), ('${CAROL}', 'emea')`);
    await c.query('create table shipments (id int primary key, region text not null)');
    await c.query(`insert into shipments values (1, 'emea'), (2, 'amer'), (3, 'emea')`);
    await c.query('alter table shipments enable row level security');
    for (const role of [fx.EMEA, fx.AMER]) {
      await c.query(`grant select on shipments, entitlements to ${pg.escapeIdentifier(role)}`);
    }
    await c.query(
      `create policy entitled on shipments for select using (exists (
         select 1 from entitlements e
          where e.email = (select viewer_cache.viewer_email()) and e.region = shipments.region))`,
    );
  });
  const change = await fx.datatables.admin.addGoverningTable(WS, 'main', 'public.entitlements', {
    viewerColumn: 'email',
  });
  await fx.settle(change.generation);
  other = await fx.open({ migrate: false });
  stack(fx.datatables);
  stack(other);
});

afterAll(async () => {
  await fx?.close();
});

describe('governing tables', () => {
  it('are listed, and declaring one twice changes nothing', async () => {
    await fx.datatables.admin.addGoverningTable(WS, 'main', 'entitlements', {
      viewerColumn: 'email',
    });
    expect(await fx.datatables.admin.listGoverningTables(WS)).toEqual([
      { datatable: 'main', table: 'entitlements', viewerColumn: 'email' },
    ]);
  });

  it("deleting a viewer's row: their next run misses in every process; others keep hitting", async () => {
    await settled();
    for (const p of [0, 1]) {
      for (const viewer of [ALICE, CAROL]) await run(p, viewer);
      expect(await run(p, ALICE)).toEqual({ fromCache: true, ids: [1, 3] });
    }
    // Anyone, through any connection: a plain superuser session, not the library.
    await fx.sql.query('delete from entitlements where email = $1', [ALICE]);
    await settled();
    for (const p of [0, 1]) {
      expect(await run(p, ALICE)).toEqual({ fromCache: false, ids: [] });
      expect(await run(p, CAROL)).toEqual({ fromCache: true, ids: [1, 3] });
    }
  });

  it('insert and update reach the viewers they name; truncate reaches everyone', async () => {
    await fx.sql.query(`insert into entitlements values ($1, 'amer')`, [ALICE]);
    await settled();
    expect(await run(0, ALICE)).toEqual({ fromCache: false, ids: [2] });
    expect((await run(0, CAROL)).fromCache).toBe(true);

    await fx.sql.query(`update entitlements set region = 'emea' where email = $1`, [ALICE]);
    await settled();
    expect(await run(0, ALICE)).toEqual({ fromCache: false, ids: [1, 3] });

    await fx.sql.query('truncate entitlements');
    await settled();
    expect(await run(0, ALICE)).toEqual({ fromCache: false, ids: [] });
    expect(await run(0, CAROL)).toEqual({ fromCache: false, ids: [] });
  });

  it('a statement that changes no row invalidates nothing', async () => {
    await run(0, CAROL);
    const before = (await fx.sql.query('select value from viewer_cache.generation')).rows[0];
    await fx.sql.query(`delete from entitlements where email = 'nobody@example.com'`);
    const after = (await fx.sql.query('select value from viewer_cache.generation')).rows[0];
    expect(after).toEqual(before);
    expect((await run(0, CAROL)).fromCache).toBe(true);
  });

  it('removed: the triggers are gone, and a table outside the catalog database is refused', async () => {
    await fx.datatables.admin.removeGoverningTable(WS, 'main', 'entitlements');
    const { rows } = await fx.sql.query(
      `select count(*)::int as n from pg_trigger where tgrelid = 'entitlements'::regclass and not tgisinternal`,
    );
    expect(rows[0]!['n']).toBe(0);
    expect(await fx.datatables.admin.listGoverningTables(WS)).toEqual([]);
    const elsewhere = await createTestDatabase(uniquePrefix());
    try {
      await fx.datatables.admin.createDatatable(WS, 'elsewhere', { database: elsewhere.name });
      await expect(
        fx.datatables.admin.addGoverningTable(WS, 'elsewhere', 'entitlements'),
      ).rejects.toMatchObject({ code: 'E_CATALOG', datatable: 'elsewhere' });
    } finally {
      await elsewhere.drop();
    }
    await expect(
      fx.datatables.admin.addGoverningTable(WS, 'main', 'no_such_table'),
    ).rejects.toMatchObject({ code: 'E_CATALOG' });
  });
});
