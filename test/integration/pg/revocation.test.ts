import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  RedisCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { countdown, deferred } from '../../helpers/deferred.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';

// SPEC invariant 10: a role change applies on the viewer's next run — in every process, cached or
// not — because the key carries a fingerprint of the viewer's resolved roles and the catalog
// generation, kept fresh by LISTEN/NOTIFY and read from Postgres while the listener is down. A
// result computed under one fingerprint is never stored once it moved.
// (This is also the "permission change not in the key" leak class of leak_classes.test.ts.)

const CAROL = 'carol@example.com';

/** One "process": its own catalog connection, executor and cache, sharing Redis and Postgres. */
interface Stack {
  datatables: Datatables;
  executor: Executor;
  cached: CachedExecutor;
  store: RedisCacheStore;
}

let fx: OrdersDb;
let redis: Redis;
let prefix: string;
let tests = 0;
const stacks: Stack[] = [];
let hold: { arrive(): void; gate: Promise<void> } = { arrive() {}, gate: Promise.resolve() };

const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id'] as number);

function stack(datatables: Datatables): Stack {
  const executor = createExecutor({
    datatables,
    runnables: {
      orders: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
      orders_sql: {
        kind: 'sql',
        database: 'datatable://main?as=viewer',
        sql: 'select id from orders order by id',
        cacheTtlS: 300,
      },
      // Connects, then waits for the test before querying.
      held: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          hold.arrive();
          await hold.gate;
          return ids((await client.query('select id from orders order by id')).rows);
        },
      },
    },
  });
  const store = new RedisCacheStore({ redis: inject('redisUrl'), prefix, commandTimeout: 2000 });
  const cached = withResultCache(executor, {
    store,
    fingerprint: datatables.fingerprint,
    seal: false,
  });
  const built = { datatables, executor, cached, store };
  stacks.push(built);
  return built;
}

async function twoProcesses(): Promise<[Stack, Stack]> {
  prefix = `vc-test:${fx.prefix}${++tests}:`;
  return [stack(await fx.open({ migrate: false })), stack(await fx.open({ migrate: false }))];
}

async function redisKeys(): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    keys.push(...batch);
  } while (cursor !== '0');
  return keys.sort();
}

/** Carol's rows through a process, by TS and SQL, cached and not. */
async function carolSees(s: Stack) {
  const cached = await runFor(s.executor, 'orders', app(CAROL), { through: s.cached });
  const cachedSql = await runFor(s.executor, 'orders_sql', app(CAROL), { through: s.cached });
  const direct = await runFor(s.executor, 'orders', app(CAROL));
  const directSql = await runFor(s.executor, 'orders_sql', app(CAROL));
  return {
    cached: cached.value,
    cachedSql: ids(cachedSql.value as Record<string, unknown>[]),
    direct: direct.value,
    directSql: ids(directSql.value as Record<string, unknown>[]),
    fromCache: [cached.fromCache, cachedSql.fromCache],
  };
}

function seeing(rows: number[], fromCache: [boolean, boolean]) {
  return { cached: rows, cachedSql: rows, direct: rows, directSql: rows, fromCache };
}

function nextListenerEvent(datatables: Datatables, up: boolean): Promise<void> {
  return new Promise((resolve) => {
    const listener = (event: { up: boolean }) => {
      if (event.up !== up) return;
      datatables.events.off('catalog:listener', listener);
      resolve();
    };
    datatables.events.on('catalog:listener', listener);
  });
}

beforeAll(async () => {
  fx = await ordersDb();
  redis = new Redis(inject('redisUrl'));
});

afterEach(async () => {
  const keys = await redisKeys();
  if (keys.length > 0) await redis.del(...keys);
  await Promise.all(stacks.splice(0).map((s) => s.store.close()));
  // Put carol back in both groups for the next test.
  await fx.datatables.admin.addMembership(WS, CAROL, 'group', 'emea');
  await fx.datatables.admin.removeMembership(WS, CAROL, 'group', 'apac');
  const change = await fx.datatables.admin.addMembership(WS, CAROL, 'group', 'amer');
  await fx.settle(change.generation);
});

afterAll(async () => {
  redis?.disconnect();
  await fx?.close();
});

