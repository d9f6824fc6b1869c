export { waitUntil } from './wait.js';

import { expect, onTestFinished } from 'vitest';
import type { Datatables } from '../../src/datatable/datatables.js';
import { RoleSetProtocol } from '../../src/datatable/logins/role_set_protocol.js';
import { createExecutor, type Executor, ViewerCacheError } from '../../src/index.js';
import { countdown, deferred } from './deferred.js';
import { app, type OrdersDb, runFor, type Sql, WS } from './orders_db.js';

/**
 * Shared harness of the fault suites (issue 8): runnables that read the viewer's rows, hold
 * their connection open on demand, or run statements on it; a watch on uncaught errors; bounded
 * polling; and views of pg_stat_activity / pg_locks for the test's own database.
 */

export const ALICE = 'alice@example.com';
export const BOB = 'bob@example.com';
export const CAROL = 'carol@example.com';

export const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id'] as number);

/** A gate the `held` runnable waits at after connecting (and before querying). */
export interface Hold {
  arrive(): void;
  readonly gate: Promise<void>;
}

const OPEN: Hold = { arrive() {}, gate: Promise.resolve() };

/** A hold for `count` jobs: `arrived` once all have connected; `release()` lets them query. */
export function hold(count = 1) {
  const all = countdown(count);
  const gate = deferred();
  return {
    hold: { arrive: all.arrive, gate: gate.promise } satisfies Hold,
    arrived: all.done,
    release: () => gate.resolve(),
  };
}

/**
 * Runnables: `orders` (the viewer's order ids), `held` (connects, waits at the current hold,
 * then reads), `script` (runs `args.script` on the viewer's connection, then reads),
 * `whoami` (the login), `settings` (what the viewer's session starts with).
 */
export function faultExecutor(
  datatables: Datatables,
  current: () => Hold | undefined = () => undefined,
): Executor {
  return createExecutor({
    datatables,
    timeout: '20s',
    runnables: {
      orders: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      held: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          const h = current() ?? OPEN;
          h.arrive();
          await h.gate;
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      script: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          for (const statement of args['script'] as string[]) await client.query(statement);
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      whoami: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return (await client.query('select session_user::text as login')).rows[0]!['login'];
        },
      },
      settings: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          const { rows } = await client.query(
            `select session_user::text as login, current_setting('extra_float_digits') as efd,
                    current_setting('default_transaction_read_only') as ro`,
          );
          return rows[0];
        },
      },
    },
  });
}

export function run(executor: Executor, path: string, viewer: string, args?: object) {
  return runFor(executor, path, app(viewer), args === undefined ? {} : { args: { ...args } });
}

/** Rows a viewer gets through `executor` (throws what the run throws). */
export async function rowsOf(executor: Executor, viewer: string): Promise<number[]> {
  return (await run(executor, 'orders', viewer)).value as number[];
}

/**
 * {@link rowsOf} as a client would run it: a run whose connection was ended under it — by a
 * take-back that an earlier job's post-release check started, which ends the login's other
 * sessions — fails with E_CONNECTION_LOST, which says "retry"; it is retried once, and the retry
 * must succeed.
 */
export async function rowsRetrying(executor: Executor, viewer: string): Promise<number[]> {
  try {
    return await rowsOf(executor, viewer);
  } catch (err) {
    if ((err as { code?: string }).code !== 'E_CONNECTION_LOST') throw err;
    return rowsOf(executor, viewer);
  }
}

/**
 * Counts uncaught exceptions and unhandled rejections while the current test runs. With a
 * listener installed Node does not exit, so the test sees the count (vitest would also report
 * them; the count makes the failure point at the test that caused it).
 */
export function watchUncaught(): { readonly errors: unknown[] } {
  const errors: unknown[] = [];
  const onError = (err: unknown) => errors.push(err);
  process.on('uncaughtException', onError);
  process.on('unhandledRejection', onError);
  onTestFinished(() => {
    process.off('uncaughtException', onError);
    process.off('unhandledRejection', onError);
  });
  return { errors };
}

