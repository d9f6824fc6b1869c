import pg from 'pg';
import type { Datatables, RunContext } from 'viewer-cache';
import { defineApps } from 'viewer-cache/server';

// A deliberately leaky apps module: one runnable per leak class `viewer-cache audit` catches,
// and one database object per policy lint. Never serve it. `npx viewer-cache audit --apps
// examples/leaky-apps.ts` after `seedLeaky` fails, naming each runnable and each lint (the test
// test/integration/pg/audit_leaky.test.ts checks that none is missed).

export const LEAKY_WORKSPACE = 'leaky';
export const LEAKY_DATATABLE = 'leaky';
const PUBLISHER = 'publisher@leaky.test';

/** North, south, and someone holding both. */
export const LEAKY_USERS = {
  'nell@leaky.test': ['north'],
  'stan@leaky.test': ['south'],
  'dual@leaky.test': ['north', 'south'],
} as const;

const roleNames = (prefix: string) => ({
  north: `${prefix}leaky_north`,
  south: `${prefix}leaky_south`,
  /** The data table's default role: reads every note. */
  reader: `${prefix}leaky_reader`,
});

type Note = { id: number; region: string; body: string };
const NOTES = 'select id, region, body from leaky.notes order by id';

// Module state that outlives a job: the first viewer's rows, handed to every later one.
let memoised: Note[] | undefined;
// A cache of the module's own, keyed by the args only: the viewer is missing from its key.
const ownCache = new Map<string, Note[]>();

// Runs coalesced while one is in flight (and a moment after), keyed by the args only: the viewer
// is missing from the key, so a per-recipient batch hands every recipient the first one's rows.
const inFlight = new Map<string, Promise<Note[]>>();
const COALESCE_MS = 100;

const asViewer = async (ctx: RunContext) =>
  (await ctx.datatable(LEAKY_DATATABLE, { as: 'viewer' })).query<Note>(NOTES);

export default defineApps(() => {
  const runnables = {
    // Differential isolation: the module memoises a result across jobs.
    'f/leaky/memoised': {
      cacheTtlS: 60,
      fn: async (_args: Record<string, unknown>, ctx: RunContext) => {
        memoised ??= (await asViewer(ctx)).rows;
        return memoised;
      },
    },
    // Differential isolation: a cache of its own, keyed without the viewer.
    'f/leaky/own_cache': {
      cacheTtlS: 60,
      fn: async (args: Record<string, unknown>, ctx: RunContext) => {
        const key = String(args['region']);
        if (!ownCache.has(key)) ownCache.set(key, (await asViewer(ctx)).rows);
        return ownCache.get(key);
      },
    },
    // Per-recipient: concurrent runs coalesced without the viewer in the key.
    'f/leaky/coalesced': {
      cacheTtlS: 60,
      fn: async (args: Record<string, unknown>, ctx: RunContext) => {
        const key = JSON.stringify(args);
        let pending = inFlight.get(key);
        if (pending === undefined) {
          pending = asViewer(ctx).then((result) => result.rows);
          inFlight.set(key, pending);
          const forget = () => setTimeout(() => inFlight.delete(key), COALESCE_MS);
          pending.then(forget, forget);
        }
        return pending;
      },
    },
    // Varies by viewer: a private app's runnable reading with the data table's default role.
    'f/leaky/default_role': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}`,
      sql: NOTES,
      cacheTtlS: 60,
    },
    // No viewer, no rows: with no viewer (anonymous, schedule, hook) it falls back to the
    // default role instead of being refused.
    'f/leaky/no_viewer_fallback': {
      cacheTtlS: 60,
      fn: async (_args: Record<string, unknown>, ctx: RunContext) => {
        try {
          return (await asViewer(ctx)).rows;
        } catch {
          const client = await ctx.datatable(LEAKY_DATATABLE);
          return (await client.query<Note>(NOTES)).rows;
        }
      },
    },
    // A declared expectation broken: "aggregate-only" but it returns the notes' bodies.
    'f/leaky/aggregate': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: 'select region, count(*)::int as notes, max(body) as body from leaky.notes group by region order by region',
      cacheTtlS: 60,
    },
    // Lint: permissive policies of two roles on leaky.notes add up for dual@.
    'f/leaky/dual_role': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: NOTES,
      cacheTtlS: 60,
    },
    // Lint: a table granted with row security off.
    'f/leaky/directory': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: 'select id, body from leaky.directory order by id',
      cacheTtlS: 60,
    },
    // Lint: a policy for everyone that tests no one.
    'f/leaky/tagged': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: 'select id, tag from leaky.tagged order by id',
      cacheTtlS: 60,
    },
    // Lint: a view reading with its owner's rights.
    'f/leaky/owner_view': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: 'select id, region, body from leaky.all_notes order by id',
      cacheTtlS: 60,
    },
    // Lint: a SECURITY DEFINER function every role may execute.
    'f/leaky/definer': {
      kind: 'sql' as const,
      database: `datatable://${LEAKY_DATATABLE}?as=viewer`,
      sql: 'select leaky.note_count() as notes',
      cacheTtlS: 60,
    },
  };
  const paths = Object.keys(runnables);
  return {
    workspace: LEAKY_WORKSPACE,
    runnables,
    apps: { notes: { publisher: PUBLISHER, public: false, runnables: paths } },
    audit: {
      runnables: {
        ...Object.fromEntries(paths.map((path) => [path, true as const])),
        'f/leaky/own_cache': { args: { region: 'any' } },
        'f/leaky/no_viewer_fallback': { expect: { refusedWithoutRole: true } },
        'f/leaky/aggregate': { expect: { noColumns: ['body'] } },
      },
    },
  };
});

