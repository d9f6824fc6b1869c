import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExecutor, type Executor, type RunContext } from '../../../src/index.js';
import {
  app,
  loginConfig,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  roleLoginPasswords,
  runFor,
  WS,
} from '../../helpers/orders_db.js';
import { asAdmin } from '../../helpers/pg.js';
import { waitUntil } from '../../helpers/wait.js';

// SPEC invariant 13: Postgres can tell viewers apart, not only role sets. Two providers holding
// the same role share a login, yet a policy on viewer_cache.viewer_email() shows each only their
// own patients; the binding is made by the library for that lease and backend only, and nothing
// the lent connection runs can change it or keep it past release.

const ANN = 'ann@example.com';
const BEN = 'ben@example.com';

let fx: OrdersDb;
let executor: Executor;
let lastPid = 0;

type Attempt = (db: Awaited<ReturnType<RunContext['datatable']>>) => Promise<unknown>;
let attempt: Attempt = async () => null;

const patients = async (db: Awaited<ReturnType<RunContext['datatable']>>) =>
  (await db.query('select name from patients order by name')).rows.map((row) => row['name']);

beforeAll(async () => {
  fx = await ordersDb();
  await asAdmin(fx.db.name, async (c) => {
    await c.query('create table patients (name text, provider_email text)');
    await c.query(
      `insert into patients values ('p1', '${ANN}'), ('p2', '${ANN}'), ('p3', '${BEN}')`,
    );
    await c.query('alter table patients enable row level security');
    await c.query(`grant select on patients to ${pg.escapeIdentifier(fx.EMEA)}`);
    await c.query(
      `create policy own_patients on patients for select
         using (provider_email = (select viewer_cache.viewer_email()))`,
    );
  });
  for (const email of [ANN, BEN]) {
    await fx.datatables.admin.addMembership(WS, email, 'group', 'emea');
  }
  const last = await fx.datatables.admin.addMembership(WS, 'zz@example.com', 'group', 'x');
  await fx.settle(last.generation);
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      patients: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer' });
          const pid = (await db.query('select pg_backend_pid() as pid')).rows[0]!['pid'];
          lastPid = Number(pid);
          const tried = await attempt(db).then(
            (value) => ({ ok: value }),
            (err: { code?: string; message?: string }) => ({ refused: err.code ?? err.message }),
          );
          return { patients: await patients(db), tried };
        },
      },
      by_role: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { role: fx.EMEA });
          return (await db.query('select viewer_cache.viewer_email() as e')).rows;
        },
      },
    },
  });
});

afterAll(async () => {
  await fx?.close();
});

async function asViewer(viewer: string | null, tried: Attempt = async () => null) {
  attempt = tried;
  const result = await runFor(executor, 'patients', app(viewer));
  return result.value as { patients: string[]; tried: { ok?: unknown; refused?: string } };
}

