import pg from 'pg';
import {
  type Datatables,
  errorClassOf,
  type RunContext,
  type RunnableDefinition,
  ViewerCacheError,
  withTransaction,
} from '../../index.js';
import { type AppsContext, defineApps } from '../apps/apps.js';
import type { ApiTokens } from '../credentials/tokens.js';
import { demoToken } from '../credentials/tokens.js';
import { CLINIC_USERS, seedClinics } from './demo_clinics.js';
import { DEMO_PUBLISHER, DEMO_USERS, DEMO_WORKSPACE } from './demo_users.js';

export { DEMO_PUBLISHER, DEMO_USERS, DEMO_WORKSPACE } from './demo_users.js';

interface OrderRow {
  id: number;
  region: string;
  customer: string;
  amount: number;
}

const LIST_ORDERS =
  'select id, region, customer, amount::float8 as amount from demo.orders order by id';

/**
 * The demo's orders world, as an apps module (`loadApps('demo')` serves it with the clinics
 * module, only when the demo was seeded): each runnable reads `demo.orders` as the viewer.
 * `childRunUrl` gives the server's job-token route for a workspace (built by the server from
 * validated parts only), for the runnable that starts a child over HTTP with its job token.
 */
export default defineApps(({ childRunUrl }: AppsContext) => {
  const listAsViewer = async (ctx: RunContext): Promise<OrderRow[]> => {
    const client = await ctx.datatable('main', { as: 'viewer' });
    return (await client.query<OrderRow>(LIST_ORDERS)).rows;
  };
  const runnables: Record<string, RunnableDefinition> = {
    'f/orders/list': { cacheTtlS: 60, fn: (_args, ctx) => listAsViewer(ctx) },
    'f/orders/list_sql': {
      kind: 'sql',
      database: 'datatable://main?as=viewer',
      sql: LIST_ORDERS,
      cacheTtlS: 60,
    },
    'f/orders/by_region': {
      kind: 'sql',
      database: 'datatable://main?as=viewer',
      sql: `${LIST_ORDERS.replace(' order by id', '')} where region = $1 order by id`,
      params: ['region'],
      cacheTtlS: 60,
    },
    // A child job in process: it inherits this job's viewer and goes through the cache.
    'f/orders/summary': {
      cacheTtlS: 60,
      fn: async (_args, ctx) => {
        const rows = (await ctx.runChild('f/orders/list')) as OrderRow[];
        const totals: Record<string, number> = {};
        for (const row of rows) totals[row.region] = (totals[row.region] ?? 0) + row.amount;
        return { orders: rows.length, totals };
      },
    },
    // A child job over HTTP with this job's token (as a remote worker or flow step would).
    'f/orders/remote_child': {
      fn: async (_args, ctx) => {
        const response = await fetch(childRunUrl(ctx.workspace), {
          method: 'POST',
          headers: { authorization: `Bearer ${ctx.jobToken}`, 'content-type': 'application/json' },
          body: JSON.stringify({ path: 'f/orders/list', args: {} }),
          signal: ctx.signal,
        });
        const body = (await response.json()) as { result?: unknown; error?: { code?: unknown } };
        if (!response.ok) throw childFailure(response.status, body.error?.code);
        return body.result;
      },
    },
    'f/orders/whoami': {
      fn: async (_args, ctx) => {
        const client = await ctx.datatable('main', { as: 'viewer' });
        return (await client.query('select current_user as login')).rows[0];
      },
    },
  };
  const paths = Object.keys(runnables);
  return {
    workspace: DEMO_WORKSPACE,
    runnables,
    apps: {
      'orders-dashboard': { publisher: DEMO_PUBLISHER, public: false, runnables: paths },
      'orders-public': { publisher: DEMO_PUBLISHER, public: true, runnables: paths },
    },
    hooks: { 'orders-refresh': 'f/orders/list' },
    schedules: [{ name: 'orders-digest', path: 'f/orders/list', owner: DEMO_PUBLISHER }],
    // `viewer-cache audit --demo` runs these as every viewer: they only read. The child over
    // HTTP needs a running server, which the audit does not start.
    audit: {
      runnables: {
        'f/orders/list': true,
        'f/orders/list_sql': true,
        'f/orders/by_region': { args: { region: 'emea' } },
        'f/orders/summary': true,
        'f/orders/whoami': true,
      },
    },
  };
});

/**
 * The error a child run's refusal becomes in its parent, keeping the child's code and status (a
 * child's E_NO_VIEWER is the parent's 403 E_NO_VIEWER, not a runnable failure). A code the
 * library does not know becomes a generic refusal with the child's 4xx status; a 5xx without a
 * known code is the parent's runnable failure.
 */
function childFailure(status: number, code: unknown): Error {
  const Coded = errorClassOf(code);
  if (Coded !== undefined) return new Coded();
  if (status >= 400 && status < 500) {
    const known = typeof code === 'string' && /^E_[A-Z_]{1,40}$/.test(code);
    return new ViewerCacheError('the child run was refused', {
      code: known ? code : 'E_CHILD_REFUSED',
      status,
    });
  }
  return new Error(`child run failed with status ${status}`);
}

