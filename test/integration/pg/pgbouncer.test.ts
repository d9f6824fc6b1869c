import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createDatatables, createExecutor, type Executor } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, SECRET_KEY } from '../../helpers/orders_db.js';
import { type PgBouncer, startPgBouncer } from '../../helpers/pgbouncer.js';

// Issue 10 §5: login connections through PgBouncer in transaction mode. Nothing session-scoped
// is relied on there (the per-login lock and every repair run on the admin side); the viewer
// identity is bound inside each transaction there (viewer_identity_pooler.test.ts).

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';
const POOL_SIZE = 2;

let bouncer: PgBouncer;
let fx: OrdersDb;

const ids = (rows: Record<string, unknown>[]) => rows.map((row) => row['id'] as number);

function ordersExecutor(datatables: OrdersDb['datatables']): Executor {
  return createExecutor({
    datatables,
    runnables: {
      // A runnable that narrows its connection and never undoes it (SPEC invariant 12). Through a
      // transaction pooler its SET ROLE lasts one statement; it must not outlive that either.
      narrowing: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          await client.query(`set role ${args['role'] as string}`);
          return null;
        },
      },
      orders: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          // Two statements, each its own transaction: each may meet another backend.
          await client.query('select 1');
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
    },
  });
}

beforeAll(async () => {
  bouncer = await startPgBouncer(inject('pgAdminUrl'), { poolSize: POOL_SIZE });
  fx = await ordersDb({
    loginConnection: { host: bouncer.host, port: bouncer.port },
    transactionPooler: true,
    viewerIdentity: false,
  });
});

afterAll(async () => {
  await fx?.close();
  await bouncer?.close();
});

