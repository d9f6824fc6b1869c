import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatatables, errors } from '../../../src/index.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { runCli, serverEnv } from '../../helpers/server_process.js';

// One secret per deployment: the catalog records a check value of the secret key at first use
// (an HMAC of a fixed label, never the key), and a server, worker or CLI started on the same
// DATABASE_URL with another key refuses to start with E_SECRET_MISMATCH instead of taking the
// managed logins back from the others. No key is generated for a database you named.

let db: TestDatabase;
let dir: string;
const KEY = randomBytes(32).toString('hex');
const OTHER = randomBytes(32).toString('hex');

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  dir = await mkdtemp(join(tmpdir(), 'vc-secret-check-'));
});
afterAll(async () => {
  await db?.drop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

const open = (secretKey: string) => createDatatables({ connection: db.url, secretKey });

describe('the secret key check', () => {
  it('the first key is recorded; another is refused, coded; the first still opens', async () => {
    await (await open(KEY)).close();
    const refused = await open(OTHER).then(
      async (datatables) => {
        await datatables.close();
        return null;
      },
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(errors.E_SECRET_MISMATCH);
    expect((refused as Error).message).toMatch(/VIEWER_CACHE_SECRET_KEY/);
    await (await open(KEY)).close();
  });

  it('the catalog holds a check value, never the key', async () => {
    const datatables = await open(KEY);
    try {
      const pg = await import('pg');
      const client = new pg.default.Client({ connectionString: db.url });
      await client.connect();
      try {
        const { rows } = await client.query<{ v: Buffer }>(
          'select check_value as v from viewer_cache.secret_check',
        );
        expect(rows).toHaveLength(1);
        expect(rows[0]!.v.toString('hex')).not.toContain(KEY);
        expect(rows[0]!.v.toString('utf8')).not.toContain(KEY);
      } finally {
        await client.end();
      }
    } finally {
      await datatables.close();
    }
  });

  it('the CLI with another key exits with E_SECRET_MISMATCH', async () => {
    const env = serverEnv({ DATABASE_URL: db.url, VIEWER_CACHE_SECRET_KEY: OTHER });
    const result = await runCli(env, ['--json', 'roles', 'list']);
    expect(result.code).toBe(1);
    expect(JSON.parse(result.stdout)).toMatchObject({ error: { code: 'E_SECRET_MISMATCH' } });
  }, 60_000);

  it('with DATABASE_URL and no key: E_CONFIG (exit 2), and no key file is written', async () => {
    const dataDir = join(dir, 'never');
    const env = serverEnv({ DATABASE_URL: db.url, VIEWER_CACHE_DATA_DIR: dataDir });
    const result = await runCli(env, ['--json', 'roles', 'list']);
    expect(result.code).toBe(2);
    expect(JSON.parse(result.stdout)).toMatchObject({
      error: { code: 'E_CONFIG', message: expect.stringContaining('VIEWER_CACHE_SECRET_KEY') },
    });
    expect(existsSync(join(dataDir, 'secret.key'))).toBe(false);
  }, 60_000);
});
