import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AGENT_PROTOCOL_VERSION,
  createExecutor,
  DATATABLE_VIEWER_ROLE,
  type DatatableConnector,
  type Executor,
  type Job,
  type ProxiedQuery,
  type RawQueryProxyLimits,
  runProxiedQuery,
  runProxiedRoleCheck,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, ROWS, WS } from '../../helpers/orders_db.js';
import { waitUntil } from '../../helpers/wait.js';

// The query proxy's core (src/proxy/query_proxy.ts) on a real data table: the viewer is the
// job's recorded one, the token lives only as long as the job, an old protocol is refused, and
// every statement is bounded.

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';

let fx: OrdersDb;
let executor: Executor;
/** The running jobs, by token: what a server's job tokens hold. */
const running = new Map<string, Job>();
let leases = 0;
let connector: DatatableConnector;

const jobs = { jobOfToken: (token: string) => running.get(token) ?? null };

function start(origin: Parameters<typeof app>[0] | { kind: 'schedule' }, token: string): Job {
  const job = executor.createJob({
    workspace: WS,
    path: 'noop',
    runAs: PUBLISHER,
    origin: typeof origin === 'object' && origin !== null ? origin : app(origin),
  });
  running.set(token, job);
  return job;
}

function ask(
  token: string,
  sql: string,
  more: Partial<ProxiedQuery> = {},
  limits?: RawQueryProxyLimits,
) {
  return runProxiedQuery(
    {
      protocol: AGENT_PROTOCOL_VERSION,
      jobToken: token,
      reference: { datatable: 'main', role: DATATABLE_VIEWER_ROLE },
      sql,
      ...more,
    },
    { jobs, connector, ...(limits ? { limits } : {}) },
  );
}

const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id']);

beforeAll(async () => {
  fx = await ordersDb();
  executor = createExecutor({ runnables: { noop: { fn: async () => null } } });
  connector = {
    connect: (job, ref) => {
      leases++;
      return fx.datatables.connect(job, ref);
    },
    viewerHolds: (job, datatable, role) => fx.datatables.viewerHolds!(job, datatable, role),
  };
});
afterAll(async () => {
  await fx?.close();
});