describe('the viewer inside Postgres', () => {
  it('two viewers with the same role see only their own rows', async () => {
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('reading the identity without one is refused with a code, never NULL', async () => {
    await expect(runFor(executor, 'patients', app(null))).rejects.toMatchObject({
      code: 'E_NO_VIEWER',
    });
    // A named-role connection carries no identity: the policy read raises, rows are not empty.
    await expect(
      runFor(executor, 'by_role', { kind: 'run', caller: { email: PUBLISHER } }),
    ).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
    const admin = await fx.datatables.admin.setTenants(WS, fx.EMEA, [
      'group:emea',
      `user:${PUBLISHER}`,
    ]);
    await fx.settle(admin.generation);
    await expect(
      runFor(executor, 'by_role', { kind: 'run', caller: { email: PUBLISHER } }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
  });

  const forgeries: [string, Attempt][] = [
    [
      'set_config of a look-alike setting',
      (db) => db.query(`select set_config('viewer_cache.email', '${BEN}', false)`),
    ],
    [
      'writing the binding table',
      (db) => db.query(`update viewer_cache.lease_identity set email = '${BEN}'`),
    ],
    [
      'inserting a binding',
      (db) =>
        db.query(
          `insert into viewer_cache.lease_identity values (pg_backend_pid(), now(), '${BEN}', '{}')`,
        ),
    ],
    ['reading the binding table', (db) => db.query('select * from viewer_cache.lease_identity')],
    [
      'replacing the function',
      (db) =>
        db.query(
          `create or replace function viewer_cache.viewer_email() returns text language sql as $$ select '${BEN}' $$`,
        ),
    ],
    [
      'a function of its own earlier on the search_path',
      (db) =>
        db.query(
          `create function pg_temp.viewer_email() returns text language sql as $$ select '${BEN}' $$`,
        ),
    ],
    ['SET ROLE to its role', (db) => db.query(`set role ${pg.escapeIdentifier(fx.EMEA)}`)],
    ['RESET ROLE', (db) => db.query('reset role')],
    ['DISCARD ALL', (db) => db.query('discard all')],
    ['NOTIFY', (db) => db.query(`notify viewer_cache_catalog, '99999999'`)],
  ];
  for (const [name, tried] of forgeries) {
    it(`${name}: the identity stays the viewer's own`, async () => {
      const result = await asViewer(ANN, tried);
      expect(result.patients).toEqual(['p1', 'p2']);
      // Afterwards, the pooled connection carries nothing into the next job.
      expect((await asViewer(BEN)).patients).toEqual(['p3']);
    });
  }

  it("a second connection of its own, with the login's password, has no identity", async () => {
    const passwords = await roleLoginPasswords(fx.sql);
    const own = new pg.Client(loginConfig(fx.db.name, fx.EMEA, passwords.get(fx.EMEA)!));
    own.on('error', () => {});
    await own.connect();
    try {
      await asViewer(ANN);
      await expect(own.query('select viewer_cache.viewer_email()')).rejects.toMatchObject({
        code: 'VC401',
      });
      expect(
        await own.query('select count(*)::int as n from patients').catch(() => null),
      ).toBeNull();
    } finally {
      await own.end();
    }
  });

  it('the binding is gone once the connection is back in its pool', async () => {
    await asViewer(ANN);
    const pid = lastPid;
    const deadline = performance.now() + 5_000;
    for (;;) {
      const { rows } = await fx.sql.query(
        'select count(*)::int as n from viewer_cache.lease_identity where pid = $1',
        [pid],
      );
      if (rows[0]!['n'] === 0) break;
      if (performance.now() > deadline) throw new Error('binding still there after release');
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  });

  it('the privileged binding connections dying costs nothing: the next run binds on a new one', async () => {
    await asViewer(ANN);
    const { rowCount } = await fx.sql.query(
      `select pg_terminate_backend(pid) from pg_stat_activity
        where application_name = 'viewer-cache-identity' and datname = $1`,
      [fx.db.name],
    );
    expect(rowCount).toBeGreaterThan(0);
    // pg-pool drops a dead idle client; a run meanwhile would get E_CONNECT_FAILED, never rows
    // without its identity (the policy raises). The next runs bind on fresh connections.
    await waitUntil('a run binds again', async () =>
      asViewer(ANN).then(
        (r) => r.patients.join() === 'p1,p2',
        (err: { code?: string }) => {
          if (err.code !== 'E_CONNECT_FAILED') throw err;
          return false;
        },
      ),
    );
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('installing twice changes nothing (idempotent), and attributes not given are refused', async () => {
    await fx.datatables.admin.createDatatable(WS, 'main', { database: fx.db.name });
    const result = await asViewer(ANN, (db) =>
      db.query("select viewer_cache.viewer_attribute('customer_id')"),
    );
    expect(result.tried.refused).toBe('E_NO_VIEWER_ATTRIBUTE');
  });
});