describe('login connections through PgBouncer (transaction mode)', () => {
  it('role logins and set logins (created at run time) connect and see their rows', async () => {
    const executor = ordersExecutor(fx.datatables);
    for (const [viewer, rows] of [
      [ALICE, ROWS['emea']],
      [BOB, ROWS['amer']],
      [CAROL, [1, 2, 3]], // a set login, created during this run, known to PgBouncer by auth_query
    ] as const) {
      expect((await runFor(executor, 'orders', app(viewer))).value).toEqual(rows);
    }
    // They went through PgBouncer: it holds a pool per (database, login).
    const pools = await bouncer.pools();
    expect(pools.some((p) => p.database === fx.db.name && p.user === fx.EMEA)).toBe(true);
    expect(pools.filter((p) => p.database === fx.db.name).length).toBeGreaterThanOrEqual(3);
  });

  it("a runnable's SET ROLE never reaches another run of the same login (SPEC invariant 12)", async () => {
    const executor = ordersExecutor(fx.datatables);
    const full = [1, 2, 3];
    expect((await runFor(executor, 'orders', app(CAROL))).value).toEqual(full);
    // Concurrent narrowing runs and ordinary ones: the ordinary ones meet every backend of the
    // login's pooler pool, right after a narrowing statement left it.
    const runs = [];
    for (let i = 0; i < POOL_SIZE * 8; i++) {
      runs.push(runFor(executor, 'narrowing', app(CAROL), { args: { role: fx.EMEA } }));
      runs.push(runFor(executor, 'orders', app(CAROL)).then((r) => r.value));
    }
    const values = await Promise.all(runs);
    for (let i = 1; i < values.length; i += 2) expect(values[i]).toEqual(full);
    for (let i = 0; i < POOL_SIZE * 4; i++) {
      expect((await runFor(executor, 'orders', app(CAROL))).value).toEqual(full);
    }
  });

  it('a role disabled then enabled again: the next run is refused, then works again', async () => {
    const executor = ordersExecutor(fx.datatables);
    const off = await fx.datatables.admin.disableRole('demo', fx.AMER);
    await fx.settle(off.generation);
    await expect(runFor(executor, 'orders', app(BOB))).rejects.toMatchObject({
      code: 'E_NO_ROLES',
    });
    const on = await fx.datatables.admin.enableRole('demo', fx.AMER);
    await fx.settle(on.generation);
    expect((await runFor(executor, 'orders', app(BOB))).value).toEqual(ROWS['amer']);
  });

  it('10 processes × 8 concurrent runs: the cluster sees at most the pooler pool per login', async () => {
    // pools.size 2 below: each process holds ≤ 2 client connections for the login.
    const footprint = async (throughPooler: boolean, count = 10, viewerIdentity = false) => {
      const processes = await Promise.all(
        Array.from({ length: count }, () =>
          fx.open({
            loginConnection: throughPooler
              ? { host: bouncer.host, port: bouncer.port }
              : inject('pgAdminUrl'),
            transactionPooler: throughPooler,
            viewerIdentity,
            // 2 per login pool: ten processes must fit embedded Postgres' 100 connections.
            pools: { size: 2, prepareAhead: false },
          }),
        ),
      );
      try {
        await Promise.all(
          processes.flatMap((datatables) => {
            const executor = ordersExecutor(datatables);
            return Array.from({ length: 8 }, () => runFor(executor, 'orders', app(ALICE)));
          }),
        );
        const clientSide = processes.reduce((sum, d) => sum + d.connections.open, 0);
        // The login's backends on the cluster now (idle pools keep theirs for idleTimeout),
        // less those PgBouncer keeps from earlier tests when measuring without it.
        const { rows } = await fx.sql.query<{ n: number }>(
          'select count(*)::int as n from pg_stat_activity where usename = $1 and datname = $2',
          [fx.EMEA, fx.db.name],
        );
        const pool = (await bouncer.pools()).find(
          (p) => p.database === fx.db.name && p.user === fx.EMEA,
        );
        const bouncerHeld = throughPooler
          ? 0
          : Number(pool?.sv_active ?? 0) + Number(pool?.sv_idle ?? 0);
        // The identity's own admin connections (installing, reading the key): not login-side.
        const identity = await fx.sql.query<{ n: number }>(
          `select count(*)::int as n from pg_stat_activity
            where application_name = 'viewer-cache-identity' and datname = $1`,
          [fx.db.name],
        );
        return { clientSide, server: rows[0]!.n - bouncerHeld, identityAdmin: identity.rows[0]!.n };
      } finally {
        await Promise.all(processes.map((d) => d.close()));
      }
    };
    const one = { direct: await footprint(false, 1), pooled: await footprint(true, 1) };
    const direct = await footprint(false);
    const pooled = await footprint(true);
    // Issue 24 §2: the same with the viewer identity on (bound per transaction through the
    // pooler): no connection of its own on the login side, so the same footprint.
    const withIdentity = {
      one: { direct: await footprint(false, 1, true), pooled: await footprint(true, 1, true) },
      direct: await footprint(false, 10, true),
      pooled: await footprint(true, 10, true),
    };
    for (const [name, f] of Object.entries({
      '1 process, identity off, direct': one.direct,
      '1 process, identity off, PgBouncer': one.pooled,
      '1 process, identity on, direct': withIdentity.one.direct,
      '1 process, identity on, PgBouncer': withIdentity.one.pooled,
      '10 processes, identity off, direct': direct,
      '10 processes, identity off, PgBouncer': pooled,
      '10 processes, identity on, direct': withIdentity.direct,
      '10 processes, identity on, PgBouncer': withIdentity.pooled,
    })) {
      console.log(
        `footprint row | ${name} × 8 concurrent runs | ${f.clientSide} client | ${f.server} server | ${f.identityAdmin} identity admin`,
      );
    }
    expect(withIdentity.one.direct.server).toBe(withIdentity.one.direct.clientSide);
    expect(withIdentity.one.pooled.server).toBeLessThanOrEqual(POOL_SIZE);
    expect(withIdentity.direct.server).toBe(withIdentity.direct.clientSide);
    expect(withIdentity.pooled.clientSide).toBeGreaterThan(POOL_SIZE);
    expect(withIdentity.pooled.server).toBeLessThanOrEqual(POOL_SIZE);
    expect(one.direct.server).toBe(one.direct.clientSide);
    expect(one.pooled.server).toBeLessThanOrEqual(POOL_SIZE);
    console.log(
      `footprint, 1 process × 8 concurrent runs of one login: direct ${one.direct.clientSide} client / ${one.direct.server} server connections; through PgBouncer ${one.pooled.clientSide} client / ${one.pooled.server} server`,
    );
    // Each process opened its own pool of client connections; directly, each is a backend;
    // through PgBouncer the cluster holds at most its pool for that (database, login).
    expect(direct.server).toBe(direct.clientSide);
    expect(pooled.clientSide).toBeGreaterThan(POOL_SIZE);
    expect(pooled.server).toBeLessThanOrEqual(POOL_SIZE);
    console.log(
      `footprint, 10 processes × 8 concurrent runs of one login: direct ${direct.clientSide} client / ${direct.server} server connections; through PgBouncer ${pooled.clientSide} client / ${pooled.server} server`,
    );
  });

  it('refuses a session statement timeout (the viewer identity is bound per transaction)', async () => {
    const base = {
      connection: inject('pgAdminUrl'),
      secretKey: SECRET_KEY,
      migrate: false,
      loginConnection: { host: bouncer.host, port: bouncer.port },
      transactionPooler: true,
    } as const;
    await expect(
      createDatatables({ ...base, viewerIdentity: false, pools: { statementTimeout: '5s' } }),
    ).rejects.toThrow(/statementTimeout/);
    // Issue 24 §2: viewerIdentity (on by default) starts through a transaction pooler.
    const started = await createDatatables({ ...base, connection: fx.db.url });
    await started.close();
  });
});

describe('a pooler that does not reset between transactions (issue 24 §3)', () => {
  it('is refused at start with E_POOLER_UNSAFE naming server_reset_query_always', async () => {
    const leaky = await startPgBouncer(inject('pgAdminUrl'), { poolSize: 1, resetAlways: false });
    try {
      const options = {
        connection: fx.db.url,
        secretKey: SECRET_KEY,
        migrate: false,
        loginConnection: { host: leaky.host, port: leaky.port },
        transactionPooler: true,
        viewerIdentity: false,
      } as const;
      const refused = createDatatables(options);
      await expect(refused).rejects.toMatchObject({ code: 'E_POOLER_UNSAFE' });
      await expect(refused).rejects.toThrow(/server_reset_query_always = 1/);
      // The same settings through the resetting pooler start.
      const started = await createDatatables({
        ...options,
        loginConnection: { host: bouncer.host, port: bouncer.port },
      });
      await started.close();
    } finally {
      await leaky.close();
    }
  });
});
