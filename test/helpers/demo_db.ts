import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { createDatatables } from '../../src/index.js';
import { ApiTokens } from '../../src/server/credentials/tokens.js';
import { seedDemo } from '../../src/server/demo/demo.js';
import { migrateServer } from '../../src/server/process/server_migrations.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from './pg.js';

/**
 * Both demo worlds (orders and clinics) seeded as `serve --demo` seeds them, on a database of
 * their own, with role names prefixed (roles are cluster-wide): what `loadApps('demo')` serves
 * when `env` is handed to it.
 */
export interface DemoDb {
  readonly db: TestDatabase;
  readonly secretKey: string;
  /** The environment the demo's apps modules read their role prefix from. */
  readonly env: Readonly<Record<string, string | undefined>>;
  close(): Promise<void>;
}

export async function demoDb(): Promise<DemoDb> {
  const prefix = uniquePrefix();
  const db = await createTestDatabase(prefix);
  const secretKey = randomBytes(32).toString('hex');
  const pool = new pg.Pool({ connectionString: db.url, max: 2 });
  pool.on('error', () => {});
  const datatables = await createDatatables({ connection: db.url, secretKey });
  try {
    await migrateServer(pool);
    await seedDemo({
      datatables,
      databaseUrl: db.url,
      tokens: new ApiTokens(pool),
      secretKey,
      rolePrefix: prefix,
    });
  } catch (err) {
    await datatables.close();
    await pool.end();
    await db.drop();
    throw err;
  } finally {
    await datatables.close();
    await pool.end();
  }
  return {
    db,
    secretKey,
    env: { ...process.env, VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix },
    close: () => db.drop(),
  };
}
