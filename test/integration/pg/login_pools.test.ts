import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExecutor, type Executor } from '../../../src/index.js';
import { countdown, deferred } from '../../helpers/deferred.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor } from '../../helpers/orders_db.js';

// SPEC invariants 6 and 12: inside a runnable `SET ROLE` can only narrow and `RESET ROLE` comes
// back to the login; a pooled connection is reset before the next job (or closed when it cannot
// be); two logins never share a connection. One connection per login (`pools.size: 1`) makes
// "the next job on the same connection" observable through `pg_backend_pid()`.

interface Probe {
  pid: number;
  user: string;
  session: string;
  workMem: string;
  temps: number;
  prepared: number;
  advisory: number;
  inTransaction: boolean;
  ids: number[];
}

const PROBE = `
  select pg_backend_pid() as pid, current_user::text as "user", session_user::text as "session",
         current_setting('work_mem') as "workMem",
         (select count(*)::int from pg_class where relnamespace = pg_my_temp_schema()) as temps,
         (select count(*)::int from pg_prepared_statements) as prepared,
         (select count(*)::int from pg_locks
           where locktype = 'advisory' and pid = pg_backend_pid()) as advisory,
         (now() <> statement_timestamp()) as "inTransaction",
         (select coalesce(array_agg(id order by id), '{}') from orders) as ids`;

let fx: OrdersDb;
let executor: Executor;
/** Backend pid of every connection a `script` job was lent, in order. */
const lent: number[] = [];
let held: { arrive(): void; gate: Promise<void> } = { arrive() {}, gate: Promise.resolve() };

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';

beforeAll(async () => {
  fx = await ordersDb({ pools: { size: 1 } });
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      // Runs `script` on the viewer's connection; 'probe' entries report the session's state.
      script: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          lent.push(Number((await client.query('select pg_backend_pid() as p')).rows[0]!['p']));
          const probes: Probe[] = [];
          for (const statement of args['script'] as string[]) {
            if (statement === 'probe') {
              probes.push((await client.query<Probe>(PROBE)).rows[0]!);
            } else if (statement.startsWith('send:')) {
              // Sent and not awaited: the job may end before its answer is in.
              client.query(statement.slice('send:'.length)).catch(() => {});
            } else {
              await client.query(statement);
            }
          }
          return probes;
        },
      },
      // Sends `text` as its first statement (the viewer's binding goes in front of it) and
      // returns without waiting for it.
      sendFirst: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          client.query(args['text'] as string).catch(() => {});
          return null;
        },
      },
      // Holds its connection until the test opens the gate.
      held: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          held.arrive();
          await held.gate;
          return (await client.query<Probe>(PROBE)).rows[0]!;
        },
      },
    },
  });
});

afterAll(async () => {
  await fx?.close();
});

async function script(viewer: string, statements: string[]): Promise<Probe[]> {
  return (await runFor(executor, 'script', app(viewer), { args: { script: statements } }))
    .value as Probe[];
}

const ident = (name: string) => pg.escapeIdentifier(name);

describe('SET ROLE inside a runnable only narrows', () => {
  it('carol (set login) narrows to EMEA and sees only EMEA rows; RESET ROLE comes back', async () => {
    const [start, narrowed, reset] = await script(CAROL, [
      'probe',
      `set role ${ident(fx.EMEA)}`,
      'probe',
      'reset role',
      'probe',
    ]);
    expect(start!.user).toMatch(/^wm_set_[0-9a-f]{32}$/);
    expect(start!.ids).toEqual([1, 2, 3]);
    expect(narrowed).toMatchObject({ user: fx.EMEA, session: start!.user, ids: ROWS['emea'] });
    expect(reset).toMatchObject({ user: start!.user, session: start!.user, ids: [1, 2, 3] });
  });

  for (const [what, statement] of [
    ['a role she does not hold', (fx: OrdersDb) => `set role ${ident(fx.APAC)}`],
    ['the superuser', () => 'set role postgres'],
    ['another session user', (fx: OrdersDb) => `set session authorization ${ident(fx.EMEA)}`],
  ] as const) {
    it(`carol cannot widen: SET to ${what} fails`, async () => {
      const err = (await script(CAROL, [statement(fx)]).then(
        () => new Error('not refused'),
        (e: unknown) => e,
      )) as Error & { code?: string; cause?: Error };
      // A statement Postgres refuses: E_QUERY_FAILED with its SQLSTATE (was E_EXECUTOR_FAILED).
      expect(err).toMatchObject({ code: 'E_QUERY_FAILED', sqlstate: '42501', status: 403 });
      expect(err.cause?.message).toMatch(/permission denied/);
    });
  }

  it('a one-role login (alice) cannot switch to another role either', async () => {
    await expect(script(ALICE, [`set role ${ident(fx.AMER)}`])).rejects.toMatchObject({
      code: 'E_QUERY_FAILED',
      sqlstate: '42501',
    });
    const [after] = await script(ALICE, ['probe']);
    expect(after).toMatchObject({ user: fx.EMEA, ids: ROWS['emea'] });
  });
});

