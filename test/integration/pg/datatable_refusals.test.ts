import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createExecutor,
  type Executor,
  MemoryCacheStore,
  type RunOrigin,
  withResultCache,
} from '../../../src/index.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  ROWS,
  runFor,
  WS,
} from '../../helpers/orders_db.js';

// SPEC invariants 2, 5 and 11 on a real catalog: every way a connection request is refused, with
// its code, and that no refusal is ever kept in the cache.

let fx: OrdersDb;
let executor: Executor;
let DISABLED: string;
let OTHER_TABLE_ROLE: string;
const refusedCodes: string[] = [];

const ADMIN = 'wsadmin@example.com';
const DORA = 'dora@example.com';

beforeAll(async () => {
  fx = await ordersDb();
  const { admin } = fx.datatables;
  DISABLED = `${fx.prefix}retired`;
  OTHER_TABLE_ROLE = `${fx.prefix}other_reader`;
  // The publisher is a tenant (of EMEA): a no-viewer run falling back to perms.email would connect.
  await admin.setTenants(WS, fx.EMEA, ['group:emea', `user:${PUBLISHER}`]);
  // A workspace admin who is a tenant of nothing.
  await admin.addMembership(WS, ADMIN, 'admin', 'workspace');
  // A disabled role whose only tenant is dora (and which the publisher could use, were it enabled).
  await admin.createRole(WS, 'main', DISABLED, {
    tenants: [`user:${DORA}`, `user:${PUBLISHER}`],
  });
  await admin.disableRole(WS, DISABLED);
  // A second data table, and one in another workspace.
  await admin.createDatatable(WS, 'other', { database: fx.db.name });
  await admin.createRole(WS, 'other', OTHER_TABLE_ROLE, { tenants: ['*'] });
  await admin.createDatatable('elsewhere', 'secret', { database: fx.db.name });
  const last = await admin.addMembership(WS, DORA, 'group', 'nothing');
  await fx.settle(last.generation);
  fx.datatables.events.on('datatable:refused', ({ code }) => refusedCodes.push(code));

  executor = createExecutor({
    datatables: fx.datatables,
    runnables: {
      viewer_rows: {
        cacheTtlS: 60,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return (await client.query('select id from orders order by id')).rows.map((r) => r['id']);
        },
      },
      viewer_sql: {
        kind: 'sql',
        database: 'datatable://main?as=viewer',
        sql: 'select id from orders order by id',
        cacheTtlS: 60,
      },
      viewer_of: {
        fn: async (args, ctx) => {
          await ctx.datatable(String(args['name']), { as: 'viewer' });
          return 'connected';
        },
      },
      by_role: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { role: String(args['role']) });
          const user = (await client.query('select current_user as u')).rows[0]!['u'];
          const ids = (await client.query('select id from orders order by id')).rows.map(
            (r) => r['id'],
          );
          return { user, ids };
        },
      },
      by_default: {
        cacheTtlS: 60,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main');
          const user = (await client.query('select current_user as u')).rows[0]!['u'];
          const ids = (await client.query('select id from orders order by id')).rows.map(
            (r) => r['id'],
          );
          return { user, ids };
        },
      },
    },
  });
});

afterAll(async () => {
  await fx?.close();
});

const run = (
  path: string,
  origin: RunOrigin,
  options: { runAs?: string; args?: Record<string, unknown> } = {},
) => runFor(executor, path, origin, options);

describe('no viewer → E_NO_VIEWER, never resolved as perms.email', () => {
  const noViewer: [string, RunOrigin][] = [
    ['a schedule', { kind: 'schedule' }],
    ['a trigger', { kind: 'trigger' }],
    ['an AI-agent tool step', { kind: 'agent-tool' }],
    ['an anonymous app visitor', app(null)],
    [
      'a child of a job without a viewer',
      { kind: 'job-token', parent: { perms: { email: PUBLISHER, endUserEmail: null } } },
    ],
  ];

  it('the publisher really is a tenant: by name, the same job origin connects as EMEA', async () => {
    const result = await run('by_role', { kind: 'schedule' }, { args: { role: fx.EMEA } });
    expect(result.value).toEqual({ user: fx.EMEA, ids: ROWS['emea'] });
  });

  for (const [what, origin] of noViewer) {
    it(`${what}: TS and SQL runnables are refused`, async () => {
      const before = refusedCodes.length;
      await expect(run('viewer_rows', origin)).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
      await expect(run('viewer_sql', origin)).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
      expect(refusedCodes.slice(before)).toEqual(['E_NO_VIEWER', 'E_NO_VIEWER']);
    });
  }

  it('the refusal says why without naming anyone', async () => {
    const err = (await run('viewer_rows', { kind: 'schedule' }).then(
      () => new Error('not refused'),
      (e: unknown) => e,
    )) as Error;
    expect(err).toMatchObject({ code: 'E_NO_VIEWER', status: 403 });
    expect(err.message).not.toContain(PUBLISHER);
  });
});

