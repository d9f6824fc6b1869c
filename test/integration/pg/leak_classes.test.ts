import { Redis } from 'ioredis';
import pg from 'pg';
import { type Logger, pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  type JobResult,
  MemoryCacheStore,
  RedisCacheStore,
  type RunOrigin,
  withResultCache,
} from '../../../src/index.js';
import { deferred } from '../../helpers/deferred.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  ROWS,
  roleLoginPasswords,
  runFor,
  SECRET_KEY,
  setLoginRows,
  WS,
} from '../../helpers/orders_db.js';

// The leak classes seen in peers (SPEC, "Leak classes seen in peers"), each as "the same
// runnable, two viewers", on real data tables:
// - permission change not in the key, and an in-flight load written after invalidation:
//   revocation.test.ts;
// - pooled connection keeping a previous user's role: login_pools.test.ts, and below;
// - anonymous vs signed-in, coalescing, same-name users, a security input (the runner) missing
//   from the key, and credentials in a cached value: below.

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';
const DAVE = 'dave@example.com';
const MALLORY = 'mallory@example.com';
const EMAILS = [ALICE, BOB, CAROL, DAVE, MALLORY, PUBLISHER];
const OTHER_WS = 'other';

let fx: OrdersDb;
let OTHER_APAC: string;
let redis: Redis;
const redisPrefix = () => `vc-test:${fx.prefix}leaks:`;
/** Every log line of every component, at trace level. */
const logLines: string[] = [];
const logger: Logger = pino(
  { level: 'trace' },
  { write: (line: string) => void logLines.push(line) },
);
let datatables: Datatables;
let executor: Executor;
let cached: CachedExecutor;
let store: RedisCacheStore;

let executions = 0;
const arrivals = new Map<string, () => void>();
let gate: Promise<void> = Promise.resolve();

const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id'] as number);

function executorFor(dt: Datatables): Executor {
  return createExecutor({
    datatables: dt,
    logger,
    runnables: {
      // Written the way a careless author would: the viewer when there is one, else the default.
      report: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          let client: Awaited<ReturnType<typeof ctx.datatable>>;
          try {
            client = await ctx.datatable('main', { as: 'viewer' });
          } catch (err) {
            if ((err as { code?: string }).code !== 'E_NO_VIEWER') throw err;
            client = await ctx.datatable('main');
          }
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      held: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          executions++;
          const client = await ctx.datatable('main', { as: 'viewer' });
          arrivals.get(String(ctx.viewer))?.();
          await gate;
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      by_role: {
        cacheTtlS: 300,
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { role: String(args['role']) });
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      session: {
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          for (const statement of (args['script'] as string[]) ?? []) await client.query(statement);
          const { rows } = await client.query(
            `select pg_backend_pid() as pid, current_user::text as "user",
                    session_user::text as "session",
                    (select coalesce(array_agg(id order by id), '{}') from orders) as ids`,
          );
          return rows[0];
        },
      },
      // Returns its data-table client itself, as a runnable should never do.
      leaky: {
        cacheTtlS: 300,
        fn: async (args, ctx) => {
          const request = args['request'] as Parameters<typeof ctx.datatable>[1];
          const client = await ctx.datatable('main', request);
          const rows = ids((await client.query('select id from orders order by id')).rows);
          return {
            client,
            stringified: JSON.stringify(client),
            keys: Object.getOwnPropertyNames(client),
            proto: Object.getOwnPropertyNames(Object.getPrototypeOf(client) ?? {}),
            text: String(client),
            rows,
          };
        },
      },
    },
  });
}

