import { createHash, randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
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
import { type PgBouncer, startPgBouncer } from '../../helpers/pgbouncer.js';
import { waitUntil } from '../../helpers/wait.js';

// Issue 24 §2, SPEC invariant 13 through PgBouncer in transaction mode: the viewer identity is
// bound inside each of a run's transactions (transaction-local settings, a MAC signed for that
// transaction on that backend), void outside it. One server connection per login here, so every
// run's transactions share one backend with every other run's: the hardest case for "keep".

const ANN = 'ann@example.com';
const BEN = 'ben@example.com';

type Db = Awaited<ReturnType<RunContext['datatable']>>;
type Attempt = (db: Db) => Promise<unknown>;

let bouncer: PgBouncer;
let fx: OrdersDb;
let executor: Executor;
let attempt: Attempt = async () => null;

const patients = async (db: Db) =>
  (await db.query('select name from patients order by name')).rows.map((row) => row['name']);
const whoAmI = (db: { query(text: string): Promise<{ rows: Record<string, unknown>[] }> }) =>
  db.query('select viewer_cache.viewer_email() as e').then(
    (r) => r.rows[0]!['e'] as string,
    (err: { code?: string }) => err.code ?? 'failed',
  );
const settingsOf = async (db: Db) =>
  (
    await db.query(
      `select current_setting('viewer_cache.viewer_email') as e,
              current_setting('viewer_cache.viewer_attributes') as a,
              current_setting('viewer_cache.viewer_mac') as m,
              pg_backend_pid() as pid`,
    )
  ).rows[0]! as { e: string; a: string; m: string; pid: number };
const setSettings = (
  db: { query(text: string, values?: unknown[]): Promise<unknown> },
  s: { e: string; a: string; m: string },
) =>
  db.query(
    `select set_config('viewer_cache.viewer_email', $1, false),
            set_config('viewer_cache.viewer_attributes', $2, false),
            set_config('viewer_cache.viewer_mac', $3, false)`,
    [s.e, s.a, s.m],
  );

beforeAll(async () => {
  bouncer = await startPgBouncer(inject('pgAdminUrl'), { poolSize: 1 });
  // viewerIdentity left at its default (true): refused at start before issue 24.
  fx = await ordersDb({
    loginConnection: { host: bouncer.host, port: bouncer.port },
    transactionPooler: true,
  });
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
          const tried = await attempt(db).then(
            (value) => ({ ok: value }),
            (err: { code?: string; message?: string }) => ({ refused: err.code ?? err.message }),
          );
          const seen = await patients(db).catch((err: { code?: string }) => ({
            refused: err.code,
          }));
          return { patients: seen, tried };
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
  await bouncer?.close();
});

async function asViewer(viewer: string | null, tried: Attempt = async () => null) {
  attempt = tried;
  const result = await runFor(executor, 'patients', app(viewer));
  return result.value as {
    patients: string[] | { refused: string };
    tried: { ok?: unknown; refused?: string };
  };
}

describe('the viewer inside Postgres, through PgBouncer in transaction mode', () => {
  it('starts with viewerIdentity on, and the login connections go through PgBouncer', async () => {
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    const pools = await bouncer.pools();
    expect(pools.some((p) => p.database === fx.db.name && p.user === fx.EMEA)).toBe(true);
  });

  it('two viewers sharing one login and one backend, concurrently, see only their own rows', async () => {
    const runs = [];
    for (let i = 0; i < 20; i++) {
      runs.push(asViewer(i % 2 === 0 ? ANN : BEN, (db) => db.query('select 1')));
    }
    const results = await Promise.all(runs);
    for (const [i, result] of results.entries()) {
      expect(result.patients).toEqual(i % 2 === 0 ? ['p1', 'p2'] : ['p3']);
    }
  });

  it('reading the identity without one is refused with a code, never NULL', async () => {
    await expect(runFor(executor, 'patients', app(null))).rejects.toMatchObject({
      code: 'E_NO_VIEWER',
    });
    const admin = await fx.datatables.admin.setTenants(WS, fx.EMEA, [
      'group:emea',
      `user:${PUBLISHER}`,
    ]);
    await fx.settle(admin.generation);
    await expect(
      runFor(executor, 'by_role', { kind: 'run', caller: { email: PUBLISHER } }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
  });

  // Each attempt, inside one transaction with the read that follows: the identity stays the
  // viewer's own, or the read is refused; never BEN's rows. On its own (a transaction of its
  // own), no attempt reaches the next transaction, which carries a binding of its own.
  const forgeries: [string, 'own' | 'refused', string, string?][] = [
    [
      'set_config of a look-alike setting',
      'own',
      `select set_config('viewer_cache.email', '${BEN}', true)`,
    ],
    [
      "set_config of the binding's email",
      'refused',
      `select set_config('viewer_cache.viewer_email', '=${BEN}', false)`,
    ],
    [
      "set_config of the binding's email, local",
      'refused',
      `select set_config('viewer_cache.viewer_email', '=${BEN}', true)`,
    ],
    [
      'a MAC of the session form',
      'refused',
      `select set_config('viewer_cache.viewer_mac', repeat('0', 64), true)`,
    ],
    [
      'sign_transaction with a forged MAC',
      'own',
      `select viewer_cache.sign_transaction('=${BEN}', '{}', 99999999999999, repeat('0', 64))`,
      'E_NO_VIEWER',
    ],
    ['drawing from the epoch sequence', 'own', `select nextval('viewer_cache.lease_seq')`, '42501'],
    ['calling next_lease() itself', 'own', 'select viewer_cache.next_lease()'],
    ['DISCARD SEQUENCES', 'own', 'discard sequences'],
    ['reading the binding key', 'own', 'select * from viewer_cache.binding_key', '42501'],
    ['SET ROLE to its role', 'own', `set role ${pg.escapeIdentifier('placeholder')}`],
    ['RESET ALL', 'refused', 'reset all'],
    ['SET LOCAL TimeZone', 'own', `set local timezone = 'Pacific/Auckland'`],
  ];
  for (const [name, outcome, statement, refusedWith] of forgeries) {
    it(`${name}: in the same transaction the identity stays the viewer's own, or is lost (${outcome})`, async () => {
      const text = statement.replace('"placeholder"', pg.escapeIdentifier(fx.EMEA));
      const inOne = await asViewer(ANN, async (db) => {
        await db.query('begin');
        const tried = await db.query(text).then(
          () => 'ran',
          (err: { code?: string }) => err.code,
        );
        const seen = await patients(db).catch((err: { code?: string }) => ({
          refused: err.code,
        }));
        await db.query('rollback');
        return { tried, seen };
      });
      const expected = outcome === 'own' ? ['p1', 'p2'] : { refused: 'E_NO_VIEWER' };
      expect(inOne.tried.ok).toEqual(
        refusedWith === undefined
          ? { tried: 'ran', seen: expected }
          : // Refused outright: the transaction is aborted, and the read fails on that.
            { tried: refusedWith, seen: { refused: '25P02' } },
      );
      // On its own: the run's next transaction is the viewer's own again.
      const alone = await asViewer(ANN, (db) => db.query(text));
      expect(alone.patients).toEqual(['p1', 'p2']);
      // And the next job, on the same backend, carries nothing of it.
      expect((await asViewer(BEN)).patients).toEqual(['p3']);
    });
  }

  it('DISCARD ALL (refused in a transaction block) leaves the next transaction its own binding', async () => {
    const result = await asViewer(ANN, (db) => db.query('discard all'));
    expect(result.patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('a binding kept from an earlier transaction is void in a later one on the same backend', async () => {
    const result = await asViewer(ANN, async (db) => {
      const kept = await settingsOf(db);
      // Same backend (one server connection): kept as session settings, and set again inside
      // a later transaction over that transaction's own binding.
      await setSettings(db, kept);
      await db.query('begin');
      const later = await settingsOf(db);
      await setSettings(db, kept);
      const replayed = await whoAmI(db);
      await db.query('rollback');
      return { samePid: later.pid === kept.pid, replayed };
    });
    expect(result.tried.ok).toEqual({ samePid: true, replayed: 'E_NO_VIEWER' });
    expect(result.patients).toEqual(['p1', 'p2']);
    // BEN's run on that backend, with ANN's binding replayed inside its transaction.
    let annKept: { e: string; a: string; m: string } | null = null;
    await asViewer(ANN, async (db) => {
      annKept = await settingsOf(db);
    });
    const ben = await asViewer(BEN, async (db) => {
      await db.query('begin');
      await setSettings(db, annKept!);
      const who = await whoAmI(db);
      await db.query('rollback');
      return who;
    });
    expect(ben.tried.ok).toBe('E_NO_VIEWER');
    expect(ben.patients).toEqual(['p3']);
  });

  it("a second connection of its own, with the login's password and the binding copied, has no identity", async () => {
    const passwords = await roleLoginPasswords(fx.sql);
    const own = new pg.Client(loginConfig(fx.db.name, fx.EMEA, passwords.get(fx.EMEA)!));
    own.on('error', () => {});
    await own.connect();
    try {
      const result = await asViewer(ANN, async (db) => {
        await setSettings(own, await settingsOf(db));
        return whoAmI(own);
      });
      expect(result.tried.ok).toBe('VC401');
      expect(result.patients).toEqual(['p1', 'p2']);
    } finally {
      await own.end();
    }
  });

  it('only a binding signed for this transaction on this backend counts', async () => {
    // The strongest attacker, one who learned the key's pads: a transaction binding signed for
    // BEN, this backend and this transaction works (the MACs are right); the same signed for
    // another transaction start or another backend does not.
    const { rows } = await fx.sql.query<{ inner_pad: Buffer; outer_pad: Buffer }>(
      'select inner_pad, outer_pad from viewer_cache.binding_key',
    );
    const key = rows[0]!;
    const sign = (pid: number, port: string, micros: string, email: string) => {
      const e = `=${email}`;
      const message = ['txn', pid, port, micros, Buffer.byteLength(e), e, '{}'].join('\n');
      const inner = createHash('sha256').update(key.inner_pad).update(message).digest();
      const mac = createHash('sha256').update(key.outer_pad).update(inner).digest('hex');
      return { e, a: '{}', m: `t${mac}` };
    };
    const result = await asViewer(ANN, async (db) => {
      await db.query('begin');
      const me = (
        await db.query(
          `select pg_backend_pid() as pid, coalesce(inet_client_port()::text, '') as port,
                  (extract(epoch from transaction_timestamp()) * 1000000)::bigint::text as micros`,
        )
      ).rows[0]! as { pid: number; port: string; micros: string };
      const outcome: Record<string, unknown> = {};
      // Each try under a savepoint: a refused read aborts what it is in.
      const tryWith = async (s: { e: string; a: string; m: string }) => {
        await db.query('savepoint try');
        await setSettings(db, s);
        const who = await whoAmI(db);
        await db.query('rollback to savepoint try');
        return who;
      };
      outcome['otherTransaction'] = await tryWith(
        sign(me.pid, me.port, String(BigInt(me.micros) - 1n), BEN),
      );
      outcome['otherBackend'] = await tryWith(sign(me.pid + 1, me.port, me.micros, BEN));
      outcome['signed'] = await tryWith(sign(me.pid, me.port, me.micros, BEN));
      await db.query('rollback');
      return outcome;
    });
    expect(result.tried).toEqual({
      ok: {
        otherTransaction: 'E_NO_VIEWER',
        otherBackend: 'E_NO_VIEWER',
        signed: BEN,
      },
    });
    expect(result.patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });
});

describe('the identity changed behind the process, through the pooler', () => {
  it('a binding key changed behind the process fails runs closed until it is read again', async () => {
    await asViewer(ANN);
    const fresh = randomBytes(64);
    await fx.sql.query('update viewer_cache.binding_key set inner_pad = $1, outer_pad = $2', [
      Buffer.from(fresh.map((b) => b ^ 0x36)),
      Buffer.from(fresh.map((b) => b ^ 0x5c)),
    ]);
    // sign_transaction refuses the old key's token: the run fails (never rows), and the
    // refusal makes the process read the key again.
    expect((await asViewer(ANN)).patients).toEqual({ refused: 'E_CONNECT_FAILED' });
    await waitUntil('the new key is used', async () => {
      const seen = (await asViewer(ANN)).patients;
      if (!Array.isArray(seen)) expect(seen).toEqual({ refused: 'E_CONNECT_FAILED' });
      return Array.isArray(seen);
    });
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('the identity functions dropped behind the process: runs fail closed, then they are installed again', async () => {
    await asViewer(ANN);
    await fx.sql.query(
      `drop function viewer_cache.viewer_email(), viewer_cache.viewer_attribute(text),
         viewer_cache.next_lease(), viewer_cache.sign_transaction(text, text, bigint, text) cascade;
       drop sequence viewer_cache.lease_seq;
       drop table viewer_cache.binding_key`,
    );
    await waitUntil('a viewer run binds again', async () => {
      const seen = await asViewer(ANN).then(
        (r) => r.patients,
        (err: { code?: string }) => ({ failed: err.code }),
      );
      // Without the policy (dropped with the function) the table shows nothing; never BEN's.
      if (Array.isArray(seen)) expect(seen).toEqual([]);
      else expect(seen).toEqual({ refused: 'E_CONNECT_FAILED' });
      const { rows } = await fx.sql.query(
        "select count(*)::int as n from pg_proc where proname = 'sign_transaction'",
      );
      return rows[0]!['n'] === 1;
    });
    await fx.sql.query(
      `create policy own_patients on patients for select
         using (provider_email = (select viewer_cache.viewer_email()))`,
    );
    for (let i = 0; i < 4; i++) {
      expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
      expect((await asViewer(BEN)).patients).toEqual(['p3']);
    }
  });
});

describe('the binding sent with the first statement of each transaction', () => {
  let script: (db: Db) => Promise<unknown> = async () => null;
  let scripted: Executor;
  const me = async (db: Db) =>
    (await db.query('select viewer_cache.viewer_email() as e')).rows[0]!['e'];

  beforeAll(() => {
    scripted = createExecutor({
      datatables: fx.datatables,
      runnables: {
        script: {
          fn: async (_args, ctx) => script(await ctx.datatable('main', { as: 'viewer' })),
        },
      },
    });
  });

  const runScript = async (body: (db: Db) => Promise<unknown>) => {
    script = body;
    return (await runFor(scripted, 'script', app(ANN))).value;
  };
  const failed = (p: Promise<unknown>) =>
    p.then(
      () => 'ran',
      (err: { code?: string }) => err.code ?? 'failed',
    );

  it('statements and transactions one after another, failed or not, all have the identity', async () => {
    expect(
      await runScript(async (db) => [
        await failed(db.query('select 1/0')),
        await me(db),
        await failed(db.query('selec 1')),
        await me(db),
      ]),
    ).toEqual(['E_INVALID_DATA', ANN, '42601', ANN]);
    expect(
      await runScript(async (db) => {
        await db.query('begin');
        const inside = await me(db);
        await db.query('commit');
        await db.query('begin');
        const error = await failed(db.query('select 1/0'));
        await db.query('commit'); // ends a failed transaction as ROLLBACK
        return [inside, error, await me(db)];
      }),
    ).toEqual([ANN, 'E_INVALID_DATA', ANN]);
  });

  it('a statement that cannot run in a transaction block runs (unbound); the next is bound', async () => {
    expect(
      await runScript(async (db) => [await failed(db.query('vacuum patients')), await me(db)]),
    ).toEqual(['ran', ANN]);
  });

  it('statements sent together, or several in one text, all have the identity', async () => {
    expect(await runScript(async (db) => Promise.all([me(db), me(db), me(db)]))).toEqual([
      ANN,
      ANN,
      ANN,
    ]);
    expect(
      await runScript(
        async (db) => (await db.query('select 1; select viewer_cache.viewer_email() as e')).rows,
      ),
    ).toEqual([{ e: ANN }]);
  });

  it("no other session of the login reads the viewer's email or MAC in pg_stat_activity", async () => {
    const passwords = await roleLoginPasswords(fx.sql);
    const other = new pg.Client(loginConfig(fx.db.name, fx.EMEA, passwords.get(fx.EMEA)!));
    other.on('error', () => {});
    await other.connect();
    try {
      const texts = (await runScript(async (db) => {
        const pid = Number((await db.query('select pg_backend_pid() as pid')).rows[0]!['pid']);
        const { rows } = await other.query('select query from pg_stat_activity where pid = $1', [
          pid,
        ]);
        return rows.map((row) => String(row['query']));
      })) as string[];
      expect(texts.length).toBe(1);
      expect(texts.join('\n')).not.toContain(ANN);
      expect(texts.join('\n')).not.toMatch(/[0-9a-f]{64}/);
    } finally {
      await other.end();
    }
  });
});

describe('what binding every transaction costs through the pooler', () => {
  it('the same viewer runs with the identity on and off: latency printed, rows the same', async () => {
    const off = await fx.open({
      loginConnection: { host: bouncer.host, port: bouncer.port },
      transactionPooler: true,
      viewerIdentity: false,
    });
    try {
      const runnables = {
        two: {
          fn: async (_args: unknown, ctx: RunContext) => {
            const db = await ctx.datatable('main', { as: 'viewer' });
            await db.query('select 1');
            return (await db.query('select id from orders order by id')).rows.length;
          },
        },
      };
      const on = createExecutor({ datatables: fx.datatables, runnables });
      const without = createExecutor({ datatables: off, runnables });
      const times: Record<'on' | 'off', number[]> = { on: [], off: [] };
      for (let round = 0; round < 10; round++) {
        for (const [name, exec] of [
          ['on', on],
          ['off', without],
        ] as const) {
          for (let i = 0; i < 30; i++) {
            const started = performance.now();
            const { value } = await runFor(exec, 'two', app(ANN));
            times[name].push(performance.now() - started);
            expect(value).toBeGreaterThan(0);
          }
        }
      }
      const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
      console.log(
        `through PgBouncer, a two-statement ?as=viewer run, 300 each: p50 identity off ${(p50(times.off) * 1000).toFixed(0)} µs, on ${(p50(times.on) * 1000).toFixed(0)} µs (${(p50(times.on) / p50(times.off)).toFixed(2)}×)`,
      );
    } finally {
      await off.close();
    }
  });
});