describe('runProxiedQuery', () => {
  it("answers each job's recorded viewer, whatever the request says", async () => {
    start(ALICE, 'tok-alice');
    start(BOB, 'tok-bob');
    const sql = 'select id from orders order by id';
    expect(ids((await ask('tok-alice', sql)).rows)).toEqual(ROWS['emea']);
    expect(ids((await ask('tok-bob', sql)).rows)).toEqual(ROWS['amer']);
    // The identity bound to the lease is the job's viewer.
    const { rows } = await ask('tok-bob', 'select viewer_cache.viewer_email() as e');
    expect(rows).toEqual([{ e: BOB }]);
    // The JSON a transport sends is the same answer.
    expect(JSON.parse((await ask('tok-alice', sql)).json)).toEqual({
      rows: ROWS['emea']!.map((id) => ({ id })),
      rowCount: ROWS['emea']!.length,
    });
  });

  it('a job with no viewer is refused the viewer, never given the default role', async () => {
    start({ kind: 'schedule' } as never, 'tok-schedule');
    await expect(ask('tok-schedule', 'select id from orders')).rejects.toMatchObject({
      code: 'E_NO_VIEWER',
    });
  });

  it('refuses a forged token, and a token once its job ended', async () => {
    start(ALICE, 'tok-ending');
    await ask('tok-ending', 'select 1');
    running.delete('tok-ending');
    const before = leases;
    await expect(ask('tok-ending', 'select 1')).rejects.toMatchObject({
      code: 'E_JOB_TOKEN_INVALID',
      status: 401,
    });
    await expect(ask('vcj_forged', 'select 1')).rejects.toMatchObject({
      code: 'E_JOB_TOKEN_INVALID',
    });
    await expect(ask('', 'select 1')).rejects.toMatchObject({ code: 'E_JOB_TOKEN_INVALID' });
    expect(leases).toBe(before);
  });

  it('refuses a caller without the protocol version before anything else', async () => {
    start(ALICE, 'tok-proto');
    const before = leases;
    for (const protocol of [undefined, 0, 2, '1', null]) {
      await expect(ask('tok-proto', 'select 1', { protocol })).rejects.toMatchObject({
        code: 'E_AGENT_PROTOCOL',
        status: 426,
      });
    }
    expect(leases).toBe(before);
  });

  it('refuses several statements, role changes in every spelling and other kinds before connecting', async () => {
    start(ALICE, 'tok-stmt');
    const before = leases;
    for (const sql of [
      'select 1; select 2',
      "select 1; set role 'x'",
      'set role none',
      'reset role',
      'set session authorization default',
      `SET "role" TO 'x'`,
      `RESET "role"`,
      `SET "session_authorization" TO 'postgres'`,
      "select pg_catalog.set_config('role', 'x', false)",
      'do $$ begin reset role; end $$',
      'execute p',
      '',
    ]) {
      await expect(ask('tok-stmt', sql)).rejects.toMatchObject({
        code: 'E_STATEMENT_REFUSED',
        status: 400,
      });
    }
    // Text the grammar cannot read: refused before connecting too, answered as Postgres would.
    await expect(ask('tok-stmt', "select 'open")).rejects.toMatchObject({
      code: '42601',
      severity: 'ERROR',
    });
    expect(leases).toBe(before);
  });

  it('Postgres reads the text as the check did, whatever the database sets standard_conforming_strings to', async () => {
    start(ALICE, 'tok-scs');
    // With standard_conforming_strings off, `'a\''` ends after `\'`, and what follows is a
    // second statement (and a comment); the parser, and now the server, read one string.
    const db = fx.db.name;
    await fx.sql.query(`alter database ${db} set standard_conforming_strings = off`);
    try {
      // Connections opened before the change keep the old default: open new ones.
      await fx.sql.query(
        'select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()',
        [db],
      );
      // The pool finds its terminated connections one lease at a time: ask until a new one answers.
      await waitUntil('a new connection defaults it off', async () => {
        // reset_val: the connection's default (the proxy sets the value itself on each lease).
        const shown = await ask(
          'tok-scs',
          "select reset_val from pg_settings where name = 'standard_conforming_strings'",
        ).catch(() => null);
        return shown?.rows[0]?.['reset_val'] === 'off';
      });
      const sql = "select 'a\\''; reset role; --' as v";
      const { rows } = await ask('tok-scs', sql);
      expect(rows).toEqual([{ v: "a\\'; reset role; --" }]);
    } finally {
      await fx.sql.query(`alter database ${db} reset standard_conforming_strings`);
    }
  });

  it('refuses a malformed reference (the grammar of ctx.datatable and datatable://)', async () => {
    start(ALICE, 'tok-ref');
    for (const reference of [
      { datatable: 'main?as=viewer', role: null },
      { datatable: 'Main', role: DATATABLE_VIEWER_ROLE },
      { datatable: 'main', role: 'admin' },
      { datatable: 'main', role: '@viewer:b,a' },
    ]) {
      await expect(ask('tok-ref', 'select 1', { reference })).rejects.toHaveProperty('status', 400);
    }
  });

  it('bounds rows, bytes and time, with coded errors', async () => {
    start(ALICE, 'tok-bounds');
    await expect(
      ask('tok-bounds', 'select generate_series(1, 5) as n', {}, { maxRows: 4 }),
    ).rejects.toMatchObject({ code: 'E_RESULT_TOO_LARGE', status: 413 });
    expect(
      (await ask('tok-bounds', 'select generate_series(1, 4) as n', {}, { maxRows: 4 })).rows,
    ).toHaveLength(4);
    await expect(
      ask('tok-bounds', "select repeat('x', 2000) as s", {}, { maxBytes: 1000 }),
    ).rejects.toMatchObject({ code: 'E_RESULT_TOO_LARGE' });
    const started = performance.now();
    await expect(
      ask('tok-bounds', 'select pg_sleep(10)', {}, { timeout: 300 }),
    ).rejects.toMatchObject({ code: 'E_QUERY_TIMEOUT', status: 504 });
    expect(performance.now() - started).toBeLessThan(5000);
    // The bound did not outlive its statement: the next lease has the server default again.
    const { rows } = await ask('tok-bounds', "select current_setting('statement_timeout') as t");
    expect(rows).toEqual([{ t: '30s' }]);
    const reset = await ask('tok-bounds', 'show statement_timeout', {}, { timeout: '5s' });
    expect(reset.rows).toEqual([{ statement_timeout: '5s' }]);
  });

  it("a copy is bounded by the bound it asks for, up to the copy maximum — not the statement's", async () => {
    start(ALICE, 'tok-copy');
    const series = (n: number) => `select generate_series(1, ${n})::text as n`;
    const small = { maxRows: 4, maxBytes: 1000, copyMaxRows: 6, copyMaxBytes: 40 };
    // Past the per-statement maxRows: refused as a statement, answered as a copy within its bound.
    await expect(ask('tok-copy', series(5), {}, small)).rejects.toMatchObject({
      code: 'E_RESULT_TOO_LARGE',
    });
    const within = await ask('tok-copy', series(5), { copy: { maxRows: 5, maxBytes: 100 } }, small);
    expect(within.rows).toHaveLength(5);
    // One row past the bound it asked for, or past the copy maximum whatever it asked for.
    for (const [n, copy] of [
      [6, { maxRows: 5, maxBytes: 100 }],
      [7, { maxRows: 1_000_000, maxBytes: 100 }],
    ] as const) {
      await expect(ask('tok-copy', series(n), { copy }, small)).rejects.toMatchObject({
        code: 'E_RESULT_TOO_LARGE',
        status: 413,
        message: expect.stringMatching(/copy/),
      });
    }
    expect(
      (await ask('tok-copy', series(6), { copy: { maxRows: 9, maxBytes: 9 } }, small)).rows,
    ).toHaveLength(6);
    // Bytes are the values' text (UTF-8), as DuckDB's bound counts them: within, past the bound
    // asked for, past the copy maximum.
    const text = (bytes: number) => `select repeat('é', ${bytes / 2}) as s`;
    expect(
      (await ask('tok-copy', text(40), { copy: { maxRows: 1, maxBytes: 40 } }, small)).rows,
    ).toHaveLength(1);
    for (const copy of [
      { maxRows: 1, maxBytes: 38 },
      { maxRows: 1, maxBytes: 1 << 30 },
    ]) {
      await expect(ask('tok-copy', text(42), { copy }, small)).rejects.toMatchObject({
        code: 'E_RESULT_TOO_LARGE',
      });
    }
    // A malformed bound is refused before any lease.
    for (const copy of [
      { maxRows: -1, maxBytes: 1 },
      { maxRows: 1 },
      { maxRows: 1.5, maxBytes: 1 },
    ])
      await expect(
        ask('tok-copy', series(1), { copy: copy as { maxRows: number; maxBytes: number } }),
      ).rejects.toMatchObject({ code: 'E_STATEMENT_REFUSED' });
  });

  it("ctx.hasRole through the proxy: the recorded viewer's roles, for a live token only", async () => {
    start(ALICE, 'tok-holds');
    const check = (role: string, token = 'tok-holds', protocol: unknown = AGENT_PROTOCOL_VERSION) =>
      runProxiedRoleCheck(
        { protocol, jobToken: token, datatable: 'main', role },
        { jobs, connector },
      );
    expect(await check(fx.EMEA)).toBe(true);
    expect(await check(fx.AMER)).toBe(false);
    await expect(check(fx.EMEA, 'tok-none')).rejects.toMatchObject({ code: 'E_JOB_TOKEN_INVALID' });
    await expect(check(fx.EMEA, 'tok-holds', null)).rejects.toMatchObject({
      code: 'E_AGENT_PROTOCOL',
    });
    await expect(check('admin')).rejects.toMatchObject({ code: 'E_INVALID_ROLE_NAME' });
  });

  it('parameters travel as parameters', async () => {
    start(ALICE, 'tok-params');
    const { rows } = await ask('tok-params', 'select id from orders where id = $1', {
      params: [3],
    });
    expect(ids(rows)).toEqual([3]);
  });
});
