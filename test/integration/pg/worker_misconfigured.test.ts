import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { asRun, pollUntil, runCli } from '../../helpers/server_process.js';

// A queue worker started without VIEWER_CACHE_SERVER_URL, running a runnable that starts a
// child run over HTTP with its job token: the operator's missing setting is told as such — a
// warning at start and an error line in the worker's log, and the caller gets 503
// E_WORKER_MISCONFIGURED — never the caller's `400 E_INVALID_JOB`. `worker --help` names it.

const WS = 'demo';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'queue',
  // Neither the server (it runs job-token children itself) nor the worker is told the address.
  env: { VIEWER_CACHE_SERVER_URL: '' },
});

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe('a worker without the servers’ address', { timeout: 90_000 }, () => {
  it('a child run over HTTP is the operator’s coded error, in the worker’s log, not the caller’s 400', async () => {
    const worker = e2e.workers[0]!;
    const logged = () => worker.lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    await pollUntil(
      async () => logged().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED' && l['level'] === 40),
      20_000,
    );
    const answer = asRun(
      await e2e.request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
        token: demoToken(SECRET_KEY, 'carol@example.com'),
        body: { path: 'f/orders/remote_child' },
      }),
    );
    expect(answer.status, answer.text).toBe(503);
    expect((answer.json as { error?: { code?: string } }).error?.code).toBe(
      'E_WORKER_MISCONFIGURED',
    );
    await pollUntil(
      async () => logged().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED' && l['level'] === 50),
      20_000,
    );
  });

  it('worker --help names VIEWER_CACHE_SERVER_URL', async () => {
    const help = await runCli(e2e.env, ['worker', '--help']);
    expect(help.stdout).toContain('VIEWER_CACHE_SERVER_URL');
    expect(help.stdout).toMatch(/child runs over HTTP/);
  });
});
