import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AGENT_PROTOCOL_VERSION,
  createExecutor,
  DATATABLE_VIEWER_ROLE,
  type DatatableConnector,
  type Executor,
  type Job,
  ProxyTransactions,
  type RawProxyTransactionLimits,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, WS } from '../../helpers/orders_db.js';
import { asAdmin } from '../../helpers/pg.js';
import { waitUntil } from '../../helpers/wait.js';

// Issue 33, item 7: transactions through the query proxy (src/proxy/proxy_transactions.ts) on a
// real data table. BEGIN opens a transaction bound to the job and an unguessable id; the
// statements inside pass the same allowlist; COMMIT persists them all, ROLLBACK none; and
// whatever else ends it — a bound, the job, the server — rolls it back and gives the lease
// back clean (pg_stat_activity shows no session left in a transaction).

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';

let fx: OrdersDb;
let executor: Executor;
const running = new Map<string, Job>();
const jobs = { jobOfToken: (token: string) => running.get(token) ?? null };
let leases = 0;
let connector: DatatableConnector;
const made: ProxyTransactions[] = [];

function start(viewer: string, token: string): Job {
  const job = executor.createJob({
    workspace: WS,
    path: 'noop',
    runAs: PUBLISHER,
    origin: app(viewer),
  });
  running.set(token, job);
  return job;
}

function proxy(transactions?: RawProxyTransactionLimits): ProxyTransactions {
  const made_ = new ProxyTransactions({ connector, ...(transactions ? { transactions } : {}) });
  made.push(made_);
  return made_;
}

/** One statement as an agent that keeps transactions sends it (`tx` null: none open). */
function ask(
  p: ProxyTransactions,
  token: string,
  tx: string | null | undefined,
  sql: string,
  params: unknown[] = [],
) {
  return p.run(
    {
      protocol: AGENT_PROTOCOL_VERSION,
      jobToken: token,
      reference: { datatable: 'main', role: DATATABLE_VIEWER_ROLE },
      sql,
      params,
      ...(tx === undefined ? {} : { transaction: tx }),
    },
    jobs,
  );
}

async function begin(p: ProxyTransactions, token: string, sql = 'begin'): Promise<string> {
  const opened = await ask(p, token, null, sql);
  expect(opened.transaction).toMatch(/^vcx_[A-Za-z0-9_-]{43}$/);
  expect(JSON.parse(opened.json)).toEqual({
    rows: [],
    rowCount: null,
    transaction: opened.transaction,
  });
  return opened.transaction!;
}

/** Notes written, as the superuser sees them (committed only). */
const notes = async () =>
  (await fx.sql.query<{ id: number }>('select id from tx_notes order by id')).rows.map((r) => r.id);
/** Sessions of the data table's database sitting in a transaction. */
const inTransaction = async () =>
  Number(
    (
      await fx.sql.query<{ n: string }>(
        "select count(*) as n from pg_stat_activity where datname = current_database() and state like 'idle in transaction%'",
      )
    ).rows[0]!.n,
  );
const clean = () =>
  waitUntil(
    'no session of the data table is in a transaction',
    async () => (await inTransaction()) === 0,
  );

beforeAll(async () => {
  fx = await ordersDb();
  executor = createExecutor({ runnables: { noop: { fn: async () => null } } });
  connector = {
    connect: (job, ref) => {
      leases++;
      return fx.datatables.connect(job, ref);
    },
  };
  await asAdmin(fx.db.name, async (c) => {
    await c.query('create table tx_notes (id int primary key, who text)');
    await c.query(`grant select, insert, delete on tx_notes to ${fx.EMEA}, ${fx.AMER}`);
  });
});
afterAll(async () => {
  await Promise.all(made.map((p) => p.close()));
  await fx?.close();
});

