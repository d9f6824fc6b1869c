import pg from 'pg';
import { expect, inject, it } from 'vitest';

// Each pg project must really run on the server it names: a global setup that silently fell
// back to the embedded server once made `pg:url` test PostgreSQL 18 twice and 15 never.
it('runs on the PostgreSQL this project names', async () => {
  const target = process.env['VC_TEST_POSTGRES_TARGET'];
  const version = inject('pgVersionNum');
  if (target === 'embedded') expect(version).toBeGreaterThanOrEqual(180000);
  if (target === 'url') {
    const client = new pg.Client({ connectionString: process.env['DATABASE_URL'] });
    await client.connect();
    try {
      const { rows } = await client.query<{ v: string }>(
        "select current_setting('server_version_num') as v",
      );
      expect(version).toBe(Number(rows[0]!.v));
    } finally {
      await client.end();
    }
  }
  expect(version).toBeGreaterThanOrEqual(150000);
});
