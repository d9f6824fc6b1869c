import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createExecutor, createQueueExecutor, type Job } from '../../../src/index.js';
import { DEMO_PUBLISHER } from '../../../src/server/demo/demo_users.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { pollUntil, ROOT, runCli } from '../../helpers/server_process.js';

// A queue worker started without VIEWER_CACHE_SERVER_URL. Its runnables' child runs over HTTP
// go to the address each job's server sealed into the record (worker_children.test.ts), so it
// is no longer a misconfiguration and nothing is warned at start. What is left: a job queued by
// a server that sealed no address (a server of an earlier version, during a rolling upgrade).
// Its child run is the operator's coded error — an error line in the worker's log, and the
// waiting server's caller gets 503 E_WORKER_MISCONFIGURED — never the caller's `400
// E_INVALID_JOB`. `worker --help` says where child runs go.

const WS = 'demo';
const prefix = uniquePrefix();
const queuePrefix = `{${prefix}q}`;
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'queue',
  // Neither the server nor the worker is told the address.
  env: { VIEWER_CACHE_SERVER_URL: '' },
});

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

/** The version of a demo runnable as the worker computes it (its source as tsx loads it). */
async function demoVersion(path: string): Promise<string> {
  const script = `
    const { default: demo } = await import('./src/server/demo/demo.ts');
    const { createExecutor } = await import('./src/index.ts');
    const { runnables } = await demo({ childRunUrl: () => new URL('http://127.0.0.1:9'), env: {} });
    process.stdout.write(createExecutor({ runnables }).runnable(${JSON.stringify(path)}).hash);`;
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['--import', 'tsx', '--input-type=module', '-e', script],
    { cwd: ROOT },
  );
  return stdout;
}

describe('a worker without the servers’ address', { timeout: 90_000 }, () => {
  it('a job whose server sealed no address: its child run is the operator’s coded error, in the worker’s log', async () => {
    const worker = e2e.workers[0]!;
    const logged = () => worker.lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    await pollUntil(async () => logged().some((l) => l['msg'] === 'worker started'), 20_000);
    // No longer a warning at start: the address comes with each job.
    expect(logged().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED')).toBe(false);
    // A server of an earlier version: its queue executor seals no address (no `childUrl`).
    const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: null });
    redis.on('error', () => {});
    const queue = createQueueExecutor({
      executor: createExecutor({ runnables: {} }),
      redis,
      secretKey: SECRET_KEY,
      prefix: queuePrefix,
      wait: 20_000,
    });
    try {
      await queue.ready();
      const job: Job = {
        id: `old-server-${randomBytes(4).toString('hex')}`,
        workspace: WS,
        runnable: {
          path: 'f/orders/remote_child',
          hash: await demoVersion('f/orders/remote_child'),
        },
        args: {},
        perms: { email: DEMO_PUBLISHER, endUserEmail: 'carol@example.com' },
      };
      await expect(queue.run(job)).rejects.toMatchObject({
        code: 'E_WORKER_MISCONFIGURED',
        status: 503,
      });
    } finally {
      await queue.close();
      redis.disconnect();
    }
    await pollUntil(
      async () => logged().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED' && l['level'] === 50),
      20_000,
    );
  });

  it('worker --help says where child runs over HTTP go', async () => {
    const help = await runCli(e2e.env, ['worker', '--help']);
    expect(help.stdout).toContain('VIEWER_CACHE_SERVER_URL');
    expect(help.stdout).toMatch(/child runs over HTTP/);
    expect(help.stdout).toMatch(/address their server advertises/);
  });
});
