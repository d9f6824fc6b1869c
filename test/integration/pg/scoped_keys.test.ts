import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  type JobResult,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { type OrdersDb, ordersDb, WS } from '../../helpers/orders_db.js';

// Scoped API keys (issue 9 §4), on real data tables: a run made with a key scoped to some roles
// holds the owner's roles ∩ the key's — as the viewer, by role name, in ctx.hasRole, in a child
// job — never more; an empty intersection is E_NO_ROLES; and a scoped run's cache entries are
// never the owner's (nor another scope's), whichever runs first on a fresh authorization memo.

const OWNER = 'olga@example.com';
const ALL_ROWS = [1, 2, 3, 4];
const EMEA_ROWS = [1, 3];

let fx: OrdersDb;
/** Catalog ids: E, A, P are the owner's (groups emea, amer, apac); Z is nobody's she is in. */
let E: number;
let A: number;
let P: number;
let Z: number;
let Z_NAME: string;
let executions = 0;

function executorFor(datatables: Datatables): Executor {
  return createExecutor({
    datatables,
    runnables: {
      rows: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          executions++;
          const db = await ctx.datatable('main', { as: 'viewer' });
          const { rows } = await db.query<{ id: number; login: string }>(
            'select id, current_user::text as login from orders order by id',
          );
          return { ids: rows.map((r) => r.id), login: rows[0]?.login ?? null };
        },
      },
      asks: {
        fn: async (_args, ctx) =>
          Object.fromEntries(
            await Promise.all(
              [fx.EMEA, fx.AMER, fx.APAC, Z_NAME].map(async (name) => [
                name,
                await ctx.hasRole('main', name),
              ]),
            ),
          ),
      },
      by_name: {
        fn: async (args, ctx) => {
          const db = await ctx.datatable('main', { role: String(args['role']) });
          return (await db.query('select current_user::text as login')).rows[0];
        },
      },
      parent: { cacheTtlS: 300, fn: (_args, ctx) => ctx.runChild('rows') },
    },
  });
}

/** A direct run by the owner (runner and viewer), with the key's scope when given. */
function run(
  executor: Executor,
  path: string,
  roleScope?: number[],
  options: { through?: CachedExecutor; args?: Record<string, unknown> } = {},
): Promise<JobResult> {
  const job = executor.createJob({
    workspace: WS,
    path,
    runAs: OWNER,
    origin: { kind: 'run', caller: { email: OWNER } },
    ...(roleScope === undefined ? {} : { roleScope }),
    ...(options.args === undefined ? {} : { args: options.args }),
  });
  return (options.through ?? executor).run(job);
}

const value = (result: JobResult) => result.value as { ids: number[]; login: string };

beforeAll(async () => {
  fx = await ordersDb();
  const { admin } = fx.datatables;
  Z_NAME = `${fx.prefix}other`;
  await admin.createRole(WS, 'main', Z_NAME, { tenants: ['user:nobody@example.com'] });
  let generation = 0;
  for (const group of ['emea', 'amer', 'apac']) {
    ({ generation } = await admin.addMembership(WS, OWNER, 'group', group));
  }
  await fx.datatables.waitForGeneration(generation);
  const oid = new Map((await admin.listRoles(WS)).map((r) => [r.name, r.oid]));
  [E, A, P, Z] = [fx.EMEA, fx.AMER, fx.APAC, Z_NAME].map((name) => oid.get(name)!) as [
    number,
    number,
    number,
    number,
  ];
});

afterAll(async () => {
  await fx?.close();
});

