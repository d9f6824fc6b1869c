import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExecutor } from '../../../src/index.js';
import {
  app,
  canAuthenticate,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  setLoginRows,
  WS,
} from '../../helpers/orders_db.js';

// Two catalogs on one cluster (two deployments, or two test files): each must only ever touch
// its own set logins, and their cache fingerprints must never meet.
let a: OrdersDb;
let b: OrdersDb;

beforeAll(async () => {
  [a, b] = await Promise.all([ordersDb(), ordersDb()]);
});

afterAll(async () => {
  await Promise.allSettled([a?.close(), b?.close()]);
});

const whoami = {
  fn: async (_args: Record<string, unknown>, ctx: import('../../../src/index.js').RunContext) => {
    const client = await ctx.datatable('main', { as: 'viewer' });
    return (await client.query('select current_user as login')).rows[0]!['login'];
  },
};

describe('two catalogs on one cluster', () => {
  it("one catalog's logins gc never retires the other's set logins", async () => {
    for (const fx of [a, b]) {
      const executor = createExecutor({ datatables: fx.datatables, runnables: { whoami } });
      const job = executor.createJob({
        workspace: WS,
        path: 'whoami',
        runAs: PUBLISHER,
        origin: app('carol@example.com'),
      });
      expect(String((await executor.run(job)).value)).toMatch(/^wm_set_/);
    }
    const listed = (await b.datatables.listLogins()).map((login) => login.login);
    const [aRow] = await setLoginRows(a.sql);
    expect(aRow).toBeDefined();
    expect(listed).not.toContain(aRow!.login);

    // Nobody in B resolves to a set any more: B's gc retires B's login and nothing else.
    const change = await b.datatables.admin.removeMembership(
      WS,
      'carol@example.com',
      'group',
      'amer',
    );
    await b.settle(change.generation);
    const retired = await b.datatables.gcLogins();
    expect(retired).toHaveLength(1);
    expect(retired).not.toContain(aRow!.login);
    expect(await canAuthenticate(a.db.name, aRow!.login, aRow!.password)).toBe(true);
    expect(await setLoginRows(a.sql)).toEqual([aRow]);
  });

  it('two catalogs give different fingerprints to the same job, even with equal generations', async () => {
    await a.sql.query("update viewer_cache.generation set catalog_id = 'catalog-a'");
    await b.sql.query("update viewer_cache.generation set catalog_id = 'catalog-b'");
    // Any change makes both reload; bring them to the same generation number too.
    const ga = (await a.datatables.admin.addMembership(WS, 'x@example.com', 'group', 'g'))
      .generation;
    const gb = (await b.datatables.admin.addMembership(WS, 'x@example.com', 'group', 'g'))
      .generation;
    await a.sql.query('update viewer_cache.generation set value = $1', [Math.max(ga, gb) + 1]);
    await b.sql.query('update viewer_cache.generation set value = $1', [Math.max(ga, gb) + 1]);
    const ga2 = (await a.datatables.admin.addMembership(WS, 'y@example.com', 'group', 'g'))
      .generation;
    const gb2 = (await b.datatables.admin.addMembership(WS, 'y@example.com', 'group', 'g'))
      .generation;
    expect(ga2).toBe(gb2);
    await Promise.all([a.settle(ga2), b.settle(gb2)]);
    const job = {
      id: 'j',
      workspace: WS,
      runnable: { path: 'p', hash: 'h' },
      args: {},
      perms: { email: PUBLISHER, endUserEmail: 'nobody@example.com' },
    };
    const [sa, sb] = await Promise.all([
      a.datatables.fingerprint(job),
      b.datatables.fingerprint(job),
    ]);
    expect(sa).toContain('catalog-a');
    expect(sb).toContain('catalog-b');
    expect(sa).not.toBe(sb);
  });
});
