import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor, ViewerCacheError } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor } from '../../helpers/orders_db.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';

// Issue 19: with the data table's database gone, a library user gets one coded error from the
// datatables layer, naming the data table — E_DATATABLE_UNREACHABLE, 503, safe to retry — not
// whatever step happened to meet the outage first (the catalog read, the login, the binding).
// Every connection of this process goes through a proxy that stops the database underneath.

const ALICE = 'alice@example.com';
let fx: OrdersDb;
let proxy: TcpProxy;
let reached: Datatables;
let run: Executor;

beforeAll(async () => {
  fx = await ordersDb();
  const url = new URL(fx.db.url);
  proxy = await TcpProxy.start({ host: url.hostname, port: Number(url.port || 5432) });
  const via = new URL(fx.db.url);
  via.hostname = '127.0.0.1';
  via.port = String(proxy.port);
  reached = await fx.open({ migrate: false, connection: via.toString() });
  run = createExecutor({
    datatables: reached,
    runnables: {
      orders: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return (await client.query('select id from orders order by id')).rows.map((r) => r.id);
        },
      },
    },
  });
});

afterAll(async () => {
  await proxy?.stop();
  await fx?.close();
});

/** The first coded error on the chain of what `promise` rejected with. */
async function refusal(promise: Promise<unknown>): Promise<ViewerCacheError> {
  let err: unknown = await promise.then(
    () => {
      throw new Error('expected the run to fail');
    },
    (e: unknown) => e,
  );
  while (err instanceof ViewerCacheError && err.code === 'E_EXECUTOR_FAILED') err = err.cause;
  expect(err).toBeInstanceOf(ViewerCacheError);
  return err as ViewerCacheError;
}

const orders = (args: Record<string, unknown> = {}) =>
  runFor(run, 'orders', app(ALICE), { args }).then((r) => r.value);

describe('the data table database stopped underneath', () => {
  it('connect refused: E_DATATABLE_UNREACHABLE naming the data table; back once it is', async () => {
    expect(await orders()).toEqual(ROWS['emea']);
    await proxy.setMode('refuse'); // not listening, and every live connection cut
    const err = await refusal(orders({ q: 1 }));
    expect(err).toMatchObject({ code: 'E_DATATABLE_UNREACHABLE', status: 503, datatable: 'main' });
    expect(err.message).toMatch(/data table "main" is unavailable: its database is unreachable/);
    await proxy.setMode('forward');
    expect(await orders({ q: 2 })).toEqual(ROWS['emea']);
  });
});
