import pg from 'pg';
import { inject } from 'vitest';
import {
  createDatatablesWithHooks,
  type Datatables,
  type DatatablesTestHooks,
  type RawDatatablesOptions,
} from '../../src/datatable/datatables.js';
import { PasswordDeriver } from '../../src/datatable/logins/passwords.js';
import type { Executor, JobExecutor, RunOrigin } from '../../src/index.js';
import { asAdmin, createTestDatabase, type TestDatabase, uniquePrefix } from './pg.js';

/**
 * The seed's example on a database of its own: `orders` with RLS by region, data-table roles
 * `<prefix>sales_emea`, `<prefix>sales_amer` and `<prefix>sales_apac` (tenants `group:emea`,
 * `group:amer`, `group:apac`), and viewers alice (emea), bob (amer) and carol (emea + amer).
 * Every role name carries the file's prefix: roles are cluster-wide and files run in parallel.
 */
export const WS = 'demo';
export const PUBLISHER = 'publisher@example.com';
export const SECRET_KEY = 'test-secret-key-0123456789abcdef-0123456789';
export const ROWS: Record<string, number[]> = {
  emea: [1, 3],
  amer: [2],
  apac: [4],
};

export interface OrdersDb {
  readonly prefix: string;
  readonly db: TestDatabase;
  readonly EMEA: string;
  readonly AMER: string;
  readonly APAC: string;
  /** Superuser connections to the database, for looking behind the library's back. */
  readonly sql: pg.Pool;
  /** The first `createDatatables` on the database (migrations already applied). */
  readonly datatables: Datatables;
  /** Another "process" on the same database; closed with the fixture. */
  open(options?: Partial<RawDatatablesOptions>, hooks?: DatatablesTestHooks): Promise<Datatables>;
  /** Waits until every open instance has loaded `generation`. */
  settle(generation: number): Promise<void>;
  close(): Promise<void>;
}

export async function ordersDb(options: Partial<RawDatatablesOptions> = {}): Promise<OrdersDb> {
  const prefix = uniquePrefix();
  const db = await createTestDatabase(prefix);
  const EMEA = `${prefix}sales_emea`;
  const AMER = `${prefix}sales_amer`;
  const APAC = `${prefix}sales_apac`;
  const instances: Datatables[] = [];
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  const open = async (
    more: Partial<RawDatatablesOptions> = {},
    hooks: DatatablesTestHooks = {},
  ) => {
    const datatables = await createDatatablesWithHooks(
      {
        connection: db.url,
        secretKey: SECRET_KEY,
        // Most suites test what a run does on its own; prepare_ahead.test.ts turns this on.
        pools: { prepareAhead: false },
        ...options,
        ...more,
      },
      hooks,
    );
    instances.push(datatables);
    return datatables;
  };
  let datatables: Datatables;
  try {
    datatables = await open();
    const { admin } = datatables;
    await admin.createDatatable(WS, 'main', { database: db.name });
    await admin.createRole(WS, 'main', EMEA, { tenants: ['group:emea'] });
    await admin.createRole(WS, 'main', AMER, { tenants: ['group:amer'] });
    await admin.createRole(WS, 'main', APAC, { tenants: ['group:apac'] });
    await asAdmin(db.name, async (c) => {
      await c.query(
        'create table orders (id int primary key, region text not null, amount int not null)',
      );
      await c.query(
        `insert into orders values (1, 'emea', 10), (2, 'amer', 20), (3, 'emea', 30), (4, 'apac', 40)`,
      );
      await c.query('alter table orders enable row level security');
      for (const [region, role] of [
        ['emea', EMEA],
        ['amer', AMER],
        ['apac', APAC],
      ] as const) {
        await c.query(`grant select on orders to ${role}`);
        await c.query(
          `create policy ${region} on orders for select using (region = '${region}' and pg_has_role(current_user, '${role}', 'member'))`,
        );
      }
    });
    let generation = 0;
    for (const [email, group] of [
      ['alice@example.com', 'emea'],
      ['bob@example.com', 'amer'],
      ['carol@example.com', 'emea'],
      ['carol@example.com', 'amer'],
    ] as const) {
      ({ generation } = await admin.addMembership(WS, email, 'group', group));
    }
    await datatables.waitForGeneration(generation);
  } catch (err) {
    await Promise.allSettled(instances.map((instance) => instance.close()));
    await sql.end();
    await db.drop();
    throw err;
  }
  return {
    prefix,
    db,
    EMEA,
    AMER,
    APAC,
    sql,
    datatables,
    open,
    async settle(generation) {
      await Promise.all(instances.map((instance) => instance.waitForGeneration(generation)));
    },
    async close() {
      await Promise.allSettled(instances.map((instance) => instance.close()));
      await sql.end();
      await db.drop();
    },
  };
}

