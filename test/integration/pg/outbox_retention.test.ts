import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_OUTBOX_RETENTION_MS, readConfig } from '../../../src/server/process/config.js';
import { migrateServer, SERVER_SCHEMA } from '../../../src/server/process/server_migrations.js';
import { Outbox } from '../../../src/server/recipients/outbox.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';

// Per-recipient deliveries are kept for a retention (VIEWER_CACHE_OUTBOX_RETENTION_MS, the
// Outbox's `retentionMs`; 7 days by default), so delivered rows do not accumulate for ever: a
// read never returns an older row, and a sweep deletes them. Rows are aged by rewriting their
// `created_at`, not by waiting.

const HOUR = 3_600_000;
let db: TestDatabase;
let pool: pg.Pool;

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  pool = new pg.Pool({ connectionString: db.url, max: 4 });
  pool.on('error', () => {});
  await migrateServer(pool);
});

afterAll(async () => {
  await pool?.end();
  await db?.drop();
});

const ok = (n: number) => ({ json: Buffer.from(JSON.stringify([n])), fromCache: false });

/** Delivers one row to `recipient` and dates it `ageMs` in the past. */
async function deliverAged(outbox: Outbox, recipient: string, ageMs: number, n: number) {
  const batch = randomUUID();
  await outbox.deliver('ws', recipient, batch, 'f/x', ok(n));
  await pool.query(
    `update ${SERVER_SCHEMA}.outbox set created_at = now() - $2 * interval '1 millisecond'
      where batch = $1`,
    [batch, ageMs],
  );
  return batch;
}

const rowsOf = async (recipient: string) =>
  (
    await pool.query<{ n: number }>(
      `select count(*)::int as n from ${SERVER_SCHEMA}.outbox where recipient = $1`,
      [recipient],
    )
  ).rows[0]!.n;

describe('outbox retention', () => {
  it('a row past the retention is never read back, and the sweep deletes exactly those', async () => {
    const outbox = new Outbox(pool, { retentionMs: HOUR });
    const fresh = await deliverAged(outbox, 'a@x', 0, 1);
    const recent = await deliverAged(outbox, 'a@x', HOUR - 60_000, 2);
    const old = await deliverAged(outbox, 'a@x', HOUR + 60_000, 3);
    await deliverAged(outbox, 'b@x', 30 * HOUR, 4);

    // Before any sweep, the read already leaves the expired row out.
    expect((await outbox.list('ws', 'a@x')).map((item) => item.batch).sort()).toEqual(
      [fresh, recent].sort(),
    );
    expect(await outbox.list('ws', 'b@x')).toEqual([]);
    expect(await rowsOf('a@x')).toBe(3);

    expect(await outbox.sweep()).toBe(2);
    expect(await rowsOf('a@x')).toBe(2);
    expect(await rowsOf('b@x')).toBe(0);
    const { rows } = await pool.query(`select 1 from ${SERVER_SCHEMA}.outbox where batch = $1`, [
      old,
    ]);
    expect(rows).toEqual([]);
    // Nothing left to sweep.
    expect(await outbox.sweep()).toBe(0);
  });

  it('sweeps in chunks, and several processes sweeping at once delete each row once', async () => {
    const outbox = new Outbox(pool, { retentionMs: HOUR });
    // 25,000 expired rows: more than two chunks of 10,000.
    await pool.query(
      `insert into ${SERVER_SCHEMA}.outbox (workspace, recipient, batch, runnable, result, created_at)
         select 'ws', 'bulk@x', gen_random_uuid(), 'f/x', '[1]', now() - interval '2 hours'
           from generate_series(1, 25000)`,
    );
    const sweeps = await Promise.all([outbox.sweep(), outbox.sweep(), outbox.sweep()]);
    expect(sweeps.reduce((a, b) => a + b, 0)).toBe(25_000);
    expect(await rowsOf('bulk@x')).toBe(0);
  });

  it('the default is 7 days; the server reads VIEWER_CACHE_OUTBOX_RETENTION_MS, refusing nonsense', () => {
    expect(new Outbox(pool).retentionMs).toBe(7 * 24 * HOUR);
    expect(DEFAULT_OUTBOX_RETENTION_MS).toBe(7 * 24 * HOUR);
    expect(readConfig({}).outboxRetentionMs).toBe(DEFAULT_OUTBOX_RETENTION_MS);
    expect(readConfig({ VIEWER_CACHE_OUTBOX_RETENTION_MS: '3600000' }).outboxRetentionMs).toBe(
      HOUR,
    );
    for (const bad of ['0', '-1', '1.5', 'a week', '999'])
      expect(() => readConfig({ VIEWER_CACHE_OUTBOX_RETENTION_MS: bad })).toThrow(
        /VIEWER_CACHE_OUTBOX_RETENTION_MS/,
      );
    for (const bad of [0, -1, 1.5, Number.NaN])
      expect(() => new Outbox(pool, { retentionMs: bad })).toThrow(TypeError);
  });
});
