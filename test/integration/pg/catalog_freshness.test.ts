import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';
import { waitUntil } from '../../helpers/wait.js';

// SPEC invariant 18: freshness has a stated bound. With the LISTEN connection silently dead
// (traffic dropped, socket still up), a process notices within heartbeat + timeout, reports its
// listener down, and meanwhile confirms with Postgres instead of serving its memory. And any
// role may NOTIFY the catalog channel: that alone never makes a process reload.

const HEARTBEAT_MS = 150;
const TIMEOUT_MS = 150;
const BOUND_MS = HEARTBEAT_MS + TIMEOUT_MS;
const ALICE = 'alice@example.com';

let fx: OrdersDb;
let proxy: TcpProxy;
let watched: Datatables;
let run: Executor;

const ids = (rows: Record<string, unknown>[]) => rows.map((row) => row['id'] as number);

beforeAll(async () => {
  fx = await ordersDb();
  const url = new URL(fx.db.url);
  proxy = await TcpProxy.start({ host: url.hostname, port: Number(url.port || 5432) });
  const listenUrl = new URL(fx.db.url);
  listenUrl.port = String(proxy.port);
  watched = await fx.open({
    migrate: false,
    listenConnection: listenUrl.toString(),
    catalog: { heartbeat: HEARTBEAT_MS, heartbeatTimeout: TIMEOUT_MS },
  });
  run = createExecutor({
    datatables: watched,
    runnables: {
      orders: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
    },
  });
});

afterAll(async () => {
  await proxy?.stop();
  await fx?.close();
});

const orders = async (viewer: string) => (await runFor(run, 'orders', app(viewer))).value;

describe('a silently dead listener', () => {
  it('is reported down within the bound, and no run serves the old catalog after it', async () => {
    await waitUntil('the listener is up', () => watched.listenerUp, 5_000);
    expect(await orders(ALICE)).toEqual(ROWS['emea']);

    await proxy.setMode('blackhole');
    // A change the dead listener will never hear of: alice joins AMER.
    const change = await fx.datatables.admin.addMembership(WS, ALICE, 'group', 'amer');
    const changedAt = performance.now();
    const both = [...ROWS['emea']!, ...ROWS['amer']!].sort((a, b) => a - b);

    // Every run from now on either sees the change or happens within the stated bound.
    for (;;) {
      const rows = await orders(ALICE);
      if (JSON.stringify(rows) === JSON.stringify(both)) break;
      expect(performance.now() - changedAt).toBeLessThan(BOUND_MS + 200);
    }
    await waitUntil('the listener is reported down', () => !watched.listenerUp, BOUND_MS + 500);
    for (let i = 0; i < 20; i++) expect(await orders(ALICE)).toEqual(both);
    expect(watched.generation).toBeGreaterThanOrEqual(change.generation);

    // The listener comes back on its own once traffic flows again.
    await proxy.setMode('forward');
    await waitUntil('the listener is back', () => watched.listenerUp);
    const undo = await fx.datatables.admin.removeMembership(WS, ALICE, 'group', 'amer');
    await fx.settle(undo.generation);
    expect(await orders(ALICE)).toEqual(ROWS['emea']);
  });
});

describe('forged notifications', () => {
  it('a NOTIFY from any role with an old or fake generation causes no reload', async () => {
    // A process of its own: start() returns after its first load, so no reload is pending.
    const quiet = await fx.open({ migrate: false });
    await waitUntil('the listener is up', () => quiet.listenerUp);
    const reloads: number[] = [];
    const onRefresh = (event: { generation: number }) => reloads.push(event.generation);
    quiet.events.on('catalog:refreshed', onRefresh);
    try {
      const held = quiet.generation;
      for (const payload of [String(held), '0', String(held + 1_000_000), 'junk', '']) {
        await fx.sql.query('select pg_notify($1, $2)', ['viewer_cache_catalog', payload]);
      }
      // A real change afterwards is seen, and it is the only reload.
      const change = await fx.datatables.admin.addMembership(WS, 'zed@example.com', 'group', 'x');
      await waitUntil('the change is loaded', () => quiet.generation >= change.generation, 5_000);
      // Only the real change was loaded (a heartbeat may catch it beside its notification).
      expect(new Set(reloads)).toEqual(new Set([change.generation]));
      expect(quiet.listenerUp).toBe(true);
    } finally {
      quiet.events.off('catalog:refreshed', onRefresh);
    }
  });
});
