import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type EmbedViewer,
  type Executor,
  MemoryCacheStore,
  type RunOrigin,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor, WS } from '../../helpers/orders_db.js';
import { asAdmin } from '../../helpers/pg.js';

// Embed viewers against a real Postgres: they resolve to embed-tenanted roles only, policies read
// their signed attributes under RLS, and two embeds differing in one attribute never share rows
// or entries — nor does an embed share with the signed-in user whose email it carries.

let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;
let runs = 0;
let EMBED_ANY: string;
let EMBED_PORTAL: string;
let EVERYONE: string;
const ALICE = 'alice@example.com';

const embed = (
  attributes: Record<string, string>,
  email: string | null = null,
  appName = 'portal',
) => ({ kind: 'embed', viewer: { app: appName, attributes, email } as EmbedViewer }) as RunOrigin;
const ids = (rows: unknown) => (rows as { id: number }[]).map((row) => row.id);

beforeAll(async () => {
  fx = await ordersDb();
  EMBED_ANY = `${fx.prefix}embed_any`;
  EMBED_PORTAL = `${fx.prefix}embed_portal`;
  EVERYONE = `${fx.prefix}everyone`;
  const { admin } = fx.datatables;
  await admin.createRole(WS, 'main', EMBED_ANY, { tenants: ['embed:*'] });
  await admin.createRole(WS, 'main', EMBED_PORTAL, { tenants: ['embed:portal'] });
  // `*` is every signed-in user, and an alice-only role: neither reaches an embed viewer.
  await admin.createRole(WS, 'main', EVERYONE, { tenants: ['*', `user:${ALICE}`] });
  await asAdmin(fx.db.name, async (c) => {
    await c.query(
      'create table invoices (id int primary key, customer_id text not null, amount int not null)',
    );
    await c.query(
      `insert into invoices values (1, 'c1', 10), (2, 'c2', 20), (3, 'c1', 30), (4, 'c3', 40)`,
    );
    await c.query('alter table invoices enable row level security');
    await c.query(`grant select on invoices to ${EMBED_ANY}, ${EMBED_PORTAL}, ${EVERYONE}`);
    // Embed policies are written TO the embed role, so signed-in viewers never evaluate them.
    await c.query(
      `create policy by_customer on invoices for select to ${EMBED_ANY}
         using (customer_id = (select viewer_cache.viewer_attribute('customer_id')))`,
    );
    await c.query(
      `create policy everyone_sees_c3 on invoices for select to ${EVERYONE} using (customer_id = 'c3')`,
    );
  });
  const last = await admin.setTenants(WS, EVERYONE, ['*', `user:${ALICE}`]);
  await fx.settle(last.generation);
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      invoices: {
        cacheTtlS: 60,
        fn: async (_args, ctx) => {
          runs++;
          const db = await ctx.datatable('main', { as: 'viewer' });
          return (await db.query('select id from invoices order by id')).rows;
        },
      },
      email: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer' });
          return (await db.query('select viewer_cache.viewer_email() as email')).rows[0];
        },
      },
      roles: {
        fn: async (_args, ctx) => ({
          any: await ctx.hasRole('main', EMBED_ANY),
          portal: await ctx.hasRole('main', EMBED_PORTAL),
          everyone: await ctx.hasRole('main', EVERYONE),
          emea: await ctx.hasRole('main', fx.EMEA),
        }),
      },
      child: { cacheTtlS: 60, fn: (_args, ctx) => ctx.runChild('invoices') },
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