describe('transactions through the query proxy', () => {
  it('COMMIT persists every statement of the transaction at once, as the recorded viewer', async () => {
    const p = proxy();
    start(ALICE, 'tok-commit');
    const before = leases;
    const tx = await begin(p, 'tok-commit');
    await ask(
      p,
      'tok-commit',
      tx,
      'insert into tx_notes values ($1, viewer_cache.viewer_email())',
      [1],
    );
    // Not visible outside before COMMIT; visible inside.
    expect(await notes()).toEqual([]);
    expect(await inTransaction()).toBe(1);
    await ask(
      p,
      'tok-commit',
      tx,
      'insert into tx_notes values ($1, viewer_cache.viewer_email())',
      [2],
    );
    const inside = await ask(p, 'tok-commit', tx, 'select count(*)::int as n from tx_notes');
    expect(inside.rows).toEqual([{ n: 2 }]);
    expect(await notes()).toEqual([]);
    const done = await ask(p, 'tok-commit', tx, 'commit');
    expect(done.transaction).toBeNull();
    expect(JSON.parse(done.json)).toMatchObject({ transaction: null });
    expect(await notes()).toEqual([1, 2]);
    const { rows } = await fx.sql.query('select distinct who from tx_notes where id in (1, 2)');
    expect(rows).toEqual([{ who: ALICE }]);
    // One lease for the whole transaction, back in the pool, clean.
    expect(leases - before).toBe(1);
    expect(p.open).toBe(0);
    await clean();
    // Its id is spent.
    await expect(ask(p, 'tok-commit', tx, 'select 1')).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
      status: 404,
    });
    // BEGIN's own options are Postgres's: a read-only snapshot refuses writes.
    const ro = await begin(
      p,
      'tok-commit',
      'begin transaction isolation level repeatable read read only',
    );
    await expect(
      ask(p, 'tok-commit', ro, 'insert into tx_notes values (3, null)'),
    ).rejects.toMatchObject({
      code: '25006',
    });
    await ask(p, 'tok-commit', ro, 'rollback');
  });

  it('ROLLBACK persists none of it; a failed statement aborts the transaction as Postgres does', async () => {
    const p = proxy();
    start(ALICE, 'tok-rollback');
    const tx = await begin(p, 'tok-rollback');
    await ask(p, 'tok-rollback', tx, 'insert into tx_notes values (10, null)');
    await ask(p, 'tok-rollback', tx, 'insert into tx_notes values (11, null)');
    expect((await ask(p, 'tok-rollback', tx, 'rollback')).transaction).toBeNull();
    expect(await notes()).not.toContain(10);

    const failing = await begin(p, 'tok-rollback');
    await ask(p, 'tok-rollback', failing, 'insert into tx_notes values (12, null)');
    // A duplicate key: Postgres refuses it, and every statement after it until ROLLBACK.
    await expect(
      ask(p, 'tok-rollback', failing, 'insert into tx_notes values (12, null)'),
    ).rejects.toMatchObject({
      code: '23505',
    });
    await expect(ask(p, 'tok-rollback', failing, 'select 1')).rejects.toMatchObject({
      code: '25P02',
    });
    // ROLLBACK TO SAVEPOINT and friends run inside.
    await ask(p, 'tok-rollback', failing, 'rollback');
    expect(await notes()).not.toContain(12);
    const saving = await begin(p, 'tok-rollback');
    await ask(p, 'tok-rollback', saving, 'insert into tx_notes values (13, null)');
    await ask(p, 'tok-rollback', saving, 'savepoint s');
    await expect(
      ask(p, 'tok-rollback', saving, 'insert into tx_notes values (13, null)'),
    ).rejects.toMatchObject({
      code: '23505',
    });
    await ask(p, 'tok-rollback', saving, 'rollback to savepoint s');
    await ask(p, 'tok-rollback', saving, 'commit');
    expect(await notes()).toContain(13);
    // COMMIT or ROLLBACK with none open: Postgres's warning, nothing leased; SAVEPOINT: 25P01.
    const before = leases;
    expect((await ask(p, 'tok-rollback', null, 'commit')).rows).toEqual([]);
    await expect(ask(p, 'tok-rollback', null, 'savepoint s')).rejects.toMatchObject({
      code: '25P01',
    });
    expect(leases).toBe(before);
    await clean();
  });

  it('refuses role changes and other kinds inside, before Postgres, leaving the transaction as it was', async () => {
    const p = proxy();
    start(ALICE, 'tok-refuse');
    const tx = await begin(p, 'tok-refuse');
    await ask(p, 'tok-refuse', tx, 'insert into tx_notes values (20, null)');
    for (const sql of [
      `set local role ${fx.AMER}`,
      `SET "role" TO '${fx.AMER}'`,
      'reset role',
      'set session authorization default',
      "select set_config('role', 'postgres', true)",
      'reset all',
      'do $$ begin reset role; end $$',
      "prepare transaction 'keep-me'",
      "commit prepared 'keep-me'",
      'commit and chain',
      'set local statement_timeout = 0',
      'select 1; commit',
    ]) {
      await expect(ask(p, 'tok-refuse', tx, sql), sql).rejects.toMatchObject({
        code: 'E_STATEMENT_REFUSED',
      });
    }
    // Nothing reached Postgres: the transaction is not aborted, and still Alice's.
    const who = await ask(
      p,
      'tok-refuse',
      tx,
      'select current_user as u, viewer_cache.viewer_email() as e',
    );
    expect(who.rows).toEqual([{ u: expect.not.stringContaining('postgres'), e: ALICE }]);
    await ask(p, 'tok-refuse', tx, 'commit');
    expect(await notes()).toContain(20);
    // A caller that does not keep transactions (no `transaction` field) is refused BEGIN as before.
    await expect(ask(p, 'tok-refuse', undefined, 'begin')).rejects.toMatchObject({
      code: 'E_STATEMENT_REFUSED',
    });
    expect(p.open).toBe(0);
  });

  it("answers only the job that opened it: another job's token, or its own once ended, gets nothing", async () => {
    const p = proxy();
    start(ALICE, 'tok-a');
    const bob = start(BOB, 'tok-b');
    const tx = await begin(p, 'tok-a');
    await ask(p, 'tok-a', tx, 'insert into tx_notes values (30, null)');
    const before = leases;
    await expect(
      ask(p, 'tok-b', tx, 'insert into tx_notes values (31, null)'),
    ).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
    });
    await expect(ask(p, 'tok-b', tx, 'commit')).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
    });
    await expect(ask(p, 'tok-a', `vcx_${'A'.repeat(43)}`, 'select 1')).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
    });
    expect(leases).toBe(before);
    // Bob's own transaction is his.
    const bobs = await begin(p, 'tok-b');
    await expect(ask(p, 'tok-a', bobs, 'select 1')).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
    });
    await ask(p, 'tok-b', bobs, 'rollback');
    // Alice's job ends (its token dies; the server tells the proxy): rolled back, lease back.
    const alice = running.get('tok-a')!;
    running.delete('tok-a');
    await expect(ask(p, 'tok-a', tx, 'commit')).rejects.toMatchObject({
      code: 'E_JOB_TOKEN_INVALID',
    });
    await p.endJob(alice);
    expect(p.open).toBe(0);
    await clean();
    expect(await notes()).not.toContain(30);
    // Nothing of Bob's was touched by it.
    void bob;
  });

  it('rolls back and frees the connection when it is idle too long, open too long, or the server stops', async () => {
    const p = proxy({ idleTimeout: 300, maxDuration: 60_000 });
    start(ALICE, 'tok-idle');
    const tx = await begin(p, 'tok-idle');
    await ask(p, 'tok-idle', tx, 'insert into tx_notes values (40, null)');
    expect(await inTransaction()).toBe(1);
    // The agent went quiet (died, or stalls): the idle bound rolls it back.
    await waitUntil('the idle bound rolled it back', () => p.open === 0);
    await clean();
    expect(await notes()).not.toContain(40);
    // As Postgres answers an aborted transaction: refused until the runnable's ROLLBACK.
    await expect(ask(p, 'tok-idle', tx, 'select 1')).rejects.toMatchObject({
      code: 'E_TRANSACTION_ENDED',
      status: 409,
      message: expect.stringContaining('300 ms'),
    });
    await expect(ask(p, 'tok-idle', tx, 'commit')).rejects.toMatchObject({
      code: 'E_TRANSACTION_ENDED',
    });
    expect((await ask(p, 'tok-idle', tx, 'rollback')).transaction).toBeNull();
    await expect(ask(p, 'tok-idle', tx, 'select 1')).rejects.toMatchObject({
      code: 'E_TRANSACTION_UNKNOWN',
    });

    // Busy but too long: the duration bound, however often it speaks.
    const long = proxy({ idleTimeout: 60_000, maxDuration: 400 });
    const busy = await begin(long, 'tok-idle');
    await ask(long, 'tok-idle', busy, 'insert into tx_notes values (41, null)');
    await waitUntil('the duration bound rolled it back', async () => {
      try {
        await ask(long, 'tok-idle', busy, 'select 1');
        return false;
      } catch (err) {
        expect(err).toMatchObject({
          code: 'E_TRANSACTION_ENDED',
          message: expect.stringContaining('400 ms'),
        });
        return true;
      }
    });
    await clean();
    expect(await notes()).not.toContain(41);

    // The server stops with one open: rolled back, lease back; no BEGIN after that.
    const stopping = proxy();
    const open = await begin(stopping, 'tok-idle');
    await ask(stopping, 'tok-idle', open, 'insert into tx_notes values (42, null)');
    await stopping.close();
    expect(stopping.open).toBe(0);
    await clean();
    expect(await notes()).not.toContain(42);
    await expect(ask(stopping, 'tok-idle', null, 'begin')).rejects.toMatchObject({
      code: 'E_TRANSACTION_ENDED',
    });
  });

  it('bounds the statements of one transaction and the transactions of one job', async () => {
    const p = proxy({ maxStatements: 3, maxPerJob: 2 });
    start(ALICE, 'tok-count');
    const tx = await begin(p, 'tok-count');
    for (const id of [50, 51, 52])
      await ask(p, 'tok-count', tx, 'insert into tx_notes values ($1, null)', [id]);
    await expect(
      ask(p, 'tok-count', tx, 'insert into tx_notes values (53, null)'),
    ).rejects.toMatchObject({
      code: 'E_TRANSACTION_LIMIT',
      message: expect.stringContaining('3 statements'),
    });
    expect(p.open).toBe(0);
    await expect(ask(p, 'tok-count', tx, 'commit')).rejects.toMatchObject({
      code: 'E_TRANSACTION_ENDED',
    });
    await ask(p, 'tok-count', tx, 'rollback');
    await clean();
    expect((await notes()).filter((id) => id >= 50 && id < 60)).toEqual([]);

    const one = await begin(p, 'tok-count');
    const two = await begin(p, 'tok-count');
    await expect(ask(p, 'tok-count', null, 'begin')).rejects.toMatchObject({
      code: 'E_TRANSACTION_LIMIT',
    });
    await ask(p, 'tok-count', one, 'rollback');
    await ask(p, 'tok-count', two, 'rollback');
    expect(p.open).toBe(0);
  });
});
