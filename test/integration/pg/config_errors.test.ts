import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { type CliResult, ROOT, runCli, serverEnv } from '../../helpers/server_process.js';

// A setting that is not understood is refused at start with E_CONFIG, naming the variable or
// the flag the person typed and the values it accepts, and the CLI exits 2 (as for a bad
// command line) — never exit 1 with E_FAILED, never started anyway. A missing optional peer
// names the package to install; no server to ask is a coded connection error.

let db: TestDatabase;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  db = await createTestDatabase(uniquePrefix());
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: 'k'.repeat(64),
    HOST: '127.0.0.1',
    // A case that starts a server anyway (the old behaviour) must not take a shared port.
    PORT: '0',
  });
});
afterAll(async () => {
  await db?.drop();
});

const refusal = (result: CliResult) => {
  const lines = result.stdout.trim().split('\n');
  return JSON.parse(lines.at(-1) ?? '{}') as { error?: { code: string; message: string } };
};

describe('configuration errors', () => {
  const CASES: { what: string; env?: Record<string, string>; args: string[]; names: RegExp }[] = [
    { what: 'serve --port abc', args: ['serve', '--port', 'abc'], names: /^--port .*65535/ },
    {
      what: 'serve --execution warp',
      args: ['serve', '--execution', 'warp'],
      names: /^--execution must be in-process, queue or agent/,
    },
    { what: 'PORT=abc', env: { PORT: 'abc' }, args: ['serve'], names: /^PORT must be/ },
    {
      what: 'worker --concurrency 0',
      args: ['worker', '--demo', '--concurrency', '0'],
      names: /^--concurrency must be an integer from 1/,
    },
    {
      what: 'worker --workspaces with a bad id',
      args: ['worker', '--demo', '--workspaces', 'demo,no/slash'],
      names: /^--workspaces must be workspace ids/,
    },
    {
      what: 'worker --group with capitals',
      args: ['worker', '--demo', '--group', 'GPU'],
      names: /^--group must be 1–63 lowercase/,
    },
    {
      what: 'LOG_LEVEL=loud',
      env: { LOG_LEVEL: 'loud' },
      args: ['serve'],
      names: /^LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent/,
    },
    {
      what: 'LOG_FORMAT=xml',
      env: { LOG_FORMAT: 'xml' },
      args: ['serve'],
      names: /^LOG_FORMAT must be one of json, pretty/,
    },
    {
      what: 'a short VIEWER_CACHE_SECRET_KEY',
      env: { VIEWER_CACHE_SECRET_KEY: 'short' },
      args: ['roles', 'list'],
      names: /^VIEWER_CACHE_SECRET_KEY must be at least 32 bytes/,
    },
    {
      what: 'DATABASE_URL=garbage',
      env: { DATABASE_URL: 'garbage' },
      args: ['roles', 'list'],
      names: /^DATABASE_URL must be a postgres:\/\//,
    },
    {
      what: 'REDIS_URL=garbage',
      env: { REDIS_URL: 'garbage' },
      args: ['serve'],
      names: /^REDIS_URL must be redis:\/\//,
    },
  ];

  it.each(CASES)(
    '$what: exit 2, E_CONFIG naming it',
    async (c) => {
      const result = await runCli({ ...env, ...c.env }, ['--json', ...c.args]);
      expect(result.code, result.stdout + result.stderr).toBe(2);
      const { error } = refusal(result);
      expect(error?.code).toBe('E_CONFIG');
      expect(error?.message).toMatch(c.names);
      // The value of a secret or a connection string is never echoed.
      expect(result.stdout + result.stderr).not.toContain('garbage"');
    },
    60_000,
  );

  it('the same refusal for people: one line on stderr, exit 2', async () => {
    const result = await runCli({ ...env, LOG_LEVEL: 'loud' }, ['serve']);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/^error: E_CONFIG: LOG_LEVEL must be one of /);
  }, 60_000);

  it('serve without Fastify installed names the package to install (exit 2)', async () => {
    const result = await new Promise<CliResult>((resolve, reject) => {
      const child = spawn(
        process.execPath,
        [
          '--import',
          join(ROOT, 'test/fixtures/without_fastify.mjs'),
          '--import',
          'tsx',
          join(ROOT, 'src/server/main.ts'),
          '--json',
          'serve',
        ],
        { cwd: ROOT, env: { ...env, PORT: '0' }, stdio: ['ignore', 'pipe', 'pipe'] },
      );
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
      child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
      child.once('error', reject);
      child.once('close', (code) => resolve({ code, stdout, stderr }));
    });
    expect(result.code, result.stderr).toBe(2);
    expect(refusal(result).error).toMatchObject({
      code: 'E_PEER_MISSING',
      message: expect.stringContaining('npm install fastify@5'),
    });
  }, 60_000);

  it('cache stats with no server is a coded connection error naming the URL (exit 1)', async () => {
    const port = await freePort();
    const result = await runCli(env, [
      '--json',
      'cache',
      'stats',
      '--url',
      `http://127.0.0.1:${port}`,
    ]);
    expect(result.code).toBe(1);
    expect(refusal(result).error).toMatchObject({
      code: 'E_SERVER_UNREACHABLE',
      message: expect.stringContaining(`http://127.0.0.1:${port}`),
    });
  }, 60_000);

  it('--json applies to --version', async () => {
    const result = await runCli(env, ['--json', '--version']);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ version: expect.stringMatching(/^\d+\.\d+/) });
  }, 60_000);

  it('groups add refuses a member that is not an email address', async () => {
    const result = await runCli(env, ['--json', 'groups', 'add', 'notanemail', 'emea']);
    expect(result.code).toBe(1);
    expect(refusal(result).error).toMatchObject({
      code: 'E_CATALOG',
      message: expect.stringContaining('email address'),
    });
    const ok = await runCli(env, ['--json', 'groups', 'add', 'someone@example.com', 'emea']);
    expect(ok.code, ok.stderr).toBe(0);
  }, 60_000);

  it('agent-token list has a header row, and --json lists them', async () => {
    expect((await runCli(env, ['agent-token', 'create', '--group', 'g1'])).code).toBe(0);
    const people = await runCli(env, ['agent-token', 'list']);
    expect(people.stdout.split('\n')[0]).toBe('ID\tGROUP\tCREATED\tLABEL');
    const machine = await runCli(env, ['--json', 'agent-token', 'list']);
    expect(JSON.parse(machine.stdout)).toEqual([expect.objectContaining({ group: 'g1' })]);
  }, 60_000);
});
