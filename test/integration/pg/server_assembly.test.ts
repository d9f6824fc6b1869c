import pg from 'pg';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { readConfig } from '../../../src/server/process/config.js';
import { openAssembly } from '../../../src/server/start/assembly.js';
import { adminUrlFor, testDatabaseForThisTest, uniquePrefix } from '../../helpers/pg.js';
import { waitUntil } from '../../helpers/wait.js';

// Opening a process once, in order, with one release: a stop asked for between steps closes
// what was opened (no connection of this process left in pg_stat_activity).

const SECRET = 'a'.repeat(64);

async function connectionsOf(database: string): Promise<string[]> {
  const client = new pg.Client({ connectionString: adminUrlFor('postgres') });
  await client.connect();
  try {
    const { rows } = await client.query<{ application_name: string }>(
      `select application_name from pg_stat_activity
        where datname = $1 and application_name like 'viewer-cache-%'`,
      [database],
    );
    return rows.map((row) => row.application_name);
  } finally {
    await client.end();
  }
}

describe('openAssembly', () => {
  it('closes the data tables, their listener and the pool when stopped while the store opens', async () => {
    const db = await testDatabaseForThisTest(uniquePrefix());
    const stop = new AbortController();
    // The warning that Redis did not answer is the step between the store and serving.
    const logger = pino(
      { level: 'warn' },
      {
        write(line: string) {
          if (line.includes('cache store not ready')) stop.abort(new Error('stopped'));
        },
      },
    );
    const config = readConfig({
      DATABASE_URL: db.url,
      REDIS_URL: 'redis://127.0.0.1:1',
      VIEWER_CACHE_SECRET_KEY: SECRET,
    });
    const opening = openAssembly(config, logger, {
      role: 'server',
      store: true,
      signal: stop.signal,
    });
    await expect(opening).rejects.toThrow('stopped');
    await waitUntil('the process has no connection left', async () => {
      return (await connectionsOf(db.name)).length === 0;
    });
  });

  it('opens the listener and pool under the role’s names and releases them once', async () => {
    const db = await testDatabaseForThisTest(uniquePrefix());
    const config = readConfig({ DATABASE_URL: db.url, VIEWER_CACHE_SECRET_KEY: SECRET });
    const assembly = await openAssembly(config, pino({ level: 'silent' }), {
      role: 'worker',
      store: true,
    });
    await assembly.pool.query('select 1');
    expect(await connectionsOf(db.name)).toEqual(
      expect.arrayContaining([
        'viewer-cache-worker',
        `viewer-cache-worker-listener ${process.pid}`,
      ]),
    );
    const first = assembly.release();
    expect(assembly.release()).toBe(first);
    await first;
    await waitUntil('the process has no connection left', async () => {
      return (await connectionsOf(db.name)).length === 0;
    });
  });
});
