import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, ROWS, WS } from '../../helpers/orders_db.js';
import { waitUntil } from '../../helpers/wait.js';

// Issue 24 §1: one learned dependency set per runnable version, shared by every process. Three
// servers on one cache store (as on one Redis): a viewer's run on one server, then on another,
// is a hit from the first repeat — also for the second and third viewer of a server, whose
// entries are written under the learned fingerprint only. Before, each process learned on its
// own: 16 of these 18 repeats hit (watched: RunDependencies without `shared` fails this file).

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';
const VIEWERS = [ALICE, BOB, CAROL];

let fx: OrdersDb;
const store = new MemoryCacheStore();

interface Server {
  readonly name: string;
  readonly datatables: Datatables;
  readonly executor: Executor;
  readonly cached: CachedExecutor;
}

function server(name: string, datatables: Datatables): Server {
  const executor = createExecutor({
    datatables,
    runnables: {
      orders: {
        cacheTtlS: 300,
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          const { rows } = await client.query('select id from orders order by id');
          return rows.map((row) => row['id'] as number);
        },
      },
      // Asks one more question when told to: its set grows after its first runs.
      growing: {
        cacheTtlS: 300,
        fn: async (args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          const { rows } = await client.query('select count(*)::int as n from orders');
          const held = args['check'] === true ? await ctx.hasRole('main', fx.APAC) : null;
          return { n: rows[0]?.['n'] as number, held };
        },
      },
      neverRun: { cacheTtlS: 300, fn: async () => null },
    },
  });
  return {
    name,
    datatables,
    executor,
    cached: withResultCache(executor, { store, fingerprint: datatables.fingerprint }),
  };
}

function job(s: Server, viewer: string, path: string, args: Record<string, unknown> = {}) {
  return s.executor.createJob({ workspace: WS, path, runAs: PUBLISHER, origin: app(viewer), args });
}

async function run(s: Server, viewer: string, path: string, args: Record<string, unknown> = {}) {
  const result = await s.cached.run(job(s, viewer, path, args));
  return { fromCache: result.fromCache, value: result.value };
}

let servers: Server[];

beforeAll(async () => {
  fx = await ordersDb();
  servers = [
    server('A', fx.datatables),
    server('B', await fx.open()),
    server('C', await fx.open()),
  ];
});

afterAll(async () => {
  await fx?.close();
});

describe('learned dependency sets are shared by every process', () => {
  it('three servers, three viewers per server pair: every cross-server repeat hits', async () => {
    const repeats: { pair: string; viewer: string; hit: boolean }[] = [];
    for (const from of servers) {
      for (const to of servers) {
        if (from === to) continue;
        const pair = `${from.name}${to.name}`;
        for (const viewer of VIEWERS) {
          const first = await run(from, viewer, 'orders', { pair });
          const again = await run(to, viewer, 'orders', { pair });
          expect(again.value).toEqual(first.value);
          repeats.push({ pair, viewer, hit: again.fromCache });
        }
      }
    }
    expect(repeats.filter((r) => !r.hit)).toEqual([]);
    expect(repeats).toHaveLength(18);
    // Rows as each viewer's roles grant them, wherever they ran.
    expect((await run(servers[2]!, CAROL, 'orders', { pair: 'AB' })).value).toEqual([1, 2, 3]);
    expect((await run(servers[1]!, BOB, 'orders', { pair: 'CA' })).value).toEqual(ROWS['amer']);
  });

  it('a process started after the learning (a restart) hits from its first request', async () => {
    const restarted = server('D', await fx.open());
    for (const viewer of VIEWERS) {
      expect(await run(restarted, viewer, 'orders', { pair: 'BC' })).toMatchObject({
        fromCache: true,
      });
    }
  });

  it('a set that grows on one server converges on the others without a miss each', async () => {
    const [a, b, c] = servers as [Server, Server, Server];
    await run(a, ALICE, 'growing');
    // B's run asks one more question: the shared set grows, announced to A and C.
    expect((await run(b, BOB, 'growing', { check: true })).fromCache).toBe(false);
    const grown = await b.datatables.fingerprint(job(b, CAROL, 'growing'));
    for (const s of [a, c]) {
      await waitUntil(
        `${s.name} reads the grown set`,
        async () => (await s.datatables.fingerprint(job(s, CAROL, 'growing'))) === grown,
      );
    }
    // Entries written after the growth, anywhere, are found everywhere.
    await run(c, CAROL, 'growing', { check: true });
    expect(await run(a, CAROL, 'growing', { check: true })).toMatchObject({ fromCache: true });
    expect(await run(a, BOB, 'growing', { check: true })).toMatchObject({ fromCache: true });
    expect(await run(c, BOB, 'growing', { check: true })).toMatchObject({ fromCache: true });
  });

  it('a row that does not verify (truncated, forged, copied) is not learned: the full fingerprint', async () => {
    const full = async (s: Server, viewer: string) =>
      s.datatables.fingerprint(job(s, viewer, 'neverRun'));
    const fresh = server('E', await fx.open());
    const learned = await fresh.datatables.fingerprint(job(fresh, ALICE, 'orders'));
    expect(learned).not.toBe(await full(fresh, ALICE));
    const original = await fx.sql.query(
      `select members, mac from viewer_cache.learned_set where path = 'orders'`,
    );
    expect(original.rows).toHaveLength(1);
    for (const tamper of [
      `update viewer_cache.learned_set set members = '{}' where path = 'orders'`, // truncated
      `update viewer_cache.learned_set set mac = '\\x00' where path = 'orders'`, // forged
      // another version's genuine row copied over this one
      `update viewer_cache.learned_set o set members = g.members, mac = g.mac
         from viewer_cache.learned_set g where o.path = 'orders' and g.path = 'growing'`,
    ]) {
      await fx.sql.query(
        `update viewer_cache.learned_set set members = $1, mac = $2, everything = false where path = 'orders'`,
        [original.rows[0].members, original.rows[0].mac],
      );
      await fx.sql.query(tamper);
      const next = server('F', await fx.open());
      expect(await next.datatables.fingerprint(job(next, ALICE, 'orders'))).toBe(
        await full(next, ALICE),
      );
    }
    // Restored, it verifies again.
    await fx.sql.query(
      `update viewer_cache.learned_set set members = $1, mac = $2, everything = false where path = 'orders'`,
      [original.rows[0].members, original.rows[0].mac],
    );
    const restored = server('G', await fx.open());
    expect(await restored.datatables.fingerprint(job(restored, ALICE, 'orders'))).toBe(learned);
  });
});
