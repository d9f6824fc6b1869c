import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor } from '../../../src/index.js';
import { countdown, type Deferred, deferred } from '../../helpers/deferred.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';
import { waitUntil } from '../../helpers/wait.js';

// One cap across all of a process's login pools (pools.maxConnections): a lease that would open
// one connection too many first closes an idle pool, then waits for a connection to come back,
// and gives up with a coded error after pools.acquireTimeout. The footprint is bounded whatever
// the number of logins.

const CAP = 2;
let fx: OrdersDb;
let capped: Datatables;
let executor: Executor;
let gate: Deferred<void> = deferred();
let arrived = countdown(0);

async function loginConnections(): Promise<number> {
  const { rows } = await fx.sql.query(
    `select count(*)::int as n from pg_stat_activity
      where datname = $1 and application_name = 'viewer-cache'`,
    [fx.db.name],
  );
  return rows[0]!['n'] as number;
}

beforeAll(async () => {
  fx = await ordersDb();
  const last = await fx.datatables.admin.addMembership(WS, 'dan@example.com', 'group', 'apac');
  await fx.settle(last.generation);
  capped = await fx.open({
    migrate: false,
    pools: { maxConnections: CAP, size: 2, acquireTimeout: 10_000, prepareAhead: false },
  });
  executor = createExecutor({
    datatables: capped,
    runnables: {
      held: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer' });
          arrived.arrive();
          await gate.promise;
          return (await db.query('select id from orders order by id')).rows.map((r) => r['id']);
        },
      },
    },
  });
});

afterAll(async () => {
  await fx?.close();
});

describe('one connection cap per process', () => {
  it('a third login waits for room, and never pushes the process over the cap', async () => {
    gate = deferred();
    arrived = countdown(2);
    const first = [
      runFor(executor, 'held', app('alice@example.com')),
      runFor(executor, 'held', app('bob@example.com')),
    ];
    await arrived.done;
    expect(await loginConnections()).toBe(CAP);
    arrived = countdown(1);
    const third = runFor(executor, 'held', app('dan@example.com'));
    // The third cannot connect while both are lent: it waits for room.
    await waitUntil('the third lease waits for room', () => capped.connections.waiting === 1);
    expect(await loginConnections()).toBe(CAP);
    expect(capped.connections).toEqual({ open: CAP, lent: CAP, waiting: 1 });
    const released = performance.now();
    gate.resolve();
    const values = await Promise.all([...first, third].map((p) => p.then((r) => r.value)));
    // Woken by the release, not by its acquireTimeout (10 s here).
    expect(performance.now() - released).toBeLessThan(5_000);
    expect(values).toEqual([ROWS['emea'], ROWS['amer'], ROWS['apac']]);
    expect(await loginConnections()).toBeLessThanOrEqual(CAP);
  });

  it('idle pools make room for a new login without waiting', async () => {
    gate = deferred();
    gate.resolve();
    arrived = countdown(0);
    for (const viewer of [
      'alice@example.com',
      'bob@example.com',
      'dan@example.com',
      'carol@example.com',
    ]) {
      await runFor(executor, 'held', app(viewer));
      // What this process holds open never exceeds the cap; the server's view of the closed
      // pool's backend can lag its close by a moment under load (its exit is asynchronous).
      expect(capped.connections.open).toBeLessThanOrEqual(CAP);
      await waitUntil('the server sees at most the cap', async () => {
        return (await loginConnections()) <= CAP;
      });
    }
  });

  it('gives up with E_CONNECT_FAILED after acquireTimeout when every connection stays lent', async () => {
    const impatient = await fx.open({
      migrate: false,
      pools: { maxConnections: CAP, size: 2, acquireTimeout: 300, prepareAhead: false },
    });
    const executor = createExecutor({
      datatables: impatient,
      runnables: {
        held: {
          fn: async (_args, ctx) => {
            await ctx.datatable('main', { as: 'viewer' });
            arrived.arrive();
            await gate.promise;
            return null;
          },
        },
      },
    });
    gate = deferred();
    arrived = countdown(2);
    const holding = [
      runFor(executor, 'held', app('alice@example.com')),
      runFor(executor, 'held', app('bob@example.com')),
    ];
    await arrived.done;
    await expect(runFor(executor, 'held', app('dan@example.com'))).rejects.toMatchObject({
      code: 'E_CONNECT_FAILED',
    });
    gate.resolve();
    await Promise.all(holding);
  });
});
