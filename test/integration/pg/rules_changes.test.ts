import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  type RunContext,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor, SECRET_KEY, WS } from '../../helpers/orders_db.js';
import { asAdmin, createTestDatabase, type TestDatabase } from '../../helpers/pg.js';
import { runCli, runCliJson, serverEnv } from '../../helpers/server_process.js';
import { waitUntil } from '../../helpers/wait.js';

// SPEC invariant 22: a change in a data table's database to what a role may read — a policy,
// a grant, row security, a view or function a query reads, a table dropped or renamed — makes
// every entry whose run depended on that data table a miss on the next run, in every process;
// the next run reflects the new rule; entries of another data table keep hitting. The changes
// are made as an operator would: plain SQL as the superuser, behind the library's back.

const ALICE = 'alice@example.com';

let fx: OrdersDb;
let otherDb: TestDatabase;
let second: Datatables;
const stacks: { executor: Executor; cached: CachedExecutor }[] = [];

function stack(datatables: Datatables) {
  const executor = createExecutor({
    datatables,
    runnables: {
      // The statement travels in the args: each case reads its own objects, under its own key.
      // One runnable per data table: what a runnable depends on is learned per runnable.
      main: { cacheTtlS: 300, fn: (args, ctx) => query(ctx, 'main', args) },
      other: { cacheTtlS: 300, fn: (args, ctx) => query(ctx, 'other', args) },
    },
  });
  const cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
  stacks.push({ executor, cached });
}

async function query(ctx: RunContext, datatable: string, args: Record<string, unknown>) {
  const db = await ctx.datatable(datatable, { as: 'viewer' });
  return (await db.query(String(args['sql']))).rows.map((r) => Object.values(r)[0]);
}

async function run(which: number, datatable: 'main' | 'other', sql: string) {
  const { executor, cached } = stacks[which]!;
  const result = await runFor(executor, datatable, app(ALICE), { through: cached, args: { sql } });
  return { fromCache: result.fromCache, rows: result.value as unknown[] };
}

/** Waits until both processes hold the catalog generation the DDL's trigger produced. */
async function settled(): Promise<void> {
  const { rows } = await fx.sql.query('select value from viewer_cache.generation');
  const generation = Number(rows[0]!['value']);
  await fx.settle(generation);
  await second.waitForGeneration(generation);
}

const NOTES = 'select id from notes order by id';

beforeAll(async () => {
  fx = await ordersDb();
  // Another data table, in a database of its own: its entries must outlive main's rule changes.
  otherDb = await createTestDatabase(`${fx.prefix}o`);
  const reader = `${fx.prefix}notes_reader`;
  await fx.datatables.admin.createDatatable(WS, 'other', { database: otherDb.name });
  const change = await fx.datatables.admin.createRole(WS, 'other', reader, {
    tenants: ['group:emea'],
  });
  await asAdmin(otherDb.name, async (c) => {
    await c.query('create table notes (id int primary key)');
    await c.query('insert into notes values (7), (8)');
    await c.query(`grant select on notes to ${pg.escapeIdentifier(reader)}`);
  });
  await fx.settle(change.generation);
  second = await fx.open({ migrate: false });
  stack(fx.datatables);
  stack(second);
  // The other data table's first digest is recorded by a check after it was registered.
  await waitUntil('both processes checked the rules of the other data table', () =>
    [fx.datatables, second].every((d) => d.rulesMode(WS, 'other') === 'digest'),
  );
  await settled();
});

afterAll(async () => {
  // The reader's grants in the other database first: roles go with the fixture.
  await asAdmin(otherDb.name, (c) =>
    c.query(`drop owned by ${pg.escapeIdentifier(`${fx.prefix}notes_reader`)}`),
  );
  await fx?.close();
  await otherDb?.drop();
});

const emea = () => pg.escapeIdentifier(fx.EMEA);

/**
 * One kind of change: objects made for it, what alice's run reads before (a hit the second
 * time, in both processes), the change, and what her next run reads after (rows, or the code).
 */
interface Case {
  name: string;
  setup: (role: string) => string[];
  sql: string;
  before: unknown[];
  change: (role: string) => string[];
  after: unknown[] | { code: string };
}

