import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createExecutor,
  type DatatableRequest,
  type Executor,
  MemoryCacheStore,
  type RunContext,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor, WS } from '../../helpers/orders_db.js';

// SPEC invariant 20: a runnable may ask for the viewer's connection narrowed to some of the
// viewer's own roles (`{ as: 'viewer', roles }`, `?as=viewer&roles=…`). It gets exactly those
// roles' privileges and policies — the login of that subset, the identity still bound — is
// refused (E_ROLE_REQUIRED) when the viewer holds none of them, cannot widen back, and the
// narrowing is part of the entry's key. Carol holds sales_emea and sales_amer; `orders` shows
// each role its region (emea: 1, 3; amer: 2; apac: 4).

let fx: OrdersDb;
let executor: Executor;
let cached: CachedExecutor;
const CAROL = 'carol@example.com';
const ALICE = 'alice@example.com';

/** What a connection is: who it logs in as, what the policies let it see, who the viewer is. */
async function describeConnection(ctx: RunContext, request: DatatableRequest) {
  const db = await ctx.datatable('main', request);
  const ids = (await db.query<{ id: number }>('select id from orders order by id')).rows;
  const who = (
    await db.query<{ session_user: string; current_user: string; viewer: string }>(
      'select session_user, current_user, viewer_cache.viewer_email() as viewer',
    )
  ).rows[0]!;
  return { ids: ids.map((row) => row.id), ...who };
}

/** The SQLSTATE of a statement the runnable tried, or 'ok'. */
async function attempt(db: { query(text: string): Promise<unknown> }, text: string) {
  try {
    await db.query(text);
    return 'ok';
  } catch (err) {
    return (err as { code?: string }).code ?? 'no code';
  }
}

beforeAll(async () => {
  fx = await ordersDb();
  const roles = (...names: string[]) => names.map((name) => `${fx.prefix}${name}`);
  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      wide: { cacheTtlS: 60, fn: (_args, ctx) => describeConnection(ctx, { as: 'viewer' }) },
      emea: {
        cacheTtlS: 60,
        fn: (_args, ctx) => describeConnection(ctx, { as: 'viewer', roles: roles('sales_emea') }),
      },
      emeaAmer: {
        cacheTtlS: 60,
        fn: (_args, ctx) =>
          describeConnection(ctx, { as: 'viewer', roles: roles('sales_amer', 'sales_emea') }),
      },
      emeaApac: {
        cacheTtlS: 60,
        fn: (_args, ctx) =>
          describeConnection(ctx, { as: 'viewer', roles: roles('sales_emea', 'sales_apac') }),
      },
      apac: {
        fn: (_args, ctx) => describeConnection(ctx, { as: 'viewer', roles: roles('sales_apac') }),
      },
      typo: {
        fn: (_args, ctx) =>
          describeConnection(ctx, { as: 'viewer', roles: roles('sales_emea', 'sales_emae') }),
      },
      // Tries every way back to the viewer's other roles, then says what it can see.
      widen: {
        fn: async (_args, ctx) => {
          const db = await ctx.datatable('main', { as: 'viewer', roles: roles('sales_emea') });
          const [amer] = roles('sales_amer');
          const tried = {
            setRole: await attempt(db, `set role ${amer}`),
            setSessionAuthorization: await attempt(db, `set session authorization ${amer}`),
            grantSelf: await attempt(db, `grant ${amer} to current_user`),
            resetRole: await attempt(db, 'reset role'),
          };
          const ids = (await db.query<{ id: number }>('select id from orders order by id')).rows;
          return { tried, ids: ids.map((row) => row.id) };
        },
      },
      sql: {
        kind: 'sql',
        cacheTtlS: 60,
        database: `datatable://main?as=viewer&roles=${fx.prefix}sales_emea`,
        sql: 'select id from orders order by id',
      },
    },
  });
  cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: fx.datatables.fingerprint,
  });
});

afterAll(async () => {
  await fx?.close();
});

const run = (path: string, viewer: string | null = CAROL) => runFor(executor, path, app(viewer));
const runCached = (path: string, viewer: string | null = CAROL) =>
  runFor(executor, path, app(viewer), { through: cached });

