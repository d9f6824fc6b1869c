import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CachedExecutor,
  createDatatables,
  createExecutor,
  type Datatables,
  type Executor,
  MemoryCacheStore,
  withResultCache,
} from '../../../src/index.js';
import type { ServedApps } from '../../../src/server/apps/apps.js';
import { explainRun } from '../../../src/server/apps/explain_run.js';
import { loadApps } from '../../../src/server/demo/demo_apps.js';
import { type DemoDb, demoDb } from '../../helpers/demo_db.js';
import { runCli, serverEnv } from '../../helpers/server_process.js';

// `explain` for a dual-role viewer on the clinics app (dana: provider and system administrator):
// her roles with the tenants that name them, the narrowed login patient detail uses, what the
// runnable version was seen to ask, the key's digests, the entry once she ran it — and never a
// row, password or token.

const DANA = 'dana@example.com';
let demo: DemoDb;
let datatables: Datatables;
let apps: ServedApps;
let executor: Executor;
let cache: CachedExecutor;
const prefix = () => demo.env['VIEWER_CACHE_DEMO_ROLE_PREFIX']!;

beforeAll(async () => {
  demo = await demoDb();
  datatables = await createDatatables({ connection: demo.db.url, secretKey: demo.secretKey });
  apps = await loadApps('demo', {
    childRunUrl: () => {
      throw new TypeError('no server');
    },
    env: demo.env,
  });
  executor = createExecutor({ runnables: apps.runnables, datatables });
  cache = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
}, 120_000);
afterAll(async () => {
  await datatables?.close();
  await demo?.close();
});

const explainDana = () =>
  explainRun(
    { executor, cache, datatables, apps: apps.apps },
    {
      workspace: 'demo',
      app: 'clinics',
      path: 'f/clinics/patients',
      origin: { kind: 'app', session: { email: DANA } },
    },
  );

describe('explain', () => {
  it('before any run: her roles and who named them, no entry, nothing learned', async () => {
    const e = await explainDana();
    expect(e.viewer).toEqual({ recorded: DANA, embed: null });
    expect(e.roles).toEqual(
      expect.arrayContaining([
        { datatable: 'clinics', role: `${prefix()}provider`, namedBy: ['group:providers'] },
        { datatable: 'clinics', role: `${prefix()}system_admin`, namedBy: ['group:system_admins'] },
      ]),
    );
    expect(e.entry).toEqual({ state: 'absent' });
    expect(e.datatables.dependencies).toBeNull();
  });

  it('after her run: the narrowed question, its one role and login, and the entry with its TTL', async () => {
    const job = executor.createJob({
      workspace: 'demo',
      path: 'f/clinics/patients',
      runAs: apps.apps['clinics']!.publisher,
      origin: { kind: 'app', session: { email: DANA } },
    });
    await cache.run(job);
    const e = await explainDana();
    const narrowed = `datatable://clinics?as=viewer&roles=${prefix()}provider`;
    expect(e.datatables.dependencies).toEqual([narrowed]);
    expect(e.datatables.answers).toEqual([
      { question: narrowed, roles: [`${prefix()}provider`], login: `${prefix()}provider` },
    ]);
    expect(e.entry.state).toBe('present');
    if (e.entry.state === 'present') expect(e.entry.ttlLeftS).toBeLessThanOrEqual(60);
    expect(e.key.keyDigest).toMatch(/^[0-9a-f]{64}$/);
    expect(e.invalidatedBy.join('\n')).toContain('clinics.entitlements');
    // No row, password or secret.
    const text = JSON.stringify(e);
    expect(text).not.toContain('P. Irwin');
    expect(text).not.toContain(demo.secretKey);
  });

  it('the CLI prints the same for people', async () => {
    const run = await runCli(
      serverEnv({
        DATABASE_URL: demo.db.url,
        VIEWER_CACHE_SECRET_KEY: demo.secretKey,
        VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix(),
      }),
      ['explain', '--demo', '--app', 'clinics', '--path', 'f/clinics/counts', '--viewer', DANA],
    );
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`clinics.${prefix()}system_admin  named by group:system_admins`);
    expect(run.stdout).toMatch(/login wm_set_[0-9a-f]+/);
  });
});