describe('a revocation applies on the viewer’s next run, in every process', () => {
  it('removed from amer through A: B and A stop showing amer rows, cached or not', async () => {
    const [a, b] = await twoProcesses();
    expect(await carolSees(a)).toEqual(seeing([1, 2, 3], [false, false]));
    // B shares A's Redis: the same viewer under the same fingerprint hits A's entries.
    expect(await carolSees(b)).toEqual(seeing([1, 2, 3], [true, true]));
    // Two results, each stored under the key of what its run asked and under the full key,
    // which a process looks up until it has seen that runnable run itself (B's hits).
    expect(await redisKeys()).toHaveLength(4);

    const change = await a.datatables.admin.removeMembership(WS, CAROL, 'group', 'amer');
    await b.datatables.waitForGeneration(change.generation);

    expect(await carolSees(b)).toEqual(seeing(ROWS['emea']!, [false, false]));
    expect(await carolSees(a)).toEqual(seeing(ROWS['emea']!, [true, true]));
  });

  it('the process that made the change sees it on its very next run', async () => {
    const [a] = await twoProcesses();
    for (const [group, change] of [
      ['amer', 'remove'],
      ['amer', 'add'],
      ['emea', 'remove'],
    ] as const) {
      await runFor(a.executor, 'orders', app(CAROL), { through: a.cached });
      if (change === 'remove') await a.datatables.admin.removeMembership(WS, CAROL, 'group', group);
      else await a.datatables.admin.addMembership(WS, CAROL, 'group', group);
      // No wait for the notification: the admin call returning is enough.
      const next = await runFor(a.executor, 'orders', app(CAROL), { through: a.cached });
      const expected =
        group === 'amer' && change === 'remove'
          ? ROWS['emea']
          : group === 'amer'
            ? [1, 2, 3]
            : ROWS['amer'];
      expect({ group, change, rows: next.value }).toEqual({ group, change, rows: expected });
    }
  });

  it('with the listener down, B’s very next run after a change is already correct', async () => {
    const [a, b] = await twoProcesses();
    expect((await carolSees(b)).cached).toEqual([1, 2, 3]);
    const changes: [string, 'add' | 'remove', number[]][] = [
      ['apac', 'add', [1, 2, 3, 4]],
      ['amer', 'remove', [1, 3, 4]],
      ['emea', 'remove', [4]],
    ];
    for (const [group, change, expected] of changes) {
      // Kill both listeners (they share the database) and wait until B knows its is gone.
      const down = nextListenerEvent(b.datatables, false);
      let cameBack = false;
      const back = nextListenerEvent(b.datatables, true).then(() => {
        cameBack = true;
      });
      await fx.sql.query(
        `select pg_terminate_backend(pid) from pg_stat_activity
          where application_name = 'viewer-cache-listener' and datname = current_database()`,
      );
      await down;
      expect(b.datatables.listenerUp).toBe(false);

      const made =
        change === 'add'
          ? await a.datatables.admin.addMembership(WS, CAROL, 'group', group)
          : await a.datatables.admin.removeMembership(WS, CAROL, 'group', group);
      const seen = await carolSees(b);
      expect({ group, change, seen }).toEqual({
        group,
        change,
        seen: seeing(expected, [false, false]),
      });
      if (!cameBack) {
        // The runs above were served while B's listener was down (it cannot have gone down again).
        expect(b.datatables.listenerUp).toBe(false);
      }
      // The listener comes back on its own and notifications flow again.
      await back;
      await b.datatables.waitForGeneration(made.generation);
      expect(b.datatables.listenerUp).toBe(true);
    }
    const last = await a.datatables.admin.addMembership(WS, CAROL, 'group', 'amer');
    await b.datatables.waitForGeneration(last.generation);
    expect(await carolSees(b)).toEqual(seeing([2, 4], [false, false]));
  });
});

describe('a run that started under one fingerprint is not stored under another', () => {
  it('held open across a revocation: handed to its caller, never stored; the next run re-executes', async () => {
    const [a, b] = await twoProcesses();
    const arrived = countdown(1);
    const gate = deferred();
    hold = { arrive: () => arrived.arrive(), gate: gate.promise };
    const notStored: string[] = [];
    a.cached.events.on('cache:not-stored', ({ reason }) => notStored.push(reason));
    const running = runFor(a.executor, 'held', app(CAROL), { through: a.cached });
    await arrived.done;

    const change = await b.datatables.admin.removeMembership(WS, CAROL, 'group', 'amer');
    await fx.settle(change.generation);
    gate.resolve();
    const first = await running;
    // It connected as carol's old login, so it shows amer rows: fine for the caller who asked
    // before the revocation, but it must not be kept.
    expect(first.value).toEqual([1, 2, 3]);
    expect(first.fromCache).toBe(false);
    expect(notStored).toEqual(['fingerprint-moved']);
    expect(a.cached.stats.stored).toBe(0);
    expect(await redisKeys()).toEqual([]);

    hold = { arrive() {}, gate: Promise.resolve() };
    for (const s of [a, b]) {
      const next = await runFor(s.executor, 'held', app(CAROL), { through: s.cached });
      expect(next.value).toEqual(ROWS['emea']);
    }
    expect(a.cached.stats.stored + b.cached.stats.stored).toBe(1);
    const again = await runFor(a.executor, 'held', app(CAROL), { through: a.cached });
    expect(again).toMatchObject({ fromCache: true, value: ROWS['emea'] });
  });
});