describe('embed viewers under RLS', () => {
  it('rows match the signed attribute; same runnable, two embeds differing in one attribute', async () => {
    const before = runs;
    const c1 = await runFor(executor, 'invoices', embed({ customer_id: 'c1' }), {
      through: cached,
    });
    const c2 = await runFor(executor, 'invoices', embed({ customer_id: 'c2' }), {
      through: cached,
    });
    expect(ids(c1.value)).toEqual([1, 3]);
    expect(ids(c2.value)).toEqual([2]);
    expect([c1.fromCache, c2.fromCache]).toEqual([false, false]);
    // Second runs: hits, each its own bytes.
    const c1Again = await runFor(executor, 'invoices', embed({ customer_id: 'c1' }), {
      through: cached,
    });
    const c2Again = await runFor(executor, 'invoices', embed({ customer_id: 'c2' }), {
      through: cached,
    });
    expect([c1Again.fromCache, c2Again.fromCache]).toEqual([true, true]);
    expect(ids(c1Again.value)).toEqual([1, 3]);
    expect(ids(c2Again.value)).toEqual([2]);
    expect(runs - before).toBe(2);
  });

  it('an extra attribute is another viewer: its own run, its own entry', async () => {
    const before = runs;
    const more = await runFor(executor, 'invoices', embed({ customer_id: 'c1', region: 'eu' }), {
      through: cached,
    });
    expect(more.fromCache).toBe(false);
    expect(ids(more.value)).toEqual([1, 3]);
    expect(runs - before).toBe(1);
  });

  it('an embed carrying alice’s email is not alice: no user:, no *, no group roles, no shared entry', async () => {
    const asEmbed = await runFor(executor, 'invoices', embed({ customer_id: 'c1' }, ALICE), {
      through: cached,
    });
    expect(ids(asEmbed.value)).toEqual([1, 3]);
    expect(asEmbed.fromCache).toBe(false);
    const asAlice = await runFor(executor, 'invoices', app(ALICE), { through: cached });
    // alice holds EVERYONE (and EMEA, which grants nothing on invoices): only c3, never c1's.
    expect(ids(asAlice.value)).toEqual([4]);
    expect(asAlice.fromCache).toBe(false);
  });

  it('hasRole: an embed viewer holds only embed-tenanted roles', async () => {
    expect((await runFor(executor, 'roles', embed({}, ALICE))).value).toEqual({
      any: true,
      portal: true,
      everyone: false,
      emea: false,
    });
    expect((await runFor(executor, 'roles', embed({}, null, 'kiosk'))).value).toEqual({
      any: true,
      portal: false,
      everyone: false,
      emea: false,
    });
    expect((await runFor(executor, 'roles', app(ALICE))).value).toEqual({
      any: false,
      portal: false,
      everyone: true,
      emea: true,
    });
  });

  it('viewer_email(): the asserted email, or a coded refusal when the host signed none', async () => {
    expect((await runFor(executor, 'email', embed({}, 'host-user@example.com'))).value).toEqual({
      email: 'host-user@example.com',
    });
    await expect(runFor(executor, 'email', embed({}))).rejects.toMatchObject({
      code: 'E_NO_VIEWER',
      status: 403,
    });
  });

  it('an attribute the viewer was not given raises (E_NO_VIEWER_ATTRIBUTE), and is not cached', async () => {
    for (let i = 0; i < 2; i++) {
      await expect(
        runFor(executor, 'invoices', embed({ other: 'x' }), { through: cached }),
      ).rejects.toMatchObject({ code: 'E_NO_VIEWER_ATTRIBUTE' });
    }
  });

  it('a child job runs for the same embed viewer', async () => {
    const child = await runFor(executor, 'child', embed({ customer_id: 'c2' }), {
      through: cached,
    });
    expect(child.value).toEqual([{ id: 2 }]);
  });

  it('no embed-tenanted role on the data table: E_NO_ROLES (fail closed)', async () => {
    const change = await fx.datatables.admin.setTenants(WS, EMBED_ANY, ['group:nobody']);
    const change2 = await fx.datatables.admin.setTenants(WS, EMBED_PORTAL, ['group:nobody']);
    await fx.settle(Math.max(change.generation, change2.generation));
    try {
      await expect(
        runFor(executor, 'invoices', embed({ customer_id: 'c1' }), { through: cached }),
      ).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    } finally {
      await fx.datatables.admin.setTenants(WS, EMBED_ANY, ['embed:*']);
      const last = await fx.datatables.admin.setTenants(WS, EMBED_PORTAL, ['embed:portal']);
      await fx.settle(last.generation);
    }
  });
});
