import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  createExecutor,
  type Executor,
  MemoryCacheStore,
  type RunContext,
  withResultCache,
} from '../../../src/index.js';
import { captureLogger } from '../../helpers/log_capture.js';
import { app, type OrdersDb, ordersDb, runFor, WS } from '../../helpers/orders_db.js';
import { asAdmin, createTestDatabase, type TestDatabase } from '../../helpers/pg.js';
import { waitUntil } from '../../helpers/wait.js';

// SPEC invariant 22 where the database cannot tell the library at once: no event trigger (a
// managed Postgres without the privilege). The rules are read as a digest every heartbeat; a
// change reaches every process within heartbeat + heartbeatTimeout, and a database whose digest
// cannot be read is never served from (its runs execute, nothing they store is found again).

const ALICE = 'alice@example.com';
const CATALOG = { heartbeat: '100ms', heartbeatTimeout: '200ms' } as const;

let fx: OrdersDb;
let otherDb: TestDatabase;
let second: Datatables;
const log = captureLogger();
const stacks: { executor: Executor; cached: CachedExecutor }[] = [];
/** A database whose rules checks fail in the second process (null: none). */
let failing: string | null = null;

async function query(ctx: RunContext, datatable: string) {
  const db = await ctx.datatable(datatable, { as: 'viewer' });
  const table = datatable === 'main' ? 'orders' : 'notes';
  return (await db.query(`select id from ${table} order by id`)).rows.map((r) => r['id']);
}

function stack(datatables: Datatables) {
  const executor = createExecutor({
    datatables,
    runnables: {
      main: { cacheTtlS: 300, fn: (_args, ctx) => query(ctx, 'main') },
      other: { cacheTtlS: 300, fn: (_args, ctx) => query(ctx, 'other') },
    },
  });
  const cached = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
  stacks.push({ executor, cached });
}

async function run(which: number, datatable: 'main' | 'other') {
  const { executor, cached } = stacks[which]!;
  const result = await runFor(executor, datatable, app(ALICE), { through: cached });
  return { fromCache: result.fromCache, rows: result.value as unknown[] };
}

async function generation(): Promise<number> {
  const { rows } = await fx.sql.query('select value from viewer_cache.generation');
  return Number(rows[0]!['value']);
}

async function settled(): Promise<void> {
  await fx.settle(await generation());
}

beforeAll(async () => {
  fx = await ordersDb({ catalog: CATALOG });
  // As on a managed Postgres: the migration could not install the event triggers.
  await fx.sql.query('drop event trigger viewer_cache_rules_ddl');
  await fx.sql.query('drop event trigger viewer_cache_rules_drop');
  otherDb = await createTestDatabase(`${fx.prefix}o`);
  const reader = `${fx.prefix}notes_reader`;
  await fx.datatables.admin.createDatatable(WS, 'other', { database: otherDb.name });
  await fx.datatables.admin.createRole(WS, 'other', reader, { tenants: ['group:emea'] });
  await asAdmin(otherDb.name, async (c) => {
    await c.query('create table notes (id int primary key)');
    await c.query('insert into notes values (7), (8)');
    await c.query(`grant select on notes to ${pg.escapeIdentifier(reader)}`);
  });
  second = await fx.open(
    { migrate: false, logger: log.logger },
    {
      beforeRulesCheck: (database) => {
        if (database === failing) throw new Error('the digest did not answer');
      },
    },
  );
  stack(fx.datatables);
  stack(second);
  await waitUntil('both processes read the digests of both data tables', () =>
    [fx.datatables, second].every(
      (d) => d.rulesMode(WS, 'main') === 'digest' && d.rulesMode(WS, 'other') === 'digest',
    ),
  );
  await settled();
});

afterAll(async () => {
  await asAdmin(otherDb.name, (c) =>
    c.query(`drop owned by ${pg.escapeIdentifier(`${fx.prefix}notes_reader`)}`),
  );
  await fx?.close();
  await otherDb?.drop();
});

