import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { runCli, runCliJson, serverEnv } from '../../helpers/server_process.js';

// `datatables add|list` and `groups list`, as an operator runs them on their own database:
// JSON under --json, and for people a header row above tab-separated rows.

let db: TestDatabase;
let dir: string;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-cli-lists-'));
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: randomBytes(32).toString('hex'),
    VIEWER_CACHE_DATA_DIR: dir,
  });
});

afterAll(async () => {
  await db?.drop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe('viewer-cache datatables and groups', () => {
  it('datatables add registers a data table (twice is the same); list shows it', async () => {
    const args = ['-w', 'acme', 'datatables', 'add', 'main', '--database', db.name];
    expect(await runCliJson(env, args)).toMatchObject({ datatable: 'main', database: db.name });
    await runCliJson(env, args);
    expect(await runCliJson(env, ['-w', 'acme', 'datatables', 'list'])).toEqual([
      { name: 'main', database: db.name, defaultRole: null },
    ]);
    const text = await runCli(env, ['-w', 'acme', 'datatables', 'list']);
    expect(text.stdout).toBe(`DATATABLE\tDATABASE\tDEFAULT_ROLE\nmain\t${db.name}\t-\n`);
    const usage = await runCli(env, ['datatables', 'add', 'main']);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toMatch(/^error: E_USAGE: required option '--database <db>'/);
  }, 90_000);

  it('groups list shows the members of a group, with a header row', async () => {
    for (const email of ['bo@acme.test', 'al@acme.test'])
      await runCliJson(env, ['-w', 'acme', 'groups', 'add', email, 'emea']);
    expect(await runCliJson(env, ['-w', 'acme', 'groups', 'list', 'emea'])).toEqual([
      'al@acme.test',
      'bo@acme.test',
    ]);
    const text = await runCli(env, ['-w', 'acme', 'groups', 'list', 'emea']);
    expect(text.stdout).toBe('MEMBER\nal@acme.test\nbo@acme.test\n');
    const none = await runCli(env, ['-w', 'acme', 'groups', 'list', 'amer']);
    expect(none.stdout).toBe('(no members of group amer)\n');
    const roles = await runCli(env, ['-w', 'acme', 'roles', 'list']);
    expect(roles.stdout).toBe('(no roles)\n');
  }, 90_000);
});
