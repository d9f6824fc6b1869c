import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatatables } from '../../../src/index.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { runCli, runCliJson, serverEnv } from '../../helpers/server_process.js';

// `viewer-cache governing add|remove|list`, run as a user runs it: declared tables get their
// triggers (a write to one moves the catalog generation), both changes are idempotent, and a
// table that is not there is refused with a code.

let db: TestDatabase;
let dir: string;
let env: NodeJS.ProcessEnv;
let sql: pg.Client;

const generation = async () =>
  Number((await sql.query('select value from viewer_cache.generation')).rows[0].value);

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-cli-governing-'));
  const secretKey = randomBytes(32).toString('hex');
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: secretKey,
    VIEWER_CACHE_DATA_DIR: dir,
  });
  const datatables = await createDatatables({ connection: db.url, secretKey });
  try {
    await datatables.admin.createDatatable('demo', 'main', { database: db.name });
  } finally {
    await datatables.close();
  }
  sql = new pg.Client({ connectionString: db.url });
  await sql.connect();
  await sql.query('create table public.entitlement (email text not null, org text not null)');
});

afterAll(async () => {
  await sql?.end();
  await db?.drop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe('viewer-cache governing', () => {
  it('add declares the table (twice is the same), and a write to it moves the generation', async () => {
    const args = ['governing', 'add', '--table', 'public.entitlement', '--viewer-column', 'email'];
    const first = await runCliJson<{ generation: number }>(env, args);
    const again = await runCliJson<{ generation: number }>(env, args);
    expect(again.generation).toBeGreaterThan(first.generation);
    expect(await runCliJson(env, ['governing', 'list'])).toEqual([
      { datatable: 'main', table: 'entitlement', viewerColumn: 'email' },
    ]);
    const before = await generation();
    await sql.query(`insert into public.entitlement values ('alice@example.com', 'x')`);
    expect(await generation()).toBe(before + 1);
  }, 60_000);

  it('refuses a table or column that is not there, with a code and exit 1', async () => {
    const missing = await runCli(env, ['--json', 'governing', 'add', '--table', 'public.nope']);
    expect(missing.code).toBe(1);
    expect(JSON.parse(missing.stdout)).toMatchObject({ error: { code: 'E_CATALOG' } });
    const column = await runCli(env, [
      'governing',
      'add',
      '--table',
      'public.entitlement',
      '--viewer-column',
      'nope',
    ]);
    expect(column.code).toBe(1);
    expect(column.stderr).toMatch(/^error: E_CATALOG: /);
    const usage = await runCli(env, ['governing', 'add']);
    expect(usage.code).toBe(2);
  }, 60_000);

  it('remove drops the triggers (twice is the same): a write no longer moves the generation', async () => {
    await runCliJson(env, ['governing', 'remove', '--table', 'public.entitlement']);
    await runCliJson(env, ['governing', 'remove', '--table', 'public.entitlement']);
    expect(await runCliJson(env, ['governing', 'list'])).toEqual([]);
    const human = await runCli(env, ['governing', 'list']);
    expect(human.stdout.trim()).toBe('(no governing tables)');
    const before = await generation();
    await sql.query(`delete from public.entitlement`);
    expect(await generation()).toBe(before);
  }, 60_000);
});