const CASES: Case[] = [
  {
    name: 'alter policy (a tighter rule)',
    setup: (r) => table('t_alter', r, ['region = $$emea$$']),
    sql: 'select id from t_alter order by id',
    before: [1, 3],
    change: () => ['alter policy p on t_alter using (region = $$emea$$ and amount > 100)'],
    after: [3],
  },
  {
    name: 'create policy (a restrictive one)',
    setup: (r) => table('t_create', r, ['region = $$emea$$']),
    sql: 'select id from t_create order by id',
    before: [1, 3],
    change: (r) => [`create policy q on t_create as restrictive for select to ${r} using (id > 1)`],
    after: [3],
  },
  {
    name: 'drop policy',
    setup: (r) => table('t_drop', r, ['region = $$emea$$']),
    sql: 'select id from t_drop order by id',
    before: [1, 3],
    change: () => ['drop policy p on t_drop'],
    after: [],
  },
  {
    name: 'revoke',
    setup: (r) => table('t_revoke', r, ['region = $$emea$$']),
    sql: 'select id from t_revoke order by id',
    before: [1, 3],
    change: (r) => [`revoke select on t_revoke from ${r}`],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'grant',
    setup: (r) => [...table('t_grant', r, ['true']), `revoke select on t_grant from ${r}`],
    sql: `select has_table_privilege('t_grant', 'select')`,
    before: [false],
    change: (r) => [`grant select on t_grant to ${r}`],
    after: [true],
  },
  {
    name: 'revoke on a column',
    setup: (r) => [
      ...table('t_col', r, ['region = $$emea$$']),
      `revoke select on t_col from ${r}`,
      `grant select (id, amount) on t_col to ${r}`,
    ],
    sql: 'select amount from t_col order by id',
    before: [10, 430],
    change: (r) => [`revoke select (amount) on t_col from ${r}`],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'revoke on a schema',
    setup: (r) => [
      'create schema s_rules',
      `grant usage on schema s_rules to ${r}`,
      ...table('s_rules.t_schema', r, ['region = $$emea$$']),
    ],
    sql: 'select id from s_rules.t_schema order by id',
    before: [1, 3],
    change: (r) => [`revoke usage on schema s_rules from ${r}`],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'revoke on a function',
    setup: () => [
      'create function fn_priv() returns int language sql immutable as $$ select 42 $$',
    ],
    sql: 'select fn_priv()',
    before: [42],
    change: () => ['revoke execute on function fn_priv() from public'],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'disable row level security',
    setup: (r) => table('t_disable', r, ['region = $$emea$$']),
    sql: 'select id from t_disable order by id',
    before: [1, 3],
    change: () => ['alter table t_disable disable row level security'],
    after: [1, 2, 3, 4],
  },
  {
    name: 'enable row level security',
    setup: (r) => [
      ...table('t_enable', r, ['region = $$emea$$']),
      'alter table t_enable disable row level security',
    ],
    sql: 'select id from t_enable order by id',
    before: [1, 2, 3, 4],
    change: () => ['alter table t_enable enable row level security'],
    after: [1, 3],
  },
  {
    name: "force row level security (the viewer's role owns the table)",
    setup: (r) => [
      ...table('t_force', r, ['region = $$emea$$']),
      `alter table t_force owner to ${r}`,
    ],
    sql: 'select id from t_force order by id',
    before: [1, 2, 3, 4],
    change: () => ['alter table t_force force row level security'],
    after: [1, 3],
  },
  {
    name: 'create or replace view',
    setup: (r) => [
      ...table('t_view', r, ['region = $$emea$$']),
      'create view v_view with (security_invoker = true) as select id from t_view',
      `grant select on v_view to ${r}`,
    ],
    sql: 'select id from v_view order by id',
    before: [1, 3],
    change: () => [
      'create or replace view v_view with (security_invoker = true) as select id from t_view where id > 1',
    ],
    after: [3],
  },
  {
    name: 'function replaced (one a policy calls)',
    setup: (r) => [
      'create function region_ok(region text) returns boolean language sql stable as $$ select region = $x$emea$x$ $$',
      ...table('t_fn', r, ['region_ok(region)']),
    ],
    sql: 'select id from t_fn order by id',
    before: [1, 3],
    change: () => [
      'create or replace function region_ok(region text) returns boolean language sql stable as $$ select false $$',
    ],
    after: [],
  },
  {
    name: 'function dropped (one the query calls)',
    setup: (r) => [
      ...table('t_fndrop', r, ['region = $$emea$$']),
      'create function fndrop_ids() returns setof int language sql stable as $$ select id from t_fndrop order by id $$',
    ],
    sql: 'select * from fndrop_ids()',
    before: [1, 3],
    change: () => ['drop function fndrop_ids()'],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'table dropped',
    setup: (r) => table('t_gone', r, ['region = $$emea$$']),
    sql: 'select id from t_gone order by id',
    before: [1, 3],
    change: () => ['drop table t_gone'],
    after: { code: 'E_QUERY_FAILED' },
  },
  {
    name: 'table renamed',
    setup: (r) => table('t_renamed', r, ['region = $$emea$$']),
    sql: 'select id from t_renamed order by id',
    before: [1, 3],
    change: () => ['alter table t_renamed rename to t_renamed_old'],
    after: { code: 'E_QUERY_FAILED' },
  },
];

/** The orders rows in a table of its own, RLS on, one permissive policy `p`, read by `role`. */
function table(name: string, role: string, using: string[]): string[] {
  return [
    `create table ${name} (id int primary key, region text not null, amount int not null)`,
    `insert into ${name} values (1, 'emea', 10), (2, 'amer', 20), (3, 'emea', 430), (4, 'apac', 40)`,
    `alter table ${name} enable row level security`,
    `grant select on ${name} to ${role}`,
    `create policy p on ${name} for select using (${using.join(' and ')})`,
  ];
}