/**
 * Seeds the demo workspace; every step is idempotent. It runs only when asked
 * (VIEWER_CACHE_DEMO=true, `serve --demo`) or on the embedded default. `rolePrefix` lets tests
 * share a cluster (roles are cluster-wide).
 */
export async function seedDemo(options: {
  datatables: Datatables;
  databaseUrl: string;
  tokens: ApiTokens;
  secretKey: string;
  rolePrefix?: string;
}): Promise<{ tokens: Record<string, string>; roles: { emea: string; amer: string } }> {
  const client = new pg.Client({ connectionString: options.databaseUrl });
  // A connection dying mid-seed fails the query in flight; without a listener it would also be
  // an unhandled 'error' event.
  client.on('error', () => {});
  await client.connect();
  try {
    // Several servers started together on a fresh database would otherwise race on every step
    // (CREATE ROLE, CREATE SCHEMA, policies): one seeds, the others wait, then find it done.
    // A session lock, released when this connection ends, however the seed ends.
    await client.query('select pg_advisory_lock($1)', [DEMO_SEED_LOCK.toString()]);
    return await seedLocked(client, options);
  } finally {
    await client.end().catch(() => {});
  }
}

/** Serialises demo seeding across processes ('vcdemo' in ASCII). */
const DEMO_SEED_LOCK = 0x7663_6465_6d6fn;

async function seedLocked(
  client: pg.Client,
  options: Parameters<typeof seedDemo>[0],
): Promise<{ tokens: Record<string, string>; roles: { emea: string; amer: string } }> {
  const { datatables, databaseUrl, tokens, secretKey } = options;
  const admin = datatables.admin;
  const emea = `${options.rolePrefix ?? ''}sales_emea`;
  const amer = `${options.rolePrefix ?? ''}sales_amer`;
  const database = new URL(databaseUrl).pathname.slice(1) || 'postgres';

  await admin.createDatatable(DEMO_WORKSPACE, 'main', { database });
  const existing = new Set((await admin.listRoles(DEMO_WORKSPACE)).map((role) => role.name));
  // Memberships are seeded once: a later start must not undo a revocation made with the CLI.
  const firstStart = existing.size === 0;
  if (!existing.has(emea))
    await admin.createRole(DEMO_WORKSPACE, 'main', emea, { tenants: ['group:emea'] });
  if (!existing.has(amer))
    await admin.createRole(DEMO_WORKSPACE, 'main', amer, { tenants: ['group:amer'] });

  await withTransaction(client, async () => {
    await client.query('create schema if not exists demo');
    await client.query(
      `create table if not exists demo.orders (
         id int primary key, region text not null, customer text not null, amount numeric not null)`,
    );
    await client.query(
      `insert into demo.orders values
         (1, 'emea', 'Acme GmbH', 1200), (2, 'amer', 'Globex Inc', 800), (3, 'emea', 'Initech SA', 430),
         (4, 'amer', 'Umbrella LLC', 2100), (5, 'apac', 'Tyrell KK', 990)
       on conflict (id) do nothing`,
    );
    await client.query('alter table demo.orders enable row level security');
    const e = pg.escapeIdentifier(emea);
    const a = pg.escapeIdentifier(amer);
    await client.query(`grant usage on schema demo to ${e}, ${a}`);
    await client.query(`grant select on demo.orders to ${e}, ${a}`);
    // Policies test membership, which holds for a role's own login and for a set login alike.
    for (const [name, region, role] of [
      ['orders_emea', 'emea', emea],
      ['orders_amer', 'amer', amer],
    ] as const) {
      await client.query(`drop policy if exists ${name} on demo.orders`);
      await client.query(
        `create policy ${name} on demo.orders for select using (region = ${pg.escapeLiteral(region)} and pg_has_role(current_user, ${pg.escapeLiteral(role)}, 'member'))`,
      );
    }
  });

  await seedClinics({
    datatables,
    databaseUrl,
    workspace: DEMO_WORKSPACE,
    ...(options.rolePrefix === undefined ? {} : { rolePrefix: options.rolePrefix }),
  });

  const known = new Map<string, string>();
  if (firstStart) {
    for (const [email, groups] of Object.entries(DEMO_USERS)) {
      for (const group of groups) await admin.addMembership(DEMO_WORKSPACE, email, 'group', group);
    }
    const last = await admin.addMembership(DEMO_WORKSPACE, DEMO_PUBLISHER, 'admin', 'workspace');
    await datatables.waitForGeneration(last.generation);
  }
  for (const email of [...Object.keys(DEMO_USERS), ...Object.keys(CLINIC_USERS), DEMO_PUBLISHER]) {
    const token = demoToken(secretKey, email);
    await tokens.store(DEMO_WORKSPACE, email, token, 'demo');
    known.set(email, token);
  }
  return { tokens: Object.fromEntries(known), roles: { emea, amer } };
}
