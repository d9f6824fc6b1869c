import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { pollUntil } from '../../helpers/server_process.js';

// The access record (VIEWER_CACHE_ACCESS_RECORD=on): a row per run of the HTTP API — who was
// shown what, when — with the viewer as a keyed hash. An administrator who knows an email lists
// that person's runs with the CLI; the table alone names nobody.

const WS = 'demo';
const ALICE = 'alice@example.com';
const DAVE = 'dave@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'in-process',
  env: { VIEWER_CACHE_ACCESS_RECORD: 'on' },
});

interface Row {
  app: string | null;
  runnable: string;
  origin: string;
  outcome: string;
  code: string | null;
}

const run = (email: string | null, path: string) =>
  e2e.request(
    'POST',
    email === null
      ? `/api/w/${WS}/public/apps/orders-public/run`
      : `/api/w/${WS}/apps/orders-dashboard/run`,
    {
      ...(email === null ? {} : { token: demoToken(SECRET_KEY, email) }),
      body: { path },
    },
  );

const listFor = (email: string) =>
  e2e.cliJson<Row[]>(['-w', WS, 'access-record', 'list', '--user', email]);

/** The viewer's rows once there are `count` (rows are written within a second or so). */
async function listedAtLeast(email: string, count: number): Promise<Row[]> {
  let rows: Row[] = [];
  await pollUntil(async () => {
    rows = await listFor(email);
    return rows.length >= count;
  }, 15_000);
  return rows;
}

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe('the access record', () => {
  it("lists one viewer's runs — app, runnable, origin, outcome — and nobody else's", async () => {
    expect((await run(ALICE, 'f/orders/list')).status).toBe(200);
    expect((await run(ALICE, 'f/orders/list')).status).toBe(200);
    expect((await run(DAVE, 'f/orders/list')).status).toBe(403);
    // Written in batches, off the request path: within a second or so.
    const alice = await listedAtLeast(ALICE, 2);
    expect(alice.map((r) => [r.app, r.runnable, r.origin, r.outcome, r.code])).toEqual([
      ['orders-dashboard', 'f/orders/list', 'app', 'hit', null],
      ['orders-dashboard', 'f/orders/list', 'app', 'miss', null],
    ]);
    const dave = await listedAtLeast(DAVE, 1);
    expect(dave.map((r) => [r.outcome, r.code])).toEqual([['refused', 'E_NO_ROLES']]);
    expect(await listFor('nobody@example.com')).toEqual([]);
  });

  it('the table names nobody: viewers are keyed hashes, never emails, args or rows', async () => {
    const sql = new pg.Client({ connectionString: e2e.env['DATABASE_URL'] });
    await sql.connect();
    try {
      const { rows } = await sql.query(
        'select to_jsonb(r)::text as row from viewer_cache_server.access_record r',
      );
      expect(rows.length).toBeGreaterThanOrEqual(3);
      const text = rows.map((r: { row: string }) => r.row).join('\n');
      for (const secret of [ALICE, DAVE, 'alice', 'emea', SECRET_KEY]) {
        expect(text).not.toContain(secret);
      }
    } finally {
      await sql.end();
    }
  });
});
