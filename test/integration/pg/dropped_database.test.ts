import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor, WS } from '../../helpers/orders_db.js';
import { asAdmin, createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';

// A data table's database dropped (`drop database … with (force)`: every backend on it gets
// 57P01) while this process holds every kind of connection to it — a viewer's lent connection
// between two statements, a transaction open on one, the identity and rules connections idle —
// in two processes. An `'error'` event nobody listens to is a crash (vitest fails the run on
// it): the run in flight fails with an error, later runs on that data table fail, and the other
// data table goes on answering.

const ALICE = 'alice@example.com';

let fx: OrdersDb;
let other: Datatables;
let side: TestDatabase;
let sidePrefix: string;
const executors: Executor[] = [];
/** Resolved by the test: the runnables below wait on it between their two statements. */
let gate: { open: () => void; wait: Promise<void> };
/** Resolved by the runnables once they hold a lent connection (their first statement ran). */
let holding: { reached: () => void; wait: Promise<void> };

function newGate() {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, wait };
}

function executorFor(datatables: Datatables): Executor {
  const executor = createExecutor({
    datatables,
    runnables: {
      twoStatements: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('side', { as: 'viewer' });
          await db.query('select count(*) from items');
          holding.reached();
          await gate.wait;
          return (await db.query('select id from items order by id')).rows;
        },
      },
      inTransaction: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('side', { as: 'viewer' });
          await db.query('begin');
          await db.query('select id from items for share');
          holding.reached();
          await gate.wait;
          await db.query('commit');
          return 'committed';
        },
      },
      sideRows: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('side', { as: 'viewer' });
          return (await db.query('select id from items order by id')).rows.map((r) => r['id']);
        },
      },
      mainRows: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer' });
          return (await db.query('select id from orders order by id')).rows.map((r) => r['id']);
        },
      },
    },
  });
  executors.push(executor);
  return executor;
}

beforeAll(async () => {
  fx = await ordersDb();
  sidePrefix = uniquePrefix();
  side = await createTestDatabase(sidePrefix);
  const role = `${sidePrefix}side_emea`;
  const { admin } = fx.datatables;
  await admin.createDatatable(WS, 'side', { database: side.name });
  await admin.createRole(WS, 'side', role, { tenants: ['group:emea'] });
  await asAdmin(side.name, async (c) => {
    await c.query('create table items (id int primary key)');
    await c.query('insert into items values (1), (2)');
    await c.query(`grant select, update on items to ${pg.escapeIdentifier(role)}`);
  });
  const { rows } = await fx.sql.query('select value from viewer_cache.generation');
  await fx.settle(Number(rows[0]!['value']));
  other = await fx.open({ migrate: false });
  await other.waitForGeneration(Number(rows[0]!['value']));
});

afterAll(async () => {
  await fx?.close();
  // drop() finds the side's roles from inside its database, dropped by the test: bring it back.
  if (side !== undefined) {
    await asAdmin('postgres', (c) => c.query(`create database ${side.name}`)).catch(() => {});
    await side.drop();
  }
});

describe("a data table's database dropped under open connections", () => {
  it('runs in flight fail, later runs fail, the other data table answers, nothing crashes', async () => {
    const [here, there] = [executorFor(fx.datatables), executorFor(other)];
    // Every kind of connection up in both processes: lent, in a transaction, idle.
    for (const executor of [here, there]) {
      expect(await runFor(executor, 'sideRows', app(ALICE)).then((r) => r.value)).toEqual([1, 2]);
    }
    gate = newGate();
    const inFlight: Promise<unknown>[] = [];
    for (const executor of [here, there]) {
      for (const path of ['twoStatements', 'inTransaction']) {
        const reachedGate = newGate();
        holding = { reached: reachedGate.open, wait: reachedGate.wait };
        inFlight.push(
          runFor(executor, path, app(ALICE)).then(
            (r) => ({ ok: true, value: r.value }),
            (err: unknown) => ({ ok: false, err }),
          ),
        );
        await reachedGate.wait;
      }
    }
    await asAdmin('postgres', (c) => c.query(`drop database ${side.name} with (force)`));
    gate.open();
    const outcomes = (await Promise.all(inFlight)) as { ok: boolean; err?: Error }[];
    for (const outcome of outcomes) {
      expect(outcome.ok).toBe(false);
      expect(outcome.err).toBeInstanceOf(Error);
    }
    for (const executor of [here, there]) {
      await expect(runFor(executor, 'sideRows', app(ALICE))).rejects.toBeInstanceOf(Error);
      expect(await runFor(executor, 'mainRows', app(ALICE)).then((r) => r.value)).toEqual([1, 3]);
    }
  });
});