describe('without the event trigger: a digest of the rules read every heartbeat', () => {
  it('says once per data table, at start-up, that it runs on the digest and its bound', () => {
    const said = log
      .lines()
      .filter((line) => line['mode'] !== undefined)
      .map((line) => [line['datatable'], line['mode'], line['boundMs']])
      // The data tables start side by side: their lines come in either order.
      .sort((a, b) => String(a[0]).localeCompare(String(b[0])));
    expect(said).toEqual([
      ['main', 'digest', 300],
      ['other', 'digest', 300],
    ]);
  });

  it('a policy tightened behind the library reaches both processes within the bound; the other data table keeps hitting', async () => {
    for (const p of [0, 1]) {
      await run(p, 'main');
      expect(await run(p, 'main')).toEqual({ fromCache: true, rows: [1, 3] });
      await run(p, 'other');
      expect(await run(p, 'other')).toEqual({ fromCache: true, rows: [7, 8] });
    }
    const before = await generation();
    await fx.sql.query(
      `alter policy emea on orders using (region = 'emea' and id > 1 and pg_has_role(current_user, '${fx.EMEA}', 'member'))`,
    );
    // The digest's record bumps the generation: nothing else in this file changes the catalog.
    await waitUntil('a process recorded the new digest', async () => {
      return (await generation()) > before;
    });
    await settled();
    for (const p of [0, 1]) {
      expect(await run(p, 'main')).toEqual({ fromCache: false, rows: [3] });
      expect(await run(p, 'other')).toEqual({ fromCache: true, rows: [7, 8] });
    }
  });

  it('a revoke in the other database reaches its data table only', async () => {
    for (const p of [0, 1]) expect((await run(p, 'main')).fromCache).toBe(true);
    await asAdmin(otherDb.name, (c) =>
      c.query(`revoke select on notes from ${pg.escapeIdentifier(`${fx.prefix}notes_reader`)}`),
    );
    for (const p of [0, 1]) {
      await waitUntil(`process ${p} stops serving the other data table`, async () => {
        try {
          await run(p, 'other');
          return false;
        } catch (err) {
          return (err as { code?: string }).code === 'E_QUERY_FAILED';
        }
      });
      expect(await run(p, 'main')).toEqual({ fromCache: true, rows: [3] });
    }
    const before = await generation();
    await asAdmin(otherDb.name, (c) =>
      c.query(`grant select on notes to ${pg.escapeIdentifier(`${fx.prefix}notes_reader`)}`),
    );
    // Restored: recorded as a change of its own (a fresh version, never the old one back).
    await waitUntil('a process recorded the restored digest', async () => {
      return (await generation()) > before;
    });
    await settled();
  });

  it("fail closed: while a database's digest cannot be read, nothing of its data table is served; the rest keeps hitting", async () => {
    await waitUntil('the other data table is served again', async () => {
      await run(1, 'other').catch(() => undefined);
      return (await run(1, 'other').catch(() => ({ fromCache: false }))).fromCache;
    });
    expect((await run(1, 'main')).fromCache).toBe(true);
    // Every check of that database fails in the second process (as a digest read that errors
    // or times out would).
    failing = otherDb.name;
    try {
      await waitUntil('the other data table is no longer served', async () => {
        return !(await run(1, 'other')).fromCache;
      });
      // Not served, and what the miss computed is not stored under anything found again.
      expect(await run(1, 'other')).toEqual({ fromCache: false, rows: [7, 8] });
      expect(await run(1, 'other')).toEqual({ fromCache: false, rows: [7, 8] });
      expect(await run(1, 'main')).toEqual({ fromCache: true, rows: [3] });
    } finally {
      failing = null;
    }
    await waitUntil('the other data table is served again once its digest answers', async () => {
      await run(1, 'other');
      return (await run(1, 'other')).fromCache;
    });
  });
});