/** Seeds the leaky data table: its roles, tables, policies, view and function. Idempotent. */
export async function seedLeaky(options: {
  datatables: Datatables;
  databaseUrl: string;
  rolePrefix?: string;
}): Promise<void> {
  const { datatables, databaseUrl } = options;
  const admin = datatables.admin;
  const roles = roleNames(options.rolePrefix ?? '');
  const database = new URL(databaseUrl).pathname.slice(1) || 'postgres';
  await admin.createDatatable(LEAKY_WORKSPACE, LEAKY_DATATABLE, { database });
  const existing = new Set((await admin.listRoles(LEAKY_WORKSPACE)).map((r) => r.name));
  for (const [name, tenants] of [
    [roles.north, ['group:north']],
    [roles.south, ['group:south']],
    [roles.reader, []],
  ] as const)
    if (!existing.has(name))
      await admin.createRole(LEAKY_WORKSPACE, LEAKY_DATATABLE, name, { tenants: [...tenants] });
  const [n, s, r] = [roles.north, roles.south, roles.reader].map((x) => pg.escapeIdentifier(x));
  const sql = new pg.Client({ connectionString: databaseUrl });
  sql.on('error', () => {});
  await sql.connect();
  try {
    await sql.query(`
      create schema if not exists leaky;
      create table if not exists leaky.notes (id int primary key, region text, body text);
      insert into leaky.notes values (1, 'north', 'north plan'), (2, 'south', 'south plan')
        on conflict do nothing;
      alter table leaky.notes enable row level security;
      grant usage on schema leaky to ${n}, ${s}, ${r};
      grant select on leaky.notes to ${n}, ${s}, ${r};
      drop policy if exists notes_north on leaky.notes;
      create policy notes_north on leaky.notes for select to ${n} using (region = 'north');
      drop policy if exists notes_south on leaky.notes;
      create policy notes_south on leaky.notes for select to ${s} using (region = 'south');
      drop policy if exists notes_reader on leaky.notes;
      create policy notes_reader on leaky.notes for select to ${r} using (true);
      create table if not exists leaky.directory (id int primary key, body text);
      insert into leaky.directory values (1, 'north salaries'), (2, 'south salaries')
        on conflict do nothing;
      grant select on leaky.directory to ${n}, ${s};
      create table if not exists leaky.tagged (id int primary key, region text, tag text);
      insert into leaky.tagged values (1, 'north', 'n'), (2, 'south', 's') on conflict do nothing;
      alter table leaky.tagged enable row level security;
      grant select on leaky.tagged to ${n}, ${s};
      drop policy if exists everyone on leaky.tagged;
      create policy everyone on leaky.tagged for select using (region = 'north');
      create or replace view leaky.all_notes as select id, region, body from leaky.notes;
      grant select on leaky.all_notes to ${n};
      create or replace function leaky.note_count() returns bigint
        language sql security definer as 'select count(*) from leaky.notes';
    `);
  } finally {
    await sql.end();
  }
  await admin.setDefaultRole(LEAKY_WORKSPACE, LEAKY_DATATABLE, roles.reader);
  let last = { generation: 0 };
  for (const [email, groups] of Object.entries(LEAKY_USERS))
    for (const group of groups)
      last = await admin.addMembership(LEAKY_WORKSPACE, email, 'group', group);
  await datatables.waitForGeneration(last.generation);
}