describe('a viewer connection narrowed to named roles', () => {
  it("a held role: that role's own login, its policy only, the viewer's identity bound", async () => {
    expect((await run('wide')).value).toMatchObject({ ids: [1, 2, 3], viewer: CAROL });
    expect((await run('emea')).value).toEqual({
      ids: [1, 3],
      session_user: fx.EMEA,
      current_user: fx.EMEA,
      viewer: CAROL,
    });
    expect((await run('sql')).value).toEqual([{ id: 1 }, { id: 3 }]);
  });

  it('two named roles: the set login of exactly those two', async () => {
    const both = (await run('emeaAmer')).value as { ids: number[]; session_user: string };
    expect(both.ids).toEqual([1, 2, 3]);
    expect(both.session_user).toMatch(/^wm_set_/);
    const { rows } = await fx.sql.query<{ roles: string[] }>(
      `select array_agg(r.rolname::text order by r.rolname) as roles
         from pg_auth_members m join pg_roles r on r.oid = m.roleid
         join pg_roles l on l.oid = m.member where l.rolname = $1`,
      [both.session_user],
    );
    expect(rows[0]!.roles).toEqual([fx.AMER, fx.EMEA].sort());
  });

  it('some of the named roles held: the held ones only', async () => {
    expect((await run('emeaApac')).value).toMatchObject({ ids: [1, 3], session_user: fx.EMEA });
  });

  it('none of the named roles held: E_ROLE_REQUIRED before any query; refusal codes', async () => {
    await expect(run('apac')).rejects.toMatchObject({
      code: 'E_ROLE_REQUIRED',
      status: 403,
      datatable: 'main',
    });
    // Alice holds sales_emea only.
    await expect(run('emeaAmer', ALICE)).resolves.toMatchObject({
      value: { ids: [1, 3], session_user: fx.EMEA },
    });
    await expect(run('emea', 'dave@example.com')).rejects.toMatchObject({
      code: 'E_ROLE_REQUIRED',
    });
    await expect(run('emea', null)).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    await expect(run('typo')).rejects.toMatchObject({
      code: 'E_UNKNOWN_ROLE',
      role: `${fx.prefix}sales_emae`,
    });
    // A refusal is never cached.
    for (let i = 0; i < 2; i++)
      await expect(runCached('apac')).rejects.toMatchObject({ code: 'E_ROLE_REQUIRED' });
  });

  it('the runnable cannot widen back to the viewer’s other roles', async () => {
    expect((await run('widen')).value).toEqual({
      tried: {
        setRole: '42501',
        setSessionAuthorization: '42501',
        grantSelf: '42501',
        resetRole: 'ok',
      },
      ids: [1, 3],
    });
    // The connection went back to its pool reset: the next narrowed run is as narrow.
    expect((await run('emea')).value).toMatchObject({ ids: [1, 3], current_user: fx.EMEA });
  });

  it('is part of the key: a role change invalidates exactly the entries whose grant it alters', async () => {
    for (const path of ['wide', 'emea', 'emeaAmer']) {
      await runCached(path);
      expect((await runCached(path)).fromCache, path).toBe(true);
    }
    // The narrowed run and the unnarrowed one are keyed on different questions.
    const fingerprints = await Promise.all(
      ['wide', 'emea'].map((path) =>
        fx.datatables.fingerprint(
          executor.createJob({
            workspace: WS,
            path,
            runAs: 'publisher@example.com',
            origin: app(CAROL),
          }),
        ),
      ),
    );
    expect(fingerprints[0]).not.toBe(fingerprints[1]);

    // Carol joins apac: her full grant moves; the narrowings to emea (and emea+amer) do not.
    const joined = await fx.datatables.admin.addMembership(WS, CAROL, 'group', 'apac');
    await fx.settle(joined.generation);
    const wide = await runCached('wide');
    expect(wide.fromCache).toBe(false);
    expect((wide.value as { ids: number[] }).ids).toEqual([1, 2, 3, 4]);
    for (const path of ['emea', 'emeaAmer'])
      expect((await runCached(path)).fromCache, path).toBe(true);

    // Carol leaves emea: the emea narrowing is refused on her next run, never served from before.
    const left = await fx.datatables.admin.removeMembership(WS, CAROL, 'group', 'emea');
    await fx.settle(left.generation);
    await expect(runCached('emea')).rejects.toMatchObject({ code: 'E_ROLE_REQUIRED' });
    const narrowed = await runCached('emeaAmer');
    expect(narrowed.fromCache).toBe(false);
    expect(narrowed.value).toMatchObject({ ids: [2], session_user: fx.AMER });
  });
});