describe('the next job on the same pooled connection is unaffected', () => {
  it('by SET ROLE, a GUC, a temp table, a prepared statement and an advisory lock', async () => {
    const [baseline] = await script(CAROL, ['probe']);
    const [dirty] = await script(CAROL, [
      `set role ${ident(fx.EMEA)}`,
      `set work_mem = '7MB'`,
      'create temp table leak (x int)',
      'prepare leaky as select 1',
      'select pg_advisory_lock(4242)',
      'probe',
    ]);
    // The leftovers were really there at the end of the first job…
    expect(dirty).toMatchObject({
      pid: baseline!.pid,
      user: fx.EMEA,
      workMem: '7MB',
      temps: 1,
      prepared: 1,
      advisory: 1,
      ids: ROWS['emea'],
    });
    const [next] = await script(CAROL, ['probe']);
    // …and the next job got the same connection, clean.
    expect(next).toEqual({ ...baseline, inTransaction: false });
    expect(next!.pid).toBe(baseline!.pid);
    expect(next!.user).toBe(baseline!.user);
    expect(next!.workMem).not.toBe('7MB');
    expect(next!.ids).toEqual([1, 2, 3]);
  });

  it('a transaction left open: that connection is closed instead of reused', async () => {
    const [before] = await script(CAROL, ['probe']);
    const [open] = await script(CAROL, ['begin', `set local role ${ident(fx.EMEA)}`, 'probe']);
    expect(open).toMatchObject({ pid: before!.pid, user: fx.EMEA, inTransaction: true });
    const [next] = await script(CAROL, ['probe']);
    expect(next!.pid).not.toBe(before!.pid);
    expect(next).toMatchObject({ user: before!.user, inTransaction: false, ids: [1, 2, 3] });
  });

  it('a transaction opened by a statement the job did not wait for: closed instead of reused', async () => {
    // The job returns before the server has answered its BEGIN, so the connection still looks
    // idle at release: the reset then ran inside that transaction, and the connection went back
    // to the pool mid-transaction. The next job ran in it, and its ROLLBACK undid the reset
    // (RESET ALL, SET SESSION AUTHORIZATION DEFAULT, DISCARD TEMP are transactional): the
    // previous job's SET ROLE was back.
    const [before] = await script(CAROL, ['probe']);
    await script(CAROL, [`set role ${ident(fx.EMEA)}`, 'send:begin']);
    const [next, afterRollback] = await script(CAROL, ['probe', 'rollback', 'probe']);
    expect(next).toMatchObject({ user: before!.user, inTransaction: false, ids: [1, 2, 3] });
    expect(afterRollback).toMatchObject({ user: before!.user, ids: [1, 2, 3] });
  });

  it('a first statement the job did not wait for, sent again without the binding in front: never after the reset', async () => {
    // Several statements in one text do not parse as one prepared statement, so the lease binds
    // on its own and sends the text again. The job had ended meanwhile: that text ran after the
    // reset, on a connection already back in the pool, and the next job ran under its SET ROLE.
    const [before] = await script(CAROL, ['probe']);
    await runFor(executor, 'sendFirst', app(CAROL), {
      args: { text: `set role ${ident(fx.EMEA)}; select 1` },
    });
    const [next] = await script(CAROL, ['probe']);
    expect(next).toMatchObject({ user: before!.user, inTransaction: false, ids: [1, 2, 3] });
  });

  it('a failed (aborted) transaction: that connection is closed instead of reused', async () => {
    const [before] = await script(CAROL, ['probe']);
    const used = lent.length;
    await expect(
      script(CAROL, ['begin', `set local role ${ident(fx.EMEA)}`, 'select 1/0']),
    ).rejects.toMatchObject({ code: 'E_INVALID_DATA' }); // SQLSTATE 22012: a data error, 400
    expect(lent[used]).toBe(before!.pid);
    const [next] = await script(CAROL, ['probe']);
    expect(next!.pid).not.toBe(before!.pid);
    expect(next).toMatchObject({ user: before!.user, inTransaction: false, ids: [1, 2, 3] });
  });

  it('a data error never quotes the value it refused (it may be an email or an arg)', async () => {
    const err = await script(CAROL, ["select 'carol.secret@example.com'::int"]).catch((e) => e);
    expect(err).toMatchObject({ code: 'E_INVALID_DATA', status: 400 });
    expect((err as Error).message).toContain('22P02');
    expect((err as Error).message).not.toContain('carol.secret');
  });
});