describe('roles come only from tenant lists', () => {
  it('a viewer with no roles → E_NO_ROLES', async () => {
    await expect(run('viewer_rows', app('dave@example.com'))).rejects.toMatchObject({
      code: 'E_NO_ROLES',
    });
    await expect(run('viewer_sql', app('dave@example.com'))).rejects.toMatchObject({
      code: 'E_NO_ROLES',
    });
  });

  it('a workspace admin who is a tenant of nothing → E_NO_ROLES as a viewer (never admin)', async () => {
    await expect(run('viewer_rows', app(ADMIN))).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    await expect(
      run('viewer_rows', { kind: 'run', caller: { email: ADMIN } }),
    ).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    // …even when the admin is also the job's runner.
    await expect(run('viewer_rows', app(ADMIN), { runAs: ADMIN })).rejects.toMatchObject({
      code: 'E_NO_ROLES',
    });
  });

  it('a disabled role is not resolved: its only tenant → E_NO_ROLES', async () => {
    await expect(run('viewer_rows', app(DORA))).rejects.toMatchObject({ code: 'E_NO_ROLES' });
  });

  it('a role of another data table does not count', async () => {
    // OTHER_TABLE_ROLE names everyone (`*`), but on data table `other`.
    await expect(run('viewer_rows', app('dave@example.com'))).rejects.toMatchObject({
      code: 'E_NO_ROLES',
    });
    expect(
      (await run('viewer_of', app('dave@example.com'), { args: { name: 'other' } })).value,
    ).toBe('connected');
  });
});

describe('?role= is for tenants and workspace admins', () => {
  it('a runner who is not a tenant → E_ROLE_NOT_PERMITTED', async () => {
    await expect(
      run('by_role', app('alice@example.com'), {
        runAs: 'mallory@example.com',
        args: { role: fx.EMEA },
      }),
    ).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
    // Tenancy is the runner's, not the viewer's: bob (AMER) running for alice cannot use EMEA.
    await expect(
      run('by_role', app('alice@example.com'), {
        runAs: 'bob@example.com',
        args: { role: fx.EMEA },
      }),
    ).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
  });

  it('a tenant (directly or by group) connects as the role', async () => {
    expect((await run('by_role', app(null), { args: { role: fx.EMEA } })).value).toEqual({
      user: fx.EMEA,
      ids: ROWS['emea'],
    });
    expect(
      (await run('by_role', app(null), { runAs: 'bob@example.com', args: { role: fx.AMER } }))
        .value,
    ).toEqual({ user: fx.AMER, ids: ROWS['amer'] });
  });

  it('a workspace admin may use any role by name', async () => {
    expect(
      (await run('by_role', app(null), { runAs: ADMIN, args: { role: fx.APAC } })).value,
    ).toEqual({ user: fx.APAC, ids: ROWS['apac'] });
  });

  it('a disabled role → E_ROLE_NOT_PERMITTED, for its tenant and for a workspace admin', async () => {
    await expect(
      run('by_role', app(null), { runAs: DORA, args: { role: DISABLED } }),
    ).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
    await expect(
      run('by_role', app(null), { runAs: ADMIN, args: { role: DISABLED } }),
    ).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
  });

  it('an unknown role, or one of another data table → E_UNKNOWN_ROLE', async () => {
    await expect(
      run('by_role', app(null), { runAs: ADMIN, args: { role: `${fx.prefix}nosuch` } }),
    ).rejects.toMatchObject({ code: 'E_UNKNOWN_ROLE' });
    await expect(
      run('by_role', app(null), { runAs: ADMIN, args: { role: OTHER_TABLE_ROLE } }),
    ).rejects.toMatchObject({ code: 'E_UNKNOWN_ROLE' });
  });

  it('a reserved name never reaches the catalog → E_INVALID_ROLE_NAME', async () => {
    for (const role of ['admin', 'wm_set_0', '@viewer']) {
      await expect(
        run('by_role', app(null), { runAs: ADMIN, args: { role } }),
      ).rejects.toMatchObject({ code: 'E_INVALID_ROLE_NAME' });
    }
  });
});

