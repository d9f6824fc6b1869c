import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CatalogError, createExecutor } from '../../../src/index.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  runFor,
  setLoginsHolding,
  WS,
} from '../../helpers/orders_db.js';

// A catalog change validates what it depends on before writing, and leaves the catalog as it
// was when it fails: `datatables add x --database nosuchdb` registers nothing. And one
// workspace's broken registration (a database dropped after it was registered) never breaks
// commands in another: `roles drop` and `logins gc` still retire set logins, and no role is
// left disabled but not dropped.

let fx: OrdersDb;
beforeAll(async () => {
  fx = await ordersDb();
});
afterAll(async () => {
  await fx?.close();
});

describe('catalog changes are all-or-nothing', () => {
  it('a data table on a database that does not exist is refused, and not registered', async () => {
    const missing = `${fx.prefix}nosuchdb`;
    const before = await fx.datatables.admin.listDatatables(WS);
    const refused = await fx.datatables.admin.createDatatable(WS, 'x', { database: missing }).then(
      () => null,
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(CatalogError);
    expect((refused as Error).message).toBe(
      `data table x not registered: there is no database "${missing}" on this server`,
    );
    expect(await fx.datatables.admin.listDatatables(WS)).toEqual(before);
  });

  it("another workspace's broken registration does not stop roles drop or logins gc", async () => {
    // Registered while its database existed, then the database was dropped (written as the
    // catalog would hold it: a refused add can no longer leave one behind).
    await fx.sql.query(
      `insert into viewer_cache.datatable (workspace, name, database) values ('other', 'gone', $1)`,
      [`${fx.prefix}dropped_db`],
    );
    const executor = createExecutor({
      runnables: {
        'f/mine': {
          fn: async (_args, ctx) => {
            const client = await ctx.datatable('main', { as: 'viewer' });
            return (await client.query('select 1 as n')).rows;
          },
        },
      },
      datatables: fx.datatables,
    });
    // Carol holds emea and amer: her runs use a set login holding both.
    await runFor(executor, 'f/mine', app('carol@example.com'));
    expect(await setLoginsHolding(fx.sql, [fx.AMER])).toHaveLength(1);

    const { generation } = await fx.datatables.admin.dropRole(WS, fx.AMER);
    await fx.settle(generation);
    const roles = await fx.datatables.admin.listRoles(WS);
    expect(roles.map((r) => r.name)).not.toContain(fx.AMER);
    expect(await setLoginsHolding(fx.sql, [fx.AMER])).toEqual([]);

    // gc: a set login nobody resolves to any more is retired, past 'other' too.
    await fx.settle(
      (await fx.datatables.admin.addMembership(WS, 'carol@example.com', 'group', 'apac'))
        .generation,
    );
    await runFor(executor, 'f/mine', app('carol@example.com'));
    const [apacSet] = await setLoginsHolding(fx.sql, [fx.APAC]);
    expect(apacSet).toBeDefined();
    await fx.settle(
      (await fx.datatables.admin.removeMembership(WS, 'carol@example.com', 'group', 'apac'))
        .generation,
    );
    expect(await fx.datatables.gcLogins()).toContain(apacSet!.login);
    expect(await setLoginsHolding(fx.sql, [fx.APAC])).toEqual([]);
  });
});

describe('createRole, repeated', () => {
  it('is done already for a role this catalog made with the same definition; refused otherwise', async () => {
    const admin = fx.datatables.admin;
    const again = await admin.createRole(WS, 'main', fx.EMEA, { tenants: ['group:emea'] });
    const emea = (await admin.listRoles(WS)).find((r) => r.name === fx.EMEA);
    expect(again.oid).toBe(emea?.oid);
    await expect(
      admin.createRole(WS, 'main', fx.EMEA, { tenants: ['group:amer'] }),
    ).rejects.toThrow(/already exists/);
  });
});
