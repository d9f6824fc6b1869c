import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { RoleSetProtocol } from '../../../src/datatable/logins/role_set_protocol.js';
import { createExecutor } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';
import { waitUntil } from '../../helpers/wait.js';

// A membership change that makes a new combination of roles prepares its set login in the
// background, so the viewer's first run finds it made, proven, and a connection warm.

let fx: OrdersDb;
let a: Datatables;
let b: Datatables;
const created: string[] = [];

beforeAll(async () => {
  fx = await ordersDb();
  a = await fx.open({ migrate: false, pools: { prepareAhead: true } });
  b = await fx.open({ migrate: false, pools: { prepareAhead: true } });
  for (const [name, instance] of [
    ['a', a],
    ['b', b],
  ] as const) {
    instance.events.on('login:created', () => created.push(name));
  }
});

afterAll(async () => {
  await fx?.close();
});

async function rowFor(login: string): Promise<boolean> {
  const { rows } = await fx.sql.query('select 1 from viewer_cache.role_set where login = $1', [
    login,
  ]);
  return rows.length === 1;
}

describe('set logins prepared ahead', () => {
  it('a new combination is made once, across processes, before the viewer runs', async () => {
    const viewer = 'newcomer@example.com';
    const roles = await fx.datatables.admin.listRoles(WS);
    const oids = roles
      .filter((role) => role.name === fx.EMEA || role.name === fx.APAC)
      .map((role) => role.oid);
    const login = RoleSetProtocol.loginName(oids);
    expect(await rowFor(login)).toBe(false);

    await fx.datatables.admin.addMembership(WS, viewer, 'group', 'emea');
    await fx.datatables.admin.addMembership(WS, viewer, 'group', 'apac');
    await waitUntil('the new set login is prepared', () => rowFor(login));
    expect(created).toHaveLength(1);

    // The first run creates nothing: the login was there, proven, before it.
    const before = created.length;
    const executor = createExecutor({
      datatables: created[0] === 'a' ? b : a,
      runnables: {
        orders: {
          fn: async (_args, ctx) => {
            const client = await ctx.datatable('main', { as: 'viewer' });
            const { rows } = await client.query(
              'select current_user as login, array_agg(id order by id) as ids from orders',
            );
            return rows[0];
          },
        },
      },
    });
    const result = (await runFor(executor, 'orders', app(viewer))).value as {
      login: string;
      ids: number[];
    };
    expect(result.login).toBe(login);
    expect(result.ids).toEqual([...ROWS['emea']!, ...ROWS['apac']!].sort((x, y) => x - y));
    expect(created.length).toBe(before);
  });

  it('combinations that existed before start are not prepared by a process starting up', async () => {
    // Carol's EMEA+AMER set exists in the catalog from the fixture, and nobody has used it.
    const roles = await fx.datatables.admin.listRoles(WS);
    const oidOf = (name: string) => roles.find((role) => role.name === name)!.oid;
    const carols = RoleSetProtocol.loginName([oidOf(fx.EMEA), oidOf(fx.AMER)]);
    expect(await rowFor(carols)).toBe(false);
    await fx.open({ migrate: false, pools: { prepareAhead: true } });
    // A new combination after the start: once its row exists, every warmer has made a pass on
    // a state that also holds carol's set, which none of them prepared.
    const fresh = RoleSetProtocol.loginName([oidOf(fx.AMER), oidOf(fx.APAC)]);
    await fx.datatables.admin.addMembership(WS, 'later@example.com', 'group', 'amer');
    await fx.datatables.admin.addMembership(WS, 'later@example.com', 'group', 'apac');
    await waitUntil('the later set login is prepared', () => rowFor(fresh));
    expect(await rowFor(carols)).toBe(false);
  });
});