/** Resolves to 'timeout' if `promise` has not settled within `ms` (to assert it does). */
export function within<T>(promise: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

export interface Backend {
  pid: number;
  login: string;
  app: string;
  state: string | null;
}

/** Backends on the fixture's database opened by the library (logins, admin, listener). */
export async function libraryBackends(
  fx: OrdersDb,
  logins?: readonly string[],
): Promise<Backend[]> {
  const { rows } = await fx.sql.query<Backend>(
    `select pid, usename::text as login, application_name as app, state
       from pg_stat_activity
      where datname = $1 and application_name like 'viewer-cache%'
        and ($2::text[] is null or usename = any($2))
      order by pid`,
    [fx.db.name, logins ?? null],
  );
  return rows;
}

/** `pg_terminate_backend` on each pid, as an operator would. */
export async function terminate(c: Sql, pids: readonly number[]): Promise<void> {
  if (pids.length > 0)
    await c.query('select pg_terminate_backend(p) from unnest($1::int[]) p', [pids]);
}

/** Admin backends of the fixture's database holding a (per-login) advisory lock. */
export async function advisoryLockHolders(fx: OrdersDb): Promise<number[]> {
  const { rows } = await fx.sql.query<{ pid: number }>(
    `select distinct l.pid from pg_locks l
       join pg_stat_activity a on a.pid = l.pid
      where l.locktype = 'advisory' and l.granted and a.datname = $1
        and a.application_name = 'viewer-cache-admin'`,
    [fx.db.name],
  );
  return rows.map((row) => row.pid);
}

/** Whether some backend on the fixture's database waits for a lock (row or advisory). */
export async function someoneWaitsForALock(fx: OrdersDb): Promise<boolean> {
  const { rows } = await fx.sql.query(
    `select 1 from pg_stat_activity where datname = $1 and wait_event_type = 'Lock'`,
    [fx.db.name],
  );
  return rows.length > 0;
}

/** Expects `promise` to reject with a coded library error whose code is one of `codes`. */
export async function expectCoded(promise: Promise<unknown>, codes: readonly string[]) {
  const err = await promise.then(
    () => {
      throw new Error('expected the run to fail');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ViewerCacheError);
  expect(codes).toContain((err as ViewerCacheError).code);
  return err as ViewerCacheError;
}

let scenes = 0;

/** Two fresh roles (grants on orders as EMEA / AMER would have) and a viewer holding both. */
export async function newScene(fx: OrdersDb, tag: string) {
  const n = ++scenes;
  const group = `${tag}${n}`;
  const a = `${fx.prefix}${tag}${n}_a`;
  const b = `${fx.prefix}${tag}${n}_b`;
  const { admin } = fx.datatables;
  const ra = await admin.createRole(WS, 'main', a, { tenants: [`group:${group}`] });
  const rb = await admin.createRole(WS, 'main', b, { tenants: [`group:${group}`] });
  const viewer = `${tag}${n}@example.com`;
  const change = await admin.addMembership(WS, viewer, 'group', group);
  await fx.settle(change.generation);
  return {
    viewer,
    group,
    a,
    b,
    oids: [ra.oid, rb.oid],
    login: RoleSetProtocol.loginName([ra.oid, rb.oid]),
  };
}
export type Scene = Awaited<ReturnType<typeof newScene>>;

/**
 * SPEC invariant 8: no `wm_set_` login holding one of `oids` can log in, and no `role_set` row
 * names one of them. Checks logins by membership and by the names rows or scenes gave them.
 */
export async function expectNoSetLoginHolds(
  c: Sql,
  oids: readonly number[],
  names: readonly string[] = [],
): Promise<void> {
  const { rows } = await c.query<{ login: string }>(
    `select login::text as login from viewer_cache.role_set where role_oids && $1::oid[]`,
    [oids],
  );
  expect(rows.map((r) => r.login)).toEqual([]);
  const { rows: logins } = await c.query<{ login: string; can_login: boolean }>(
    `select l.rolname::text as login, l.rolcanlogin as can_login from pg_roles l
      where l.rolname like 'wm\\_set\\_%'
        and (l.rolname = any($2)
             or exists (select 1 from pg_auth_members m
                         where m.member = l.oid and m.roleid = any($1::oid[])))`,
    [oids, names],
  );
  expect(logins.filter((l) => l.can_login).map((l) => l.login)).toEqual([]);
}