beforeAll(async () => {
  fx = await ordersDb();
  const { admin } = fx.datatables;
  OTHER_APAC = `${fx.prefix}other_apac`;
  // The publisher may use EMEA by name; mallory may not.
  await admin.setTenants(WS, fx.EMEA, ['group:emea', `user:${PUBLISHER}`]);
  await admin.setDefaultRole(WS, 'main', fx.APAC);
  // Another workspace whose "main" is the same database, with its own role, where alice is in
  // a group that sees APAC rows.
  await admin.createDatatable(OTHER_WS, 'main', { database: fx.db.name });
  await admin.createRole(OTHER_WS, 'main', OTHER_APAC, { tenants: ['group:apac'] });
  await fx.sql.query(`grant select on orders to ${OTHER_APAC}`);
  await fx.sql.query(
    `create policy other_apac on orders for select using (region = 'apac' and pg_has_role(current_user, '${OTHER_APAC}', 'member'))`,
  );
  const last = await admin.addMembership(OTHER_WS, ALICE, 'group', 'apac');
  await fx.settle(last.generation);

  datatables = await fx.open({ migrate: false, logger });
  await datatables.waitForGeneration(last.generation);
  executor = executorFor(datatables);
  redis = new Redis(inject('redisUrl'));
  store = new RedisCacheStore({ redis: inject('redisUrl'), prefix: redisPrefix() });
  // In clear (`seal: false`): the credential check below reads what Redis holds, and a sealed
  // entry would hide a leaked password rather than prove there is none.
  cached = withResultCache(executor, {
    store,
    fingerprint: datatables.fingerprint,
    logger,
    seal: false,
  });
});

afterAll(async () => {
  if (redis !== undefined) {
    const keys = await redisKeys();
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  }
  await store?.close();
  await fx?.close();
});