async function superuser(statements: readonly string[]): Promise<void> {
  await asAdmin(fx.db.name, async (c) => {
    for (const statement of statements) await c.query(statement);
  });
}

describe("a rule change in the data table's database applies on the next run (event trigger)", () => {
  it('runs in event-trigger mode in the catalog database, digest mode elsewhere', () => {
    expect(fx.datatables.rulesMode(WS, 'main')).toBe('event-trigger');
    expect(fx.datatables.rulesMode(WS, 'other')).toBe('digest');
  });

  for (const kind of CASES) {
    it(`${kind.name}: the entry before is not served after, in either process; another data table's entry still hits`, async () => {
      await superuser(kind.setup(emea()));
      await settled();
      for (const p of [0, 1]) {
        await run(p, 'main', kind.sql);
        expect(await run(p, 'main', kind.sql)).toEqual({ fromCache: true, rows: kind.before });
        await run(p, 'other', NOTES);
        expect(await run(p, 'other', NOTES)).toEqual({ fromCache: true, rows: [7, 8] });
      }
      await superuser(kind.change(emea()));
      await settled();
      for (const p of [0, 1]) {
        if (Array.isArray(kind.after)) {
          expect(await run(p, 'main', kind.sql)).toEqual({ fromCache: false, rows: kind.after });
        } else {
          await expect(run(p, 'main', kind.sql)).rejects.toMatchObject(kind.after);
        }
        expect(await run(p, 'other', NOTES)).toEqual({ fromCache: true, rows: [7, 8] });
      }
    });
  }

  it('a run that creates, alters and drops a temporary table invalidates nothing', async () => {
    const sql = 'select id from orders order by id';
    await run(0, 'main', sql);
    expect((await run(0, 'main', sql)).fromCache).toBe(true);
    const before = (await fx.sql.query('select value from viewer_cache.generation')).rows[0];
    await asAdmin(fx.db.name, async (c) => {
      await c.query('create temp table scratch (id int)');
      await c.query('alter table scratch add column b int');
      await c.query('drop table scratch');
    });
    const after = (await fx.sql.query('select value from viewer_cache.generation')).rows[0];
    expect(after).toEqual(before);
    expect((await run(0, 'main', sql)).fromCache).toBe(true);
  });
});

describe('cache invalidate --datatable (for what the library cannot see)', () => {
  const ORDERS = 'select id from orders order by id';

  async function cached(): Promise<void> {
    for (const p of [0, 1]) {
      await run(p, 'main', ORDERS);
      expect((await run(p, 'main', ORDERS)).fromCache).toBe(true);
      await run(p, 'other', NOTES);
      expect((await run(p, 'other', NOTES)).fromCache).toBe(true);
    }
  }

  it('the library call drops the entries of that data table in both processes, and says who heard it', async () => {
    await cached();
    const heard = await fx.datatables.invalidateDatatable(WS, 'other');
    // The other process acknowledged; nobody was left out.
    expect(heard).toMatchObject({ acknowledged: 1, missing: 0 });
    for (const p of [0, 1]) {
      expect(await run(p, 'other', NOTES)).toEqual({ fromCache: false, rows: [7, 8] });
      expect(await run(p, 'main', ORDERS)).toEqual({ fromCache: true, rows: [1, 3] });
    }
    await expect(fx.datatables.invalidateDatatable(WS, 'nope')).rejects.toMatchObject({
      code: 'E_UNKNOWN_DATATABLE',
    });
  });

  it('the CLI does the same through the catalog, reports the processes that heard it, and refuses what it cannot do', async () => {
    await cached();
    const dir = await mkdtemp(join(tmpdir(), 'viewer-cache-rules-cli-'));
    try {
      const env = serverEnv({
        DATABASE_URL: fx.db.url,
        VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
        VIEWER_CACHE_DATA_DIR: dir,
      });
      const args = ['-w', WS, 'cache', 'invalidate', '--datatable', 'main'];
      expect(await runCliJson(env, args)).toMatchObject({
        invalidated: { workspace: WS, datatable: 'main' },
        receivers: 2,
        missing: 0,
      });
      for (const p of [0, 1]) {
        expect(await run(p, 'main', ORDERS)).toEqual({ fromCache: false, rows: [1, 3] });
        expect(await run(p, 'other', NOTES)).toEqual({ fromCache: true, rows: [7, 8] });
      }
      const unknown = await runCli(env, ['--json', ...args.slice(0, -1), 'nope']);
      expect(unknown.code).toBe(1);
      expect(JSON.parse(unknown.stdout)).toMatchObject({ error: { code: 'E_UNKNOWN_DATATABLE' } });
      const both = await runCli(env, [...args, '--path', 'f/x']);
      expect(both.code).toBe(2);
      expect(both.stderr).toMatch(/E_USAGE: give --path or --datatable, not both/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