describe('data tables and the default role', () => {
  it('an unknown data table, or one of another workspace → E_UNKNOWN_DATATABLE', async () => {
    await expect(
      run('viewer_of', app('alice@example.com'), { args: { name: 'nosuch' } }),
    ).rejects.toMatchObject({ code: 'E_UNKNOWN_DATATABLE' });
    await expect(
      run('viewer_of', app('alice@example.com'), { args: { name: 'secret' } }),
    ).rejects.toMatchObject({ code: 'E_UNKNOWN_DATATABLE' });
  });

  it('no default role → E_NO_DEFAULT_ROLE; with one, connects as it; disabled → refused', async () => {
    const { admin } = fx.datatables;
    await expect(run('by_default', app('alice@example.com'))).rejects.toMatchObject({
      code: 'E_NO_DEFAULT_ROLE',
    });
    try {
      await fx.settle((await admin.setDefaultRole(WS, 'main', fx.APAC)).generation);
      expect((await run('by_default', app('alice@example.com'))).value).toEqual({
        user: fx.APAC,
        ids: ROWS['apac'],
      });
      expect((await run('by_default', { kind: 'schedule' })).value).toEqual({
        user: fx.APAC,
        ids: ROWS['apac'],
      });
      await fx.settle((await admin.setDefaultRole(WS, 'main', DISABLED)).generation);
      await expect(run('by_default', app(null))).rejects.toMatchObject({
        code: 'E_ROLE_NOT_PERMITTED',
      });
    } finally {
      await fx.settle((await admin.setDefaultRole(WS, 'main', null)).generation);
    }
    await expect(run('by_default', app(null))).rejects.toMatchObject({ code: 'E_NO_DEFAULT_ROLE' });
  });
});

describe('refusals are never cached', () => {
  for (const fingerprinted of [true, false]) {
    it(`E_NO_ROLES, then the catalog is fixed: the next run succeeds (${fingerprinted ? 'with' : 'without'} the fingerprint)`, async () => {
      const viewer = `fixme-${fingerprinted ? 'fingerprinted' : 'unfingerprinted'}@example.com`;
      const cached = withResultCache(executor, {
        store: new MemoryCacheStore(),
        ...(fingerprinted ? { fingerprint: fx.datatables.fingerprint } : {}),
      });
      for (let attempt = 0; attempt < 2; attempt++) {
        await expect(
          runFor(executor, 'viewer_rows', app(viewer), { through: cached }),
        ).rejects.toMatchObject({
          code: 'E_NO_ROLES',
        });
      }
      expect(cached.stats.stored).toBe(0);
      const change = await fx.datatables.admin.addMembership(WS, viewer, 'group', 'emea');
      await fx.settle(change.generation);
      const fixed = await runFor(executor, 'viewer_rows', app(viewer), { through: cached });
      expect(fixed.fromCache).toBe(false);
      expect(fixed.value).toEqual(ROWS['emea']);
      expect(cached.stats).toMatchObject({ stored: 1, hits: 0 });
      const again = await runFor(executor, 'viewer_rows', app(viewer), { through: cached });
      expect(again.fromCache).toBe(true);
      expect(again.value).toEqual(ROWS['emea']);
    });
  }

  it('E_NO_DEFAULT_ROLE for anonymous runs (one shared entry), then a default role is set', async () => {
    const cached = withResultCache(executor, { store: new MemoryCacheStore() });
    const { admin } = fx.datatables;
    await expect(
      runFor(executor, 'by_default', app(null), { through: cached }),
    ).rejects.toMatchObject({ code: 'E_NO_DEFAULT_ROLE' });
    try {
      await fx.settle((await admin.setDefaultRole(WS, 'main', fx.APAC)).generation);
      const fixed = await runFor(executor, 'by_default', app(null), { through: cached });
      expect(fixed.fromCache).toBe(false);
      expect(fixed.value).toEqual({ user: fx.APAC, ids: ROWS['apac'] });
    } finally {
      await fx.settle((await admin.setDefaultRole(WS, 'main', null)).generation);
    }
  });

  it('E_NO_VIEWER is not stored either', async () => {
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: fx.datatables.fingerprint,
    });
    await expect(
      runFor(executor, 'viewer_rows', { kind: 'trigger' }, { through: cached }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    await expect(
      runFor(executor, 'viewer_rows', { kind: 'trigger' }, { through: cached }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    expect(cached.stats).toMatchObject({ stored: 0, hits: 0, misses: 2 });
  });
});