describe('more logins at once than pools.max', () => {
  it('every job still gets a connection, and every login works again afterwards', async () => {
    const narrow = createExecutor({
      datatables: await fx.open({ migrate: false, pools: { size: 1, max: 1 } }),
      runnables: {
        held: {
          fn: async (_args, ctx) => {
            const client = await ctx.datatable('main', { as: 'viewer' });
            held.arrive();
            await held.gate;
            return (await client.query<Probe>(PROBE)).rows[0]!;
          },
        },
      },
    });
    const allIn = countdown(3);
    const gate = deferred();
    held = { arrive: () => allIn.arrive(), gate: gate.promise };
    const runs = [ALICE, BOB, CAROL].map((viewer) => runFor(narrow, 'held', app(viewer)));
    // Either all three hold a connection at once, or one of them fails: never a hang.
    const oneFailed = new Promise<void>((resolve) => {
      for (const run of runs) run.catch(() => resolve());
    });
    await Promise.race([allIn.done, oneFailed]);
    gate.resolve();
    const results = await Promise.allSettled(runs);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
    const probes = results.map((r) => (r as PromiseFulfilledResult<{ value: Probe }>).value.value);
    expect(probes.map((p) => p.ids)).toEqual([ROWS['emea'], ROWS['amer'], [1, 2, 3]]);
    // Afterwards, one at a time, each login again.
    held = { arrive() {}, gate: Promise.resolve() };
    for (const viewer of [ALICE, BOB, CAROL, ALICE]) {
      await expect(runFor(narrow, 'held', app(viewer))).resolves.toBeDefined();
    }
  });
});

describe('the reset keeps what the pool configured', () => {
  it('a runnable that clears statement_timeout: the next job has the configured one again', async () => {
    const limited = createExecutor({
      datatables: await fx.open({ migrate: false, pools: { size: 1, statementTimeout: '2s' } }),
      runnables: {
        timeout: {
          fn: async (args, ctx) => {
            const client = await ctx.datatable('main', { as: 'viewer' });
            for (const statement of args['script'] as string[]) await client.query(statement);
            const { rows } = await client.query(
              `select pg_backend_pid() as pid, current_setting('statement_timeout') as t`,
            );
            return rows[0];
          },
        },
      },
    });
    const run = async (script: string[]) =>
      (await runFor(limited, 'timeout', app(CAROL), { args: { script } })).value as {
        pid: number;
        t: string;
      };
    const first = await run(['set statement_timeout = 0']);
    expect(first.t).toBe('0');
    const next = await run([]);
    expect(next).toEqual({ pid: first.pid, t: '2s' });
  });
});

describe('logins never share a connection', () => {
  it('alice, carol and bob each get their own login and backend', async () => {
    const [alice] = await script(ALICE, ['probe']);
    const [carol] = await script(CAROL, ['probe']);
    const [bob] = await script(BOB, ['probe']);
    const [aliceAgain] = await script(ALICE, ['probe']);
    expect(alice).toMatchObject({ user: fx.EMEA, session: fx.EMEA, ids: ROWS['emea'] });
    expect(bob).toMatchObject({ user: fx.AMER, session: fx.AMER, ids: ROWS['amer'] });
    expect(carol!.session).toMatch(/^wm_set_/);
    expect(new Set([alice!.pid, carol!.pid, bob!.pid]).size).toBe(3);
    // alice's pool kept her connection; nobody else was lent it in between.
    expect(aliceAgain!.pid).toBe(alice!.pid);
  });

  it('concurrent jobs of two logins hold two connections at once', async () => {
    const bothIn = countdown(2);
    const gate = deferred();
    held = { arrive: () => bothIn.arrive(), gate: gate.promise };
    const alice = runFor(executor, 'held', app(ALICE));
    const carol = runFor(executor, 'held', app(CAROL));
    await bothIn.done;
    gate.resolve();
    const [a, c] = (await Promise.all([alice, carol])).map((r) => r.value as Probe);
    expect(a!.pid).not.toBe(c!.pid);
    expect(a).toMatchObject({ session: fx.EMEA, ids: ROWS['emea'] });
    expect(c!.session).toMatch(/^wm_set_/);
    expect(c!.ids).toEqual([1, 2, 3]);
  });
});
