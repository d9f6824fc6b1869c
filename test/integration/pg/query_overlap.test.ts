import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PasswordDeriver } from '../../../src/datatable/logins/passwords.js';
import {
  type LoginEvents,
  RoleSetProtocol,
} from '../../../src/datatable/logins/role_set_protocol.js';
import { TypedEmitter } from '../../../src/events.js';
import { createExecutor } from '../../../src/index.js';
import { GuardedClient, queryInTurn } from '../../../src/pg/pg_clients.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  pgRole,
  runFor,
  SECRET_KEY,
  WS,
} from '../../helpers/orders_db.js';

// No connection of the library is ever sent a query while it is still answering another: pg
// deprecates it ("Calling client.query() when the client is already executing a query") and pg
// 9 refuses it; test/setup_warnings.ts makes the warning fail any test. One run of the soak
// printed it: a set-login step whose statement failed (a role of the set disabled meanwhile, a
// lock holder terminated) sent its unlock without waiting, and the admin connection went back
// to its pool still executing it — the next borrower's query queued behind it, and warned when
// the failed statement's answer had not fully arrived yet. Whether the warning shows depends on
// how the server's answer is cut into packets; what causes it does not: here the connection is
// checked straight back out of a one-connection pool and must be idle.

let fx: OrdersDb;

beforeAll(async () => {
  fx = await ordersDb();
});

afterAll(async () => {
  await fx?.close();
});

/** Whether pg still has a query running or queued on `client` (pg's own bookkeeping). */
function busy(client: pg.PoolClient): boolean {
  const internals = client as unknown as { _activeQuery: unknown; _queryQueue: unknown[] };
  return internals._activeQuery != null || internals._queryQueue.length > 0;
}

describe('one query at a time on every connection', () => {
  it('a set-login step that fails gives its admin connection back idle', async () => {
    const admin = new pg.Pool({ connectionString: fx.db.url, max: 1, Client: GuardedClient });
    try {
      const emea = (await pgRole(fx.sql, fx.EMEA))!.oid;
      const amer = (await pgRole(fx.sql, fx.AMER))!.oid;
      const protocol = new RoleSetProtocol({
        admin,
        adminConfig: { connectionString: fx.db.url },
        passwords: new PasswordDeriver(SECRET_KEY),
        events: new TypedEmitter<LoginEvents>(),
        // Another process disables a role of the set between the lock and the create.
        beforeStep: async (step) => {
          if (step === 'create-login') await fx.datatables.admin.disableRole(WS, fx.AMER);
        },
      });
      const oids = [emea, amer].sort((a, b) => a - b);
      await expect(
        protocol.prepare(RoleSetProtocol.loginName(oids), oids, fx.db.name, {
          prove: async () => {},
        }),
      ).rejects.toMatchObject({ code: 'E_ROLE_RESOLUTION_FAILED' });
      // Straight back out of the pool (no I/O in between): nothing may still be running on it.
      const client = await admin.connect();
      const wasBusy = busy(client);
      client.release();
      expect(wasBusy).toBe(false);
    } finally {
      await admin.end();
      await fx.datatables.admin.enableRole(WS, fx.AMER);
    }
  });

  it('the LISTEN connection’s flows (heartbeat, acknowledgements, LISTEN) take turns', async () => {
    const client = new GuardedClient({ connectionString: fx.db.url });
    await client.connect();
    try {
      // Every query is sent only once the one before it is done: never onto a busy client.
      const sentWhileBusy: boolean[] = [];
      const query = client.query.bind(client);
      (client as { query: unknown }).query = (...args: Parameters<typeof query>) => {
        sentWhileBusy.push(busy(client as unknown as pg.PoolClient));
        return query(...args);
      };
      const results = await Promise.all([
        queryInTurn<{ n: number }>(client, 'select 1 as n'),
        queryInTurn(client, "select pg_notify('some_channel', 'x')"),
        queryInTurn(client, 'listen some_channel'),
        queryInTurn<{ n: number }>(client, { text: 'select $1::int as n', values: [2] }),
      ]);
      expect(results[0]!.rows).toEqual([{ n: 1 }]);
      expect(results[3]!.rows).toEqual([{ n: 2 }]);
      expect(sentWhileBusy).toEqual([false, false, false, false]);
    } finally {
      await client.end();
    }
  });

  it('statements a runnable sends without waiting go out one after another', async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(warning.message);
    process.on('warning', onWarning);
    try {
      const executor = createExecutor({
        datatables: fx.datatables,
        runnables: {
          parallel: {
            fn: async (_args, ctx) => {
              const db = await ctx.datatable('main', { as: 'viewer' });
              const [a, b, c, d] = await Promise.all([
                db.query('select count(*)::int as n from orders'),
                db.query('select $1::int as n', [2]),
                db.query('select viewer_cache.viewer_email() as n'),
                db.query('select $1::text as n', ['four']),
              ]);
              return [a, b, c, d].map((result) => result.rows[0]!['n']);
            },
          },
        },
      });
      for (let i = 0; i < 3; i++) {
        const { value } = await runFor(executor, 'parallel', app('carol@example.com'));
        expect(value).toEqual([3, 2, 'carol@example.com', 'four']);
      }
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.filter((message) => /already executing a query/.test(message))).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});
