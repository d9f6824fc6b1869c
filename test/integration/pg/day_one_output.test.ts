import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { pollUntil, ROOT, serverEnv } from '../../helpers/server_process.js';

// What a person meets when they start the server on their own database with their own apps,
// output piped (a log collector, `| tee`): stdout is the log stream only (the banner goes to
// stderr), no colour codes without a terminal, no demo curl line, hints that work in this
// checkout; and one Ctrl-C delivered twice at once (terminal + npm/tsx relay) is one orderly stop.

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
});
afterAll(async () => {
  await db?.drop();
});

describe('serve --apps, output piped', () => {
  let child: ChildProcess;
  let stdout = '';
  let stderr = '';
  let closed: Promise<number | null>;

  beforeAll(async () => {
    child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        join(ROOT, 'src/server/main.ts'),
        'serve',
        '--apps',
        join(ROOT, 'test/fixtures/apps/hello_apps.ts'),
      ],
      {
        cwd: ROOT,
        env: {
          ...serverEnv({
            DATABASE_URL: db.url,
            VIEWER_CACHE_SECRET_KEY: randomBytes(32).toString('hex'),
            VIEWER_CACHE_SCHEDULE_MS: '86400000',
            HOST: '127.0.0.1',
            PORT: String(await freePort()),
            LOG_FORMAT: 'pretty',
          }),
          NO_COLOR: '',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    child.stdout!.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr!.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    closed = new Promise((resolve) => child.once('close', (code) => resolve(code)));
    await pollUntil(async () => (stdout + stderr).includes('Ctrl-C stops everything.'), 90_000, 50);
  }, 120_000);

  afterAll(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });

  it('the banner is on stderr, not in the log stream; no colour codes; no demo line', () => {
    expect(stderr).toContain('viewer-cache listening on http://127.0.0.1:');
    expect(stdout).not.toContain('listening on');
    expect(stdout + stderr).not.toContain('\u001b[');
    expect(stderr).not.toContain('orders-public');
    expect(stderr).not.toContain('demo tokens');
  });

  it('the printed hint works in a checkout', () => {
    expect(stderr).toContain(
      'Make a bearer token with: npm run -s cli -- token create --user EMAIL',
    );
  });

  it('SIGINT twice at once is one orderly stop (exit 0, no forced exit)', async () => {
    child.kill('SIGINT');
    child.kill('SIGINT');
    expect(await closed).toBe(0);
    expect(stdout).toContain('shutting down');
    expect(stdout).not.toContain('second signal');
  }, 60_000);
});
