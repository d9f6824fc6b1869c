import { chmod, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import {
  type CachedExecutor,
  createDatatables,
  createExecutor,
  type Datatables,
  type DuckdbModule,
  type Executor,
  MemoryCacheStore,
  type RawExecutorOptions,
  type RunnableDefinition,
  type RunOrigin,
  withResultCache,
} from '../../src/index.js';
import { clinicsWorld, seedClinics } from '../../src/server/demo/demo_clinics.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from './pg.js';

export const WS = 'demo';
export const PUBLISHER = 'publisher@example.com';
const SECRET_KEY = 'test-secret-key-0123456789abcdef-0123456789';

/**
 * The clinics demo (src/server/demo/demo_clinics.ts) on a database of its own, with an executor
 * whose Python interpreter and DuckDB module are counted: `spawns()` is how many python3
 * processes were started, `instances()` how many DuckDB instances were created. Counting goes
 * through the executor's own options (a wrapper command, a module loader), not a backdoor.
 */
export interface ClinicsDb {
  readonly prefix: string;
  readonly db: TestDatabase;
  readonly datatables: Datatables;
  readonly executor: Executor;
  readonly cached: CachedExecutor;
  readonly roles: { provider: string; systemAdmin: string; directory: string; embed: string };
  /** Superuser connections to the database, for changes behind the library's back. */
  readonly sql: pg.Pool;
  /** Waits until the data tables have the catalog generation a direct write produced. */
  settled(): Promise<void>;
  spawns(): Promise<number>;
  instances(): number;
  /** Another executor on the same data tables, with more runnables and options. */
  executorWith(
    runnables: Record<string, RunnableDefinition>,
    options?: Partial<RawExecutorOptions>,
  ): Executor;
  close(): Promise<void>;
}

export async function clinicsDb(): Promise<ClinicsDb> {
  const prefix = uniquePrefix();
  const db = await createTestDatabase(prefix);
  const datatables = await createDatatables({
    connection: db.url,
    secretKey: SECRET_KEY,
    pools: { prepareAhead: false },
  });
  try {
    const { roles } = await seedClinics({
      datatables,
      databaseUrl: db.url,
      workspace: WS,
      rolePrefix: prefix,
    });
    const dir = await mkdtemp(join(tmpdir(), 'vc-test-python-'));
    const counter = join(dir, 'spawns');
    await writeFile(counter, '');
    const command = join(dir, 'python3');
    await writeFile(command, `#!/bin/sh\necho x >> '${counter}'\nexec python3 "$@"\n`);
    await chmod(command, 0o755);
    let instances = 0;
    const load = async (): Promise<DuckdbModule> => {
      const real = (await import('@duckdb/node-api')) as unknown as DuckdbModule;
      return {
        DuckDBInstance: {
          create(path, options) {
            instances++;
            return real.DuckDBInstance.create(path, options);
          },
        },
      };
    };
    const world = clinicsWorld(prefix, PUBLISHER);
    const executorWith = (
      runnables: Record<string, RunnableDefinition>,
      options: Partial<RawExecutorOptions> = {},
    ) =>
      createExecutor({
        runnables: { ...world.runnables, ...runnables },
        datatables,
        ...options,
        python: { command, ...options.python },
        duckdb: { load, ...options.duckdb },
      });
    const executor = executorWith({});
    const sql = new pg.Pool({ connectionString: db.url, max: 2 });
    sql.on('error', () => {});
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: datatables.fingerprint,
    });
    return {
      prefix,
      db,
      datatables,
      executor,
      cached,
      roles,
      sql,
      async settled() {
        const { rows } = await sql.query('select value from viewer_cache.generation');
        await datatables.waitForGeneration(Number(rows[0]!['value']));
      },
      async spawns() {
        return (await readFile(counter, 'utf8')).split('\n').filter(Boolean).length;
      },
      instances: () => instances,
      executorWith,
      async close() {
        await sql.end();
        await datatables.close();
        await db.drop();
      },
    };
  } catch (err) {
    await datatables.close();
    await db.drop();
    throw err;
  }
}

/** An app request by `viewer` (null: an anonymous visitor). */
export const appOrigin = (viewer: string | null): RunOrigin => ({
  kind: 'app',
  session: viewer === null ? null : { email: viewer },
});

/** A per-viewer embed link of the clinics app, signed for `health_system`. */
export const embedOrigin = (health_system: string): RunOrigin => ({
  kind: 'embed',
  viewer: { app: 'clinics', attributes: { health_system }, email: null },
});

/** Runs `path` for `origin` through `through`: its value, or the code it was refused with. */
export async function outcome(
  executor: Executor,
  through: { run: Executor['run'] },
  path: string,
  origin: RunOrigin,
  args: Record<string, unknown> = {},
): Promise<{ value?: unknown; code?: string; fromCache?: boolean }> {
  const job = executor.createJob({ workspace: WS, path, runAs: PUBLISHER, origin, args });
  try {
    const result = await through.run(job);
    return {
      value: JSON.parse(Buffer.from(result.json()).toString('utf8')),
      fromCache: result.fromCache,
    };
  } catch (err) {
    return { code: (err as { code?: string }).code ?? `uncoded: ${(err as Error).message}` };
  }
}
