import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  httpRequest,
  ROOT,
  runCli,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// `viewer-cache serve --apps PATH` serves exactly the module's runnables, apps, hooks and
// schedules; without a module and without the demo, a server on your database serves nothing of
// the demo (no demo schedule failing every minute, no demo app). A module that is missing or
// malformed refuses the start with a code, before anything is written.

const HELLO = join(ROOT, 'test/fixtures/apps/hello_apps.ts');
const TYPO = join(ROOT, 'test/fixtures/apps/typo_apps.ts');

let db: TestDatabase;
let dir: string;
let base: NodeJS.ProcessEnv;

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-apps-'));
  base = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: randomBytes(32).toString('hex'),
    VIEWER_CACHE_DATA_DIR: dir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
  });
});

afterAll(async () => {
  await db?.drop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

async function serve(args: string[], env: NodeJS.ProcessEnv = {}) {
  const server = new ServerProcess({ ...base, PORT: String(await freePort()), ...env }, args);
  const { url } = await server.ready;
  return { server, url };
}

async function stop(server: ServerProcess) {
  server.signal('SIGINT');
  await server.closed;
}

describe('serve --apps', () => {
  it('serves the module: its app, hook and schedule, and nothing of the demo', async () => {
    const { server, url } = await serve(['--apps', HELLO]);
    try {
      const { token } = await runCliJson<{ token: string }>(base, [
        '-w',
        'acme',
        'token',
        'create',
        '--user',
        'visitor@acme.test',
      ]);
      const run = await httpRequest(url, 'POST', '/api/w/acme/apps/hello/run', {
        token,
        body: { path: 'f/hello', args: { name: 'Ada' } },
      });
      expect(run.status).toBe(200);
      expect(run.json).toMatchObject({ result: { hello: 'Ada', signedIn: true } });
      const hook = await httpRequest(url, 'POST', '/api/w/acme/hooks/hello-hook', {
        token,
        body: {},
      });
      expect(hook.status).toBe(200);
      expect(hook.json).toMatchObject({ result: { hello: 'world', signedIn: false } });
      const demoApp = await httpRequest(url, 'POST', '/api/w/acme/apps/orders-dashboard/run', {
        token,
        body: { path: 'f/orders/list', args: {} },
      });
      expect(demoApp.json).toMatchObject({ error: { code: 'E_UNKNOWN_APP' } });
      const schedules = await httpRequest(url, 'GET', '/api/w/acme/schedules', { token });
      expect(schedules.json).toMatchObject({
        schedules: [{ name: 'hello-every-minute', lastOutcome: 'ok' }],
      });
      expect((schedules.json as { schedules: unknown[] }).schedules).toHaveLength(1);
    } finally {
      await stop(server);
    }
    // The demo was not seeded into a database it was not asked to seed.
    const sql = new pg.Client({ connectionString: db.url });
    await sql.connect();
    try {
      const { rows } = await sql.query(
        "select count(*)::int as n from pg_namespace where nspname in ('demo', 'clinics')",
      );
      expect(rows[0].n).toBe(0);
    } finally {
      await sql.end();
    }
  }, 120_000);

  it('VIEWER_CACHE_APPS is the same as --apps; VIEWER_CACHE_BODY_LIMIT_BYTES bounds bodies', async () => {
    const { server, url } = await serve([], {
      VIEWER_CACHE_APPS: HELLO,
      VIEWER_CACHE_BODY_LIMIT_BYTES: '2048',
    });
    try {
      const { token } = await runCliJson<{ token: string }>(base, [
        '-w',
        'acme',
        'token',
        'create',
        '--user',
        'visitor@acme.test',
      ]);
      const hook = await httpRequest(url, 'POST', '/api/w/acme/hooks/hello-hook', {
        token,
        body: {},
      });
      expect(hook.json).toMatchObject({ result: { hello: 'world' } });
      const big = await httpRequest(url, 'POST', '/api/w/acme/hooks/hello-hook', {
        token,
        body: { name: 'x'.repeat(3000) },
      });
      expect(big.status).toBe(413);
      expect(big.json).toMatchObject({ error: { code: 'E_PAYLOAD_TOO_LARGE' } });
    } finally {
      await stop(server);
    }
  }, 120_000);

  it('without apps or the demo, a server on your database runs no demo schedule and serves no demo app', async () => {
    const { server, url } = await serve([]);
    try {
      const { token } = await runCliJson<{ token: string }>(base, [
        'token',
        'create',
        '--user',
        'alice@example.com',
      ]);
      const schedules = await httpRequest(url, 'GET', '/api/w/demo/schedules', { token });
      expect(schedules.json).toEqual({ schedules: [] });
      const demoApp = await httpRequest(url, 'POST', '/api/w/demo/apps/orders-dashboard/run', {
        token,
        body: { path: 'f/orders/list', args: {} },
      });
      expect(demoApp.json).toMatchObject({ error: { code: 'E_UNKNOWN_APP' } });
      expect(server.lines.join('\n')).toContain('no apps to serve');
    } finally {
      await stop(server);
    }
  }, 120_000);

  it('refuses a missing module, a malformed one, and --apps with --demo, before writing anything', async () => {
    const fresh = join(dir, 'never-written');
    const env = { ...base, VIEWER_CACHE_DATA_DIR: fresh, VIEWER_CACHE_SECRET_KEY: '' };
    const missing = await runCli(env, ['--json', 'serve', '--apps', join(dir, 'nope.ts')]);
    expect(missing.code).toBe(1);
    expect(JSON.parse(missing.stdout)).toMatchObject({
      error: { code: 'E_APPS_MODULE_NOT_FOUND' },
    });
    const typo = await runCli(env, ['--json', 'serve', '--apps', TYPO]);
    expect(typo.code).toBe(1);
    const refusal = JSON.parse(typo.stdout.trim().split('\n').at(-1)!) as {
      error: { code: string; message: string };
    };
    expect(refusal.error.code).toBe('E_APPS_MODULE_INVALID');
    expect(refusal.error.message).toContain('apps["hello"].runnables names no runnable: "f/helo"');
    const both = await runCli(env, ['--json', 'serve', '--apps', HELLO, '--demo']);
    expect(both.code).not.toBe(0);
    expect(both.stdout + both.stderr).toContain('exclude each other');
    // Nothing was written: no secret key generated, no embedded cluster initialised.
    expect(existsSync(fresh)).toBe(false);
  }, 120_000);
});
