import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { runCli, serverEnv } from '../../helpers/server_process.js';

// The CLI as an operator meets it: --version; a usage error is one line with a stable code and
// a hint, exit 2, JSON under --json; `cache invalidate` that nobody heard fails, naming the
// prefix it used, instead of saying "invalidated".

const url = inject('redisUrl');
const prefix = `cli-op-${randomBytes(4).toString('hex')}:`;
let env: NodeJS.ProcessEnv;
let subscriber: Redis;

beforeAll(() => {
  env = serverEnv({ REDIS_URL: url, VIEWER_CACHE_REDIS_PREFIX: prefix });
  subscriber = new Redis(url, { maxRetriesPerRequest: 1 });
  subscriber.on('error', () => {});
});

afterAll(async () => {
  await subscriber?.quit();
});

describe('viewer-cache CLI', () => {
  it('--version prints the package version', async () => {
    const { version } = (await import('../../../package.json', { with: { type: 'json' } })).default;
    const result = await runCli(env, ['--version']);
    expect(result).toMatchObject({ code: 0, stdout: `${version}\n` });
  }, 60_000);

  it('a usage error is one line with E_USAGE and a hint, exit 2; JSON under --json', async () => {
    const text = await runCli(env, ['roles', 'create']);
    expect(text.code).toBe(2);
    expect(text.stdout).toBe('');
    expect(text.stderr).toBe(
      "error: E_USAGE: missing required argument 'name' (run viewer-cache roles create --help)\n",
    );
    const json = await runCli(env, ['--json', 'nope']);
    expect(json.code).toBe(2);
    expect(json.stderr).toBe('');
    expect(JSON.parse(json.stdout)).toEqual({
      error: {
        code: 'E_USAGE',
        message: expect.stringContaining("unknown command 'nope'"),
        hint: 'run viewer-cache --help',
      },
    });
    expect(json.stdout.trim().split('\n')).toHaveLength(1);
  }, 60_000);

  it('cache invalidate that no server heard fails with a code and names its prefix', async () => {
    const unheard = await runCli(env, ['--json', '-w', 'acme', 'cache', 'invalidate']);
    expect(unheard.code).toBe(1);
    const { error } = JSON.parse(unheard.stdout) as { error: { code: string; message: string } };
    expect(error.code).toBe('E_INVALIDATION_UNHEARD');
    expect(error.message).toContain(JSON.stringify(prefix));
    // With a process listening under the prefix, it is heard, and the answer says by how many.
    await subscriber.subscribe(`${prefix}invalidations`);
    const heard = await runCli(env, ['--json', '-w', 'acme', 'cache', 'invalidate']);
    expect(heard.code).toBe(0);
    expect(JSON.parse(heard.stdout)).toMatchObject({ prefix, receivers: 1 });
  }, 60_000);
});
