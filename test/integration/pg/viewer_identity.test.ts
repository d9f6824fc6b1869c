import { createHash, randomBytes } from 'node:crypto';
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
          // A tampering attempt may cost the run its own identity (refused), never give another.
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
});

async function asViewer(viewer: string | null, tried: Attempt = async () => null) {
  attempt = tried;
  const result = await runFor(executor, 'patients', app(viewer));
  return result.value as {
    patients: string[] | { refused: string };
    tried: { ok?: unknown; refused?: string };
  };
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

  const settingsOf = async (db: Awaited<ReturnType<RunContext['datatable']>>) =>
    (
      await db.query(
        `select current_setting('viewer_cache.viewer_email') as e,
                current_setting('viewer_cache.viewer_attributes') as a,
                current_setting('viewer_cache.viewer_mac') as m`,
      )
    ).rows[0]! as { e: string; a: string; m: string };
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

  // Each attempt either leaves the viewer's own identity (`own`) or costs the run its identity
  // (`refused`: reads raise E_NO_VIEWER); never BEN's rows.
  const forgeries: [string, 'own' | 'refused', Attempt][] = [
    [
      'set_config of a look-alike setting',
      'own',
      (db) => db.query(`select set_config('viewer_cache.email', '${BEN}', false)`),
    ],
    [
      "set_config of the binding's own email",
      'refused',
      (db) => db.query(`select set_config('viewer_cache.viewer_email', '=${BEN}', false)`),
    ],
    [
      'drawing from the epoch sequence',
      'own',
      (db) => db.query(`select nextval('viewer_cache.lease_seq')`),
    ],
    [
      'setting the epoch sequence back',
      'own',
      (db) => db.query(`select setval('viewer_cache.lease_seq', 1)`),
    ],
    [
      "reading the session's epoch",
      'own',
      (db) => db.query(`select currval('viewer_cache.lease_seq')`),
    ],
    ['reading the binding key', 'own', (db) => db.query('select * from viewer_cache.binding_key')],
    [
      'calling next_lease() itself',
      'refused',
      (db) => db.query('select viewer_cache.next_lease()'),
    ],
    ['DISCARD SEQUENCES', 'refused', (db) => db.query('discard sequences')],
    [
      'replacing the function',
      'own',
      (db) =>
        db.query(
          `create or replace function viewer_cache.viewer_email() returns text language sql as $$ select '${BEN}' $$`,
        ),
    ],
    [
      'a function of its own earlier on the search_path',
      'own',
      (db) =>
        db.query(
          `create function pg_temp.viewer_email() returns text language sql as $$ select '${BEN}' $$`,
        ),
    ],
    ['SET ROLE to its role', 'own', (db) => db.query(`set role ${pg.escapeIdentifier(fx.EMEA)}`)],
    ['RESET ROLE', 'own', (db) => db.query('reset role')],
    ['RESET ALL', 'refused', (db) => db.query('reset all')],
    ['DISCARD ALL', 'refused', (db) => db.query('discard all')],
    ['NOTIFY', 'own', (db) => db.query(`notify viewer_cache_catalog, '99999999'`)],
  ];
  for (const [name, outcome, tried] of forgeries) {
    it(`${name}: the identity stays the viewer's own, or is lost (${outcome})`, async () => {
      const result = await asViewer(ANN, tried);
      expect(result.patients).toEqual(
        outcome === 'own' ? ['p1', 'p2'] : { refused: 'E_NO_VIEWER' },
      );
      // Afterwards, the pooled connection carries nothing into the next job.
      expect((await asViewer(BEN)).patients).toEqual(['p3']);
    });
  }

  it("a second connection of its own, with the login's password and the binding copied, has no identity", async () => {
    const passwords = await roleLoginPasswords(fx.sql);
    const own = new pg.Client(loginConfig(fx.db.name, fx.EMEA, passwords.get(fx.EMEA)!));
    own.on('error', () => {});
    await own.connect();
    try {
      const result = await asViewer(ANN, async (db) => {
        await setSettings(own, await settingsOf(db));
        return own.query('select viewer_cache.viewer_email() as e').then(
          (r) => r.rows[0]!['e'],
          (err: { code?: string }) => err.code,
        );
      });
      expect(result.tried.ok).toBe('VC401');
      expect(result.patients).toEqual(['p1', 'p2']);
      expect(
        await own.query('select count(*)::int as n from patients').catch(() => null),
      ).toBeNull();
    } finally {
      await own.end();
    }
  });

  it('a binding kept from an earlier lease is void on a later lease of the same backend', async () => {
    let kept: { e: string; a: string; m: string } | null = null;
    let keptPid = 0;
    await asViewer(ANN, async (db) => {
      kept = await settingsOf(db);
      keptPid = lastPid;
    });
    // The pool lends its most recently returned connection first; run until BEN is given the
    // very backend ANN's binding was made on.
    for (let i = 0; ; i++) {
      const result = await asViewer(BEN, async (db) => {
        if (lastPid !== keptPid) return 'another backend';
        await setSettings(db, kept!);
        return 'replayed';
      });
      if (result.tried.ok === 'replayed') {
        expect(result.patients).toEqual({ refused: 'E_NO_VIEWER' });
        break;
      }
      expect(result.patients).toEqual(['p3']);
      if (i > 50) throw new Error('ANN’s backend was never lent again');
    }
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
  });

  it('the privileged identity connections dying costs a run nothing: binding needs none', async () => {
    await asViewer(ANN);
    const { rowCount } = await fx.sql.query(
      `select pg_terminate_backend(pid) from pg_stat_activity
        where application_name = 'viewer-cache-identity' and datname = $1`,
      [fx.db.name],
    );
    expect(rowCount).toBeGreaterThan(0);
    // The binding travels on the lent connection itself, signed by the key read at install.
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('only a binding signed for this backend and its current epoch counts', async () => {
    // The strongest attacker: one who learned the key's pads (a superuser here) and so can sign
    // at will. A binding signed for BEN, this backend and its epoch works, which shows these
    // MACs are right; the same signed for the epoch before, or for another backend, does not.
    const { rows } = await fx.sql.query<{ inner_pad: Buffer; outer_pad: Buffer }>(
      'select inner_pad, outer_pad from viewer_cache.binding_key',
    );
    const key = rows[0]!;
    const sign = (pid: number, port: number | null, epoch: bigint, email: string) => {
      const e = `=${email}`;
      const message = ['viewer', pid, port ?? '', epoch, Buffer.byteLength(e), e, '{}'].join('\n');
      const inner = createHash('sha256').update(key.inner_pad).update(message).digest();
      const mac = createHash('sha256').update(key.outer_pad).update(inner).digest('hex');
      return { e, a: '{}', m: mac };
    };
    const whoAmI = (db: Awaited<ReturnType<RunContext['datatable']>>) =>
      db.query('select viewer_cache.viewer_email() as e').then(
        (r) => r.rows[0]!['e'],
        (err: { code?: string }) => err.code,
      );
    const result = await asViewer(ANN, async (db) => {
      const me = (await db.query('select pg_backend_pid() as pid, inet_client_port() as port'))
        .rows[0]!;
      const pid = Number(me['pid']);
      const port = me['port'] === null ? null : Number(me['port']);
      // The runnable may draw an epoch itself (voiding its own binding) and so learn its value.
      const epoch = BigInt(
        (await db.query('select viewer_cache.next_lease() as e')).rows[0]!['e'] as string,
      );
      const outcome: Record<string, unknown> = {};
      await setSettings(db, sign(pid, port, epoch - 1n, BEN));
      outcome['earlierEpoch'] = await whoAmI(db);
      await setSettings(db, sign(pid + 1, port, epoch, BEN));
      outcome['otherBackend'] = await whoAmI(db);
      await setSettings(db, sign(pid, port, epoch, BEN));
      outcome['signed'] = await whoAmI(db);
      return outcome;
    });
    expect(result.tried.ok).toEqual({
      earlierEpoch: 'E_NO_VIEWER',
      otherBackend: 'E_NO_VIEWER',
      signed: BEN,
    });
    expect(result.patients).toEqual(['p3']);
    // The connection is back in its pool under a new epoch: nothing of that carries over.
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('a binding key changed behind the process fails runs closed until it is read again', async () => {
    await asViewer(ANN);
    const fresh = randomBytes(64);
    await fx.sql.query('update viewer_cache.binding_key set inner_pad = $1, outer_pad = $2', [
      Buffer.from(fresh.map((b) => b ^ 0x36)),
      Buffer.from(fresh.map((b) => b ^ 0x5c)),
    ]);
    // Runs signed with the old key are refused (never rows); the first refusal makes the
    // process read the key again.
    expect((await asViewer(ANN)).patients).toEqual({ refused: 'E_NO_VIEWER' });
    await waitUntil('the new key is used', async () => {
      const seen = (await asViewer(ANN)).patients;
      if (!Array.isArray(seen)) expect(seen).toEqual({ refused: 'E_NO_VIEWER' });
      return Array.isArray(seen);
    });
    expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
    expect((await asViewer(BEN)).patients).toEqual(['p3']);
  });

  it('the identity functions dropped behind the process: runs fail closed, then they are installed again', async () => {
    await asViewer(ANN);
    // The identity's objects only: in this fixture the catalog shares the schema. The policy
    // goes with the function it calls; it is put back below, as an operator would.
    await fx.sql.query(
      `drop function viewer_cache.viewer_email(), viewer_cache.viewer_attribute(text),
         viewer_cache.next_lease() cascade;
       drop sequence viewer_cache.lease_seq;
       drop table viewer_cache.binding_key`,
    );
    await waitUntil('a viewer run binds again', async () => {
      const seen = await asViewer(ANN).then(
        (r) => r.patients,
        (err: { code?: string }) => ({ failed: err.code }),
      );
      if (Array.isArray(seen)) expect(seen).toEqual([]);
      const { rows } = await fx.sql.query(
        "select count(*)::int as n from pg_proc where proname = 'viewer_email'",
      );
      return rows[0]!['n'] === 1;
    });
    await fx.sql.query(
      `create policy own_patients on patients for select
         using (provider_email = (select viewer_cache.viewer_email()))`,
    );
    // A pooled connection whose epoch came from the dropped sequence is refused once (closed,
    // never another viewer's rows), and draws a new epoch when it is given back. Runs side by
    // side, so every connection the pool holds is lent (one run after another may keep
    // reusing the same one and leave an idle one from before the drop for later).
    const own: Record<string, string[]> = { [ANN]: ['p1', 'p2'], [BEN]: ['p3'] };
    await waitUntil('every pooled connection heals', async () => {
      const round = await Promise.all(
        [ANN, BEN, ANN, BEN, ANN, BEN, ANN, BEN].map(
          async (viewer) => [viewer, (await asViewer(viewer)).patients] as const,
        ),
      );
      for (const [viewer, seen] of round) {
        if (Array.isArray(seen)) expect(seen).toEqual(own[viewer]);
        else expect(seen).toEqual({ refused: 'E_NO_VIEWER' });
      }
      return round.every(([, seen]) => Array.isArray(seen));
    });
    for (let i = 0; i < 8; i++) {
      expect((await asViewer(ANN)).patients).toEqual(['p1', 'p2']);
      expect((await asViewer(BEN)).patients).toEqual(['p3']);
    }
  });

  it('installing twice changes nothing (idempotent), and attributes not given are refused', async () => {
    await fx.datatables.admin.createDatatable(WS, 'main', { database: fx.db.name });
    const result = await asViewer(ANN, (db) =>
      db.query("select viewer_cache.viewer_attribute('customer_id')"),
    );
    expect(result.tried.refused).toBe('E_NO_VIEWER_ATTRIBUTE');
  });
});

// The binding goes in front of the run's first statement, in the same Sync: whatever that
// statement does to its transaction, the run keeps its identity for the statements after it.
describe('the binding sent with the first statement', () => {
  type Db = Awaited<ReturnType<RunContext['datatable']>>;
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

  it('a first statement that fails: the next one still has the identity', async () => {
    expect(
      await runScript(async (db) => [await failed(db.query('select 1/0')), await me(db)]),
    ).toEqual(['E_INVALID_DATA', ANN]);
    expect(
      await runScript(async (db) => [await failed(db.query('selec 1')), await me(db)]),
    ).toEqual(['42601', ANN]);
    expect(
      await runScript(async (db) => [
        await failed(db.query('select $1::int / 0', [1])),
        await me(db),
      ]),
    ).toEqual(['E_INVALID_DATA', ANN]);
  });

  it('a transaction the run opens first, rolled back or failed: the identity stays', async () => {
    expect(
      await runScript(async (db) => {
        await db.query('begin');
        const inside = await me(db);
        await db.query('rollback');
        return [inside, await me(db)];
      }),
    ).toEqual([ANN, ANN]);
    expect(
      await runScript(async (db) => {
        await db.query('begin');
        const error = await failed(db.query('select 1/0'));
        await db.query('commit'); // ends a failed transaction as ROLLBACK
        return [error, await me(db)];
      }),
    ).toEqual(['E_INVALID_DATA', ANN]);
    expect(
      await runScript(async (db) => {
        await db.query('begin');
        await db.query('commit');
        return me(db);
      }),
    ).toBe(ANN);
  });

  it('a first statement that cannot run in a transaction block still runs', async () => {
    expect(
      await runScript(async (db) => [await failed(db.query('vacuum patients')), await me(db)]),
    ).toEqual(['ran', ANN]);
  });

  it('first statements sent together, or several in one text, all have the identity', async () => {
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
    expect(
      await runScript(
        async (db) => (await db.query('select $1::text as v', [`it's ${ANN}`])).rows[0]!['v'],
      ),
    ).toBe(`it's ${ANN}`);
  });
});

describe('what other sessions of the same login can see', () => {
  it("no other session of the login reads the viewer's email or MAC in pg_stat_activity", async () => {
    const passwords = await roleLoginPasswords(fx.sql);
    const other = new pg.Client(loginConfig(fx.db.name, fx.EMEA, passwords.get(fx.EMEA)!));
    other.on('error', () => {});
    await other.connect();
    try {
      // Sessions of one login see each other's statements (pg_stat_activity shows a backend's
      // last statement even while it is idle): the binding must travel as parameters.
      const seen = await asViewer(ANN, async (db) => {
        const pid = Number((await db.query('select pg_backend_pid() as pid')).rows[0]!['pid']);
        const { rows } = await other.query('select query from pg_stat_activity where pid = $1', [
          pid,
        ]);
        return rows.map((row) => String(row['query']));
      });
      const texts = seen.tried.ok as string[];
      expect(texts.length).toBe(1);
      expect(texts.join('\n')).not.toContain(ANN);
      expect(texts.join('\n')).not.toMatch(/[0-9a-f]{64}/);
    } finally {
      await other.end();
    }
  });
});