describe('a scoped key resolves to the owner’s roles ∩ the key’s roles', () => {
  it('unscoped: all three roles; key {E, A}: those two, through their set login', async () => {
    const executor = executorFor(fx.datatables);
    expect(value(await run(executor, 'rows')).ids).toEqual(ALL_ROWS);
    const both = value(await run(executor, 'rows', [E, A]));
    expect(both.ids).toEqual([1, 2, 3]);
    expect(both.login).toMatch(/^wm_set_/);
    expect(P).toBeGreaterThan(0);
  });

  it('key {E, Z} (Z not hers): E only, through E’s own login', async () => {
    const got = value(await run(executorFor(fx.datatables), 'rows', [E, Z]));
    expect(got).toEqual({ ids: EMEA_ROWS, login: fx.EMEA });
  });

  it('key {Z} or {} (empty intersection): E_NO_ROLES, never the owner’s full roles', async () => {
    const executor = executorFor(fx.datatables);
    for (const scope of [[Z], []]) {
      await expect(run(executor, 'rows', scope)).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    }
  });

  it('ctx.hasRole sees the scoped set', async () => {
    const executor = executorFor(fx.datatables);
    expect((await run(executor, 'asks', [A, Z])).value).toEqual({
      [fx.EMEA]: false,
      [fx.AMER]: true,
      [fx.APAC]: false,
      [Z_NAME]: false,
    });
  });

  it('?role= is narrowed too: a role outside the scope is E_ROLE_NOT_PERMITTED', async () => {
    const executor = executorFor(fx.datatables);
    const args = { role: fx.EMEA };
    expect((await run(executor, 'by_name', undefined, { args })).value).toEqual({ login: fx.EMEA });
    expect((await run(executor, 'by_name', [E], { args })).value).toEqual({ login: fx.EMEA });
    await expect(run(executor, 'by_name', [A], { args })).rejects.toMatchObject({
      code: 'E_ROLE_NOT_PERMITTED',
      role: fx.EMEA,
    });
  });

  it('a child job of a scoped run keeps the scope (cached, and not the owner’s entry)', async () => {
    const executor = executorFor(fx.datatables);
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: fx.datatables.fingerprint,
    });
    // The owner's own child entry exists first: the scoped parent's child must not reuse it.
    expect(value(await run(executor, 'rows', undefined, { through: cached })).ids).toEqual(
      ALL_ROWS,
    );
    expect(value(await run(executor, 'parent', [E], { through: cached })).ids).toEqual(EMEA_ROWS);
  });
});

describe('a scoped key never shares cache entries with its owner, nor with another scope', () => {
  // Each order on a fresh Datatables instance, so its authorization memo starts empty and the
  // first job's memoised authorization (and runner part) is there when the second one asks.
  for (const order of ['owner first', 'key first'] as const) {
    it(`${order}: each a miss once and then its own hit, with its own rows`, async () => {
      const datatables = await fx.open();
      const executor = executorFor(datatables);
      const cached = withResultCache(executor, {
        store: new MemoryCacheStore(),
        fingerprint: datatables.fingerprint,
      });
      const runs: Array<[number[] | undefined, number[]]> = [
        [undefined, ALL_ROWS],
        [[E], EMEA_ROWS],
      ];
      if (order === 'key first') runs.reverse();
      for (const [scope, rows] of runs) {
        const before = executions;
        const miss = await run(executor, 'rows', scope, { through: cached });
        expect(miss.fromCache).toBe(false);
        expect(value(miss).ids).toEqual(rows);
        expect(executions).toBe(before + 1);
      }
      for (const [scope, rows] of runs) {
        const hit = await run(executor, 'rows', scope, { through: cached });
        expect(hit.fromCache).toBe(true);
        expect(value(hit).ids).toEqual(rows);
      }
      // A key of another scope with the same effective roles still has its own entry.
      const other = await run(executor, 'rows', [E, Z], { through: cached });
      expect(other.fromCache).toBe(false);
      expect(value(other).ids).toEqual(EMEA_ROWS);
      // And the fingerprints of the two scopes differ from the owner's.
      const job = (roleScope?: number[]) =>
        executor.createJob({
          workspace: WS,
          path: 'rows',
          runAs: OWNER,
          origin: { kind: 'run', caller: { email: OWNER } },
          ...(roleScope === undefined ? {} : { roleScope }),
        });
      expect(await datatables.fingerprint(job([E]))).not.toBe(await datatables.fingerprint(job()));
    });
  }
});

describe('a role of the scope that goes away drops out of the intersection', () => {
  it('key {E}, then E disabled: E_NO_ROLES, and the cached entry is not served', async () => {
    const executor = executorFor(fx.datatables);
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: fx.datatables.fingerprint,
    });
    expect(value(await run(executor, 'rows', [E], { through: cached })).ids).toEqual(EMEA_ROWS);
    expect((await run(executor, 'rows', [E], { through: cached })).fromCache).toBe(true);
    const { generation } = await fx.datatables.admin.disableRole(WS, fx.EMEA);
    await fx.settle(generation);
    try {
      await expect(run(executor, 'rows', [E], { through: cached })).rejects.toMatchObject({
        code: 'E_NO_ROLES',
      });
      // The owner keeps her other roles; the key does not fall back to them.
      expect(value(await run(executor, 'rows')).ids).toEqual([2, 4]);
    } finally {
      await fx.settle((await fx.datatables.admin.enableRole(WS, fx.EMEA)).generation);
    }
  });
});