/** An app request by `viewer` (null: an anonymous visitor). */
export function app(viewer: string | null): RunOrigin {
  return { kind: 'app', session: viewer === null ? null : { email: viewer } };
}

/** Builds the job with `executor` and runs it through `through` (a cache, or the executor). */
export function runFor(
  executor: Executor,
  path: string,
  origin: RunOrigin,
  options: { through?: JobExecutor; runAs?: string; args?: Record<string, unknown> } = {},
) {
  const job = executor.createJob({
    workspace: WS,
    path,
    runAs: options.runAs ?? PUBLISHER,
    origin,
    ...(options.args === undefined ? {} : { args: options.args }),
  });
  return (options.through ?? executor).run(job);
}

/** Connection settings of the cluster under test, for logging in as a data-table login. */
export function loginConfig(database: string, user: string, password: string): pg.ClientConfig {
  const url = new URL(inject('pgAdminUrl'));
  return {
    host: url.hostname,
    port: Number(url.port || 5432),
    database,
    user,
    password,
    application_name: 'viewer-cache-test-probe',
  };
}

/** Whether `user` can log in to `database` with `password` (scram-sha-256). */
export async function canAuthenticate(
  database: string,
  user: string,
  password: string,
): Promise<boolean> {
  const client = new pg.Client(loginConfig(database, user, password));
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('select 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

const deriver = new PasswordDeriver(SECRET_KEY);

/** Anything that runs a query as the superuser on the test database. */
export type Sql = Pick<pg.Pool, 'query'>;

/** Every `viewer_cache.role_set` row, with the password derived from its secret. */
export async function setLoginRows(
  c: Sql,
): Promise<{ login: string; roleOids: number[]; password: string }[]> {
  const { rows } = await c.query<{ login: string; role_oids: number[]; secret: Buffer }>(
    'select login::text as login, role_oids, secret from viewer_cache.role_set order by login',
  );
  return rows.map((row) => ({
    login: row.login,
    roleOids: row.role_oids.map(Number).sort((a, b) => a - b),
    password: deriver.forSet(row.login, row.secret),
  }));
}

/** The managed password of each data-table role's own login, by name. */
export async function roleLoginPasswords(c: Sql): Promise<Map<string, string>> {
  const { rows } = await c.query<{ oid: number; name: string; secret: Buffer }>(
    'select oid, name, secret from viewer_cache.role',
  );
  return new Map(rows.map((row) => [row.name, deriver.forRole(row.oid, row.secret)]));
}

/** `wm_set_` logins on the cluster that hold any of `roles`, with the roles they hold. */
export async function setLoginsHolding(
  c: Sql,
  roles: readonly string[],
): Promise<{ login: string; canLogin: boolean; memberOf: string[] }[]> {
  const { rows } = await c.query<{ login: string; can_login: boolean; member_of: string[] }>(
    `select l.rolname::text as login, l.rolcanlogin as can_login,
            array(select r.rolname::text from pg_auth_members m2
                    join pg_roles r on r.oid = m2.roleid
                   where m2.member = l.oid order by r.rolname) as member_of
       from pg_roles l
      where l.rolname like 'wm\\_set\\_%'
        and exists (select 1 from pg_auth_members m join pg_roles r on r.oid = m.roleid
                     where m.member = l.oid and r.rolname = any($1))
      order by 1`,
    [roles],
  );
  return rows.map((row) => ({
    login: row.login,
    canLogin: row.can_login,
    memberOf: row.member_of,
  }));
}

/** A Postgres role's attributes, or null when it does not exist. */
export async function pgRole(
  c: Sql,
  name: string,
): Promise<{ oid: number; canLogin: boolean } | null> {
  const { rows } = await c.query<{ oid: number; rolcanlogin: boolean }>(
    'select oid, rolcanlogin from pg_roles where rolname = $1',
    [name],
  );
  const row = rows[0];
  return row === undefined ? null : { oid: Number(row.oid), canLogin: row.rolcanlogin };
}
