import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import pg from 'pg';
import { pino } from 'pino';
import { createDatatables, createViewerCache, type Job, withDatatableClient } from 'viewer-cache';
import { startEmbeddedPostgres } from 'viewer-cache/server';

// A data table read as the viewer, on a throwaway embedded PostgreSQL: row-level security
// answers per viewer, and the cache keeps each viewer's answer apart.

const dir = await mkdtemp(`${tmpdir()}/viewer-cache-example-`);
await chmod(dir, 0o711); // as root, PostgreSQL runs as the OS user `postgres`: it must enter
const port = await new Promise<number>((resolve) => {
  const probe = createServer().listen(0, '127.0.0.1', () => {
    const { port } = probe.address() as { port: number };
    probe.close(() => resolve(port));
  });
});
const postgres = await startEmbeddedPostgres(dir, port, pino({ level: 'warn' }));
const secretKey = 'example-secret-of-at-least-32-bytes!!';
const datatables = await createDatatables({ connection: postgres.url, secretKey });
try {
  // The data: orders by region, each region's rows visible to that region's role only.
  const sql = new pg.Client({ connectionString: postgres.url });
  await sql.connect();
  await sql.query(`create table if not exists orders (id int primary key, region text, amount int);
    insert into orders values (1, 'emea', 1200), (2, 'amer', 800) on conflict do nothing;
    alter table orders enable row level security`);
  const admin = datatables.admin;
  await admin.createDatatable('acme', 'main', { database: 'viewer_cache' });
  for (const region of ['emea', 'amer']) {
    await admin.createRole('acme', 'main', `sales_${region}`, { tenants: [`group:${region}`] });
    await sql.query(`grant select on orders to sales_${region};
      create policy ${region} on orders for select
        using (region = '${region}' and pg_has_role(current_user, 'sales_${region}', 'member'))`);
  }
  await sql.end();
  await admin.addMembership('acme', 'alice@acme.test', 'group', 'emea');
  const last = await admin.addMembership('acme', 'bob@acme.test', 'group', 'amer');
  await datatables.waitForGeneration(last.generation);

  // 1. A map of functions: `ctx.datatable('main', { as: 'viewer' })` is the viewer's connection.
  const cache = createViewerCache({
    datatables,
    workspace: 'acme',
    ttl: '60s',
    functions: {
      'f/orders': async (_args, ctx) => {
        const db = await ctx.datatable('main', { as: 'viewer' });
        return (await db.query('select id, region from orders order by id')).rows;
      },
    },
  });
  const as = (email: string) => ({ kind: 'app', session: { email } }) as const;
  const alice = await cache.run({ path: 'f/orders', origin: as('alice@acme.test') });
  const bob = await cache.run({ path: 'f/orders', origin: as('bob@acme.test') });
  console.log('alice sees', alice.value, 'bob sees', bob.value);
  console.log(
    'alice again, from the cache:',
    (await cache.run({ path: 'f/orders', origin: as('alice@acme.test') })).fromCache,
  );

  // 2. Your own executor: the datatables layer's connect, lent for the run and released after.
  const foreign = createViewerCache({
    datatables,
    workspace: 'acme',
    ttl: '60s',
    executor: (job: Job) =>
      withDatatableClient(
        datatables,
        job,
        'datatable://main?as=viewer',
        async (db) => (await db.query('select count(*)::int as orders from orders')).rows[0],
      ),
  });
  console.log(
    'bob counts',
    (await foreign.run({ path: 'f/count', origin: as('bob@acme.test') })).value,
  );
  const nobody = await foreign
    .run({ path: 'f/count', origin: { kind: 'schedule' } })
    .catch((e) => e);
  console.log('a schedule has no viewer:', (nobody as { code?: string }).code); // E_NO_VIEWER
  await cache.close();
  await foreign.close();
} finally {
  await datatables.close();
  await postgres.stop();
  await rm(dir, { recursive: true, force: true });
}