async function redisKeys(): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${redisPrefix()}*`, 'COUNT', 1000);
    cursor = next;
    keys.push(...batch);
  } while (cursor !== '0');
  return keys;
}

/** A fresh cache in front of the shared executor, so each test starts with nothing stored. */
function freshCache(): CachedExecutor {
  return withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
    logger,
  });
}

function through(c: CachedExecutor, path: string, origin: RunOrigin, runAs?: string) {
  return runFor(executor, path, origin, { through: c, ...(runAs ? { runAs } : {}) });
}

const seen = (result: JobResult) => ({ rows: result.value, fromCache: result.fromCache });

describe('an anonymous visitor and a signed-in viewer never share an entry', () => {
  it('anonymous first, then signed-in viewers, then again', async () => {
    const c = freshCache();
    expect(seen(await through(c, 'report', app(null)))).toEqual({
      rows: ROWS['apac'],
      fromCache: false,
    });
    expect(seen(await through(c, 'report', app(ALICE)))).toEqual({
      rows: ROWS['emea'],
      fromCache: false,
    });
    expect(seen(await through(c, 'report', app(BOB)))).toEqual({
      rows: ROWS['amer'],
      fromCache: false,
    });
    expect(seen(await through(c, 'report', app(null)))).toEqual({
      rows: ROWS['apac'],
      fromCache: true,
    });
    expect(seen(await through(c, 'report', app(ALICE)))).toEqual({
      rows: ROWS['emea'],
      fromCache: true,
    });
    // Every run without a viewer shares the one "no viewer" entry (a schedule, here).
    expect(seen(await through(c, 'report', { kind: 'schedule' }))).toEqual({
      rows: ROWS['apac'],
      fromCache: true,
    });
  });

  it('signed-in first, then anonymous', async () => {
    const c = freshCache();
    expect(seen(await through(c, 'report', app(CAROL)))).toEqual({
      rows: [1, 2, 3],
      fromCache: false,
    });
    expect(seen(await through(c, 'report', app(null)))).toEqual({
      rows: ROWS['apac'],
      fromCache: false,
    });
    expect(seen(await through(c, 'report', app(CAROL)))).toEqual({
      rows: [1, 2, 3],
      fromCache: true,
    });
  });
});

describe('coalescing never crosses viewers', () => {
  it('alice and bob at once: two executions, each their own rows', async () => {
    const c = freshCache();
    const open = deferred();
    gate = open.promise;
    executions = 0;
    const aliceIn = deferred();
    const bobIn = deferred();
    arrivals.set(ALICE, aliceIn.resolve);
    arrivals.set(BOB, bobIn.resolve);
    const coalesced = deferred();
    c.events.on('cache:coalesced', () => coalesced.resolve());

    const alice = through(c, 'held', app(ALICE));
    await aliceIn.promise;
    // alice's run is in flight; bob's identical run must start its own execution, not join.
    const bob = through(c, 'held', app(BOB));
    const first = await Promise.race([
      bobIn.promise.then(() => 'bob executed'),
      coalesced.promise.then(() => 'bob joined alice'),
    ]);
    expect(first).toBe('bob executed');
    open.resolve();
    expect(seen(await alice)).toEqual({ rows: ROWS['emea'], fromCache: false });
    expect(seen(await bob)).toEqual({ rows: ROWS['amer'], fromCache: false });
    expect(executions).toBe(2);
    expect(c.stats.coalesced).toBe(0);
  });

  it('the control: two identical runs of alice do share one execution', async () => {
    const c = freshCache();
    const open = deferred();
    gate = open.promise;
    executions = 0;
    const aliceIn = deferred();
    arrivals.set(ALICE, aliceIn.resolve);
    const coalesced = deferred();
    c.events.on('cache:coalesced', () => coalesced.resolve());
    const one = through(c, 'held', app(ALICE));
    await aliceIn.promise;
    const two = through(c, 'held', app(ALICE));
    await coalesced.promise;
    open.resolve();
    expect((await one).value).toEqual(ROWS['emea']);
    expect((await two).value).toEqual(ROWS['emea']);
    expect(executions).toBe(1);
    expect(c.stats.coalesced).toBe(1);
  });
});

describe('same-name users', () => {
  it('alice in two workspaces: same runnable, same args, two entries and two answers', async () => {
    const c = freshCache();
    const inWorkspace = (workspace: string) =>
      c.run(
        executor.createJob({ workspace, path: 'report', runAs: PUBLISHER, origin: app(ALICE) }),
      );
    expect(seen(await inWorkspace(WS))).toEqual({ rows: ROWS['emea'], fromCache: false });
    expect(seen(await inWorkspace(OTHER_WS))).toEqual({ rows: ROWS['apac'], fromCache: false });
    expect(seen(await inWorkspace(WS))).toEqual({ rows: ROWS['emea'], fromCache: true });
    expect(seen(await inWorkspace(OTHER_WS))).toEqual({ rows: ROWS['apac'], fromCache: true });
  });
});

describe('a security input missing from the key: the runner', () => {
  it('mallory, who may not use EMEA, is never served the publisher’s EMEA result', async () => {
    const c = freshCache();
    const byRole = (runAs: string) =>
      runFor(executor, 'by_role', app(ALICE), { through: c, runAs, args: { role: fx.EMEA } });
    expect(seen(await byRole(PUBLISHER))).toEqual({ rows: ROWS['emea'], fromCache: false });
    expect(seen(await byRole(PUBLISHER))).toEqual({ rows: ROWS['emea'], fromCache: true });
    await expect(byRole(MALLORY)).rejects.toMatchObject({ code: 'E_ROLE_NOT_PERMITTED' });
  });
});

describe('a pooled connection never keeps a previous user’s role', () => {
  it('carol leaves SET ROLE behind: bob and alice get their own connections, carol a clean one', async () => {
    const pooled = executorFor(await fx.open({ migrate: false, pools: { size: 1 } }));
    const session = async (viewer: string, script: string[] = []) =>
      (await runFor(pooled, 'session', app(viewer), { args: { script } })).value as {
        pid: number;
        user: string;
        session: string;
        ids: number[];
      };
    const carol = await session(CAROL, [`set role ${pg.escapeIdentifier(fx.EMEA)}`]);
    expect(carol.user).toBe(fx.EMEA);
    const bob = await session(BOB);
    const alice = await session(ALICE);
    expect(bob).toMatchObject({ user: fx.AMER, session: fx.AMER, ids: ROWS['amer'] });
    expect(alice).toMatchObject({ user: fx.EMEA, session: fx.EMEA, ids: ROWS['emea'] });
    expect(new Set([carol.pid, bob.pid, alice.pid]).size).toBe(3);
    const carolAgain = await session(CAROL);
    expect(carolAgain).toMatchObject({ pid: carol.pid, user: carol.session, ids: [1, 2, 3] });
  });
});

describe('no credentials in a cached value, in Redis or in the logs', () => {
  it('a runnable returning its client: no password anywhere; Redis and logs hold no password or email', async () => {
    const runs: [string, RunOrigin, Record<string, unknown>, string?][] = [
      ['alice, as the viewer (one role)', app(ALICE), { as: 'viewer' }],
      ['carol, as the viewer (a set login)', app(CAROL), { as: 'viewer' }],
      ['bob, by role', app(BOB), { role: fx.EMEA }],
      ['anonymous, default role', app(null), {}],
    ];
    // Every password a login had during the test (set logins are taken back and recreated).
    const secrets = new Set<string>([SECRET_KEY]);
    const collect = async () => {
      for (const password of (await roleLoginPasswords(fx.sql)).values()) secrets.add(password);
      for (const row of await setLoginRows(fx.sql)) secrets.add(row.password);
    };
    const values: string[] = [];
    for (const [, origin, request] of runs) {
      const first = await runFor(executor, 'leaky', origin, { through: cached, args: { request } });
      const second = await runFor(executor, 'leaky', origin, {
        through: cached,
        args: { request },
      });
      expect(first.fromCache).toBe(false);
      expect(second.fromCache).toBe(true);
      expect(first.value).toMatchObject({ client: {}, stringified: '{}', keys: ['query'] });
      expect((first.value as { rows: number[] }).rows.length).toBeGreaterThan(0);
      values.push(
        Buffer.from(first.json()).toString('utf8'),
        Buffer.from(second.json()).toString(),
      );
    }

    // Refusals, a failing runnable, a take-back and a retire, for their log lines and errors.
    const errors: unknown[] = [];
    const failed = (err: unknown) => void errors.push(err);
    await runFor(executor, 'by_role', app(ALICE), {
      through: cached,
      runAs: MALLORY,
      args: { role: fx.EMEA },
    }).catch(failed);
    await runFor(executor, 'report', app(DAVE), { through: cached }).catch(failed);
    await runFor(executor, 'leaky', app(DAVE), {
      through: cached,
      args: { request: { as: 'viewer' } },
    }).catch(failed);
    await collect();
    await fx.sql.query('delete from viewer_cache.role_set');
    const other = executorFor(await fx.open({ migrate: false, logger }));
    await runFor(other, 'session', app(CAROL));
    await collect();
    await runFor(other, 'session', app(CAROL), {
      args: { script: ['select * from no_such_table'] },
    }).catch(failed);
    await datatables.admin.disableRole(WS, fx.AMER);
    await fx.settle((await datatables.admin.enableRole(WS, fx.AMER)).generation);
    await runFor(executor, 'session', app(CAROL));
    expect(errors).toHaveLength(4);
    await collect();
    const passwords = [...secrets];
    // The key, 4 role logins (3 + another workspace's), and carol's set login three times over.
    expect(passwords.length).toBeGreaterThanOrEqual(8);
    const keys = await redisKeys();
    expect(keys.length).toBeGreaterThanOrEqual(4);
    const stored = await Promise.all(
      keys.map(async (key) => (await redis.getBuffer(key))!.toString('latin1')),
    );
    const errorText = errors.map((err) => {
      const parts: string[] = [];
      for (let e = err as Error | undefined; e !== undefined; e = e.cause as Error | undefined) {
        parts.push(String(e), e.message, e.stack ?? '', JSON.stringify(e));
      }
      return parts.join('\n');
    });
    expect(logLines.length).toBeGreaterThan(10);

    const haystacks: [string, string[]][] = [
      ['returned values', values],
      ['Redis keys', keys],
      ['Redis values', stored],
      ['log lines', logLines],
      ['errors', errorText],
    ];
    for (const [where, texts] of haystacks) {
      for (const secret of passwords) {
        expect(
          texts.filter((text) => text.includes(secret)),
          `a password in ${where}`,
        ).toEqual([]);
      }
      if (where === 'returned values') continue;
      for (const email of EMAILS) {
        expect(
          texts.filter((text) => text.includes(email)),
          `${email} in ${where}`,
        ).toEqual([]);
      }
    }
  });
});
