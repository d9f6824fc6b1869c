import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor } from '../../../src/index.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  ROWS,
  runFor,
  WS,
} from '../../helpers/orders_db.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';
import { waitUntil } from '../../helpers/wait.js';

// catalog.awaitPropagation: an admin change returns only once every other live process has
// acknowledged it, so a run that starts anywhere after it returns sees it. Made deterministic by
// holding the reader's notification in a proxy: the change must not return while it is held.

const ALICE = 'alice@example.com';

let fx: OrdersDb;
let proxy: TcpProxy;
let reader: Datatables;
let writer: Datatables;
let run: Executor;

const ids = (rows: Record<string, unknown>[]) => rows.map((row) => row['id'] as number);
const orders = async () => (await runFor(run, 'orders', app(ALICE))).value as number[];

beforeAll(async () => {
  fx = await ordersDb();
  const url = new URL(fx.db.url);
  proxy = await TcpProxy.start({ host: url.hostname, port: Number(url.port || 5432) });
  const listenUrl = new URL(fx.db.url);
  listenUrl.port = String(proxy.port);
  // A long heartbeat: the reader keeps trusting its memory while its listener is held.
  reader = await fx.open({
    migrate: false,
    listenConnection: listenUrl.toString(),
    catalog: { heartbeat: '10s', heartbeatTimeout: '10s' },
  });
  writer = await fx.open({ migrate: false, catalog: { awaitPropagation: true } });
  run = createExecutor({
    datatables: reader,
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

describe('catalog.awaitPropagation', () => {
  it('a change returns only after every live listener acknowledged it; the next run sees it', async () => {
    await waitUntil('both listeners are up', () => reader.listenerUp && writer.listenerUp);
    const both = [...ROWS['emea']!, ...ROWS['amer']!].sort((a, b) => a - b);
    for (const [change, expected] of [
      [() => writer.admin.addMembership(WS, ALICE, 'group', 'amer'), both],
      [() => writer.admin.removeMembership(WS, ALICE, 'group', 'amer'), ROWS['emea']!],
    ] as const) {
      const before = await orders();
      expect(before).not.toEqual(expected);
      const generation = (await fx.sql.query('select value from viewer_cache.generation')).rows[0]
        .value;
      await proxy.setMode('blackhole');
      let returned = false;
      const pending = change().then((result) => {
        returned = true;
        return result;
      });
      await waitUntil('the change committed', async () => {
        const { rows } = await fx.sql.query('select value from viewer_cache.generation');
        return Number(rows[0].value) > Number(generation);
      });
      // Committed, but the reader has not heard of it: the change has not returned, and the
      // reader, which still trusts its memory, may answer the old state.
      const during = await orders();
      expect(returned, 'returned before the reader acknowledged').toBe(false);
      expect(during).toEqual(before);

      await proxy.setMode('forward');
      await pending;
      // From the change's return on, the reader's next run sees it.
      expect(await orders()).toEqual(expected);
    }
  }, 60_000);
});

describe('datatables.awaitPropagation (writers of governing tables)', () => {
  it("rows written on the application's own connection: after the wait, every process's next run sees them", async () => {
    await fx.sql.query('create table entitlements (email text not null, region text not null)');
    await writer.admin.addGoverningTable(WS, 'main', 'entitlements', { viewerColumn: 'email' });
    await waitUntil('both listeners are up', () => reader.listenerUp && writer.listenerUp);
    const job = () =>
      run.createJob({ workspace: WS, path: 'orders', runAs: PUBLISHER, origin: app(ALICE) });
    for (const write of [
      `insert into entitlements values ('${ALICE}', 'emea')`,
      `delete from entitlements where email = '${ALICE}'`,
    ]) {
      await writer.awaitPropagation();
      const before = await reader.fingerprint(job());
      await proxy.setMode('blackhole');
      // A plain connection, not the library: nobody waits for it but the application.
      await fx.sql.query(write);
      let returned = false;
      const pending = writer.awaitPropagation().then((result) => {
        returned = true;
        return result;
      });
      // The reader has not heard of the write and still trusts its memory: the old state.
      expect(await reader.fingerprint(job())).toBe(before);
      expect(returned, 'returned before the reader acknowledged').toBe(false);
      await proxy.setMode('forward');
      const { missing, acknowledged } = await pending;
      expect({ missing, acknowledged }).toMatchObject({ missing: 0 });
      expect(acknowledged).toBeGreaterThanOrEqual(1);
      // From the wait's return on, the reader's next run sees the write.
      expect(await reader.fingerprint(job())).not.toBe(before);
    }
  }, 60_000);
});
