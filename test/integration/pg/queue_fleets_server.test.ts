import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { AgentProcess } from '../../helpers/agent_process.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  asRun,
  clearRedisPrefix,
  httpRequest,
  pollUntil,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// A queue-mode server (issue 33, items 2 and 6) with no database worker: a miss whose
// workspace/group queue nobody takes fails 503 E_NO_WORKERS within seconds (it used to wait
// VIEWER_CACHE_QUEUE_WAIT_MS and answer 504 E_QUEUE_TIMEOUT, blaming the runnable); `/readyz`
// reports the live takers per queue; an agent of the workspace makes its queue taken, and a
// database worker of another workspace does not.

const WS = 'demo';
const ALICE = 'alice@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const QUEUE_PREFIX = `{${prefix}q}`;
const REDIS_PREFIX = `vc-e2e:${prefix}`;

let db: TestDatabase;
let dataDir: string;
let env: NodeJS.ProcessEnv;
let server: ServerProcess;
let url = '';
let agent: AgentProcess | undefined;
let worker: ServerProcess | undefined;

const appRun = (n: number) =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token: demoToken(SECRET_KEY, ALICE),
    body: { path: 'f/orders/list', args: { n } },
  }).then(asRun);

const readyz = async () => {
  const answer = await httpRequest(url, 'GET', '/readyz');
  return { status: answer.status, body: JSON.parse(answer.text) as Record<string, unknown> };
};

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-queue-fleets-'));
  env = serverEnv({
    DATABASE_URL: db.url,
    REDIS_URL: inject('redisUrl'),
    VIEWER_CACHE_REDIS_PREFIX: REDIS_PREFIX,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'queue',
    VIEWER_CACHE_QUEUE_PREFIX: QUEUE_PREFIX,
    // The queue would wait 30 s; the fleet check gives up after its 5 s.
    VIEWER_CACHE_QUEUE_WAIT_MS: '30000',
    // No start-up grace: a miss with no taker waits the 5 s, not the first minute.
    VIEWER_CACHE_AGENT_START_GRACE_MS: '0',
    HOST: '127.0.0.1',
    PORT: String(await freePort()),
    LOG_LEVEL: 'info',
  });
  server = new ServerProcess(env);
  url = (await server.ready).url;
}, 180_000);

afterAll(async () => {
  agent?.signal('SIGKILL');
  await agent?.closed;
  if (worker?.running) await worker.kill();
  await server?.kill();
  const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  await clearRedisPrefix(redis, REDIS_PREFIX);
  await clearRedisPrefix(redis, QUEUE_PREFIX);
  redis.disconnect();
  await db?.drop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe('queue mode: fleets by workspace and group', { timeout: 120_000 }, () => {
  it('with no worker or agent: not ready, and a miss fails 503 E_NO_WORKERS, not a queue timeout', async () => {
    const before = await readyz();
    expect(before.status).toBe(503);
    expect(before.body).toMatchObject({ workers: 0, queues: {} });
    expect(before.body['checks']).toMatchObject({ postgres: 'ok', workers: 'none' });
    const started = performance.now();
    const miss = await appRun(0);
    const code = (miss.json as { error?: { code?: string } }).error?.code;
    expect([miss.status, code]).toEqual([503, 'E_NO_WORKERS']);
    // Well before the queue's 30 s wait (a bound: the miss gave up after the fleet check).
    expect(performance.now() - started).toBeLessThan(20_000);
  });

  it("a database worker of another workspace does not take this workspace's misses", async () => {
    worker = new ServerProcess(env, ['--port', '0', '--workspaces', 'other'], 'worker');
    await worker.ready;
    await pollUntil(async () => (await readyz()).status === 200, 20_000);
    expect((await readyz()).body['queues']).toEqual({ 'other/default': 1 });
    const miss = await appRun(1);
    const code = (miss.json as { error?: { code?: string } }).error?.code;
    expect([miss.status, code]).toEqual([503, 'E_NO_WORKERS']);
  });

  it("an agent of the workspace takes its queue's jobs; /readyz counts it under its queue", async () => {
    const { token } = await runCliJson<{ token: string }>(env, [
      '-w',
      WS,
      'agent-token',
      'create',
      '--group',
      'default',
    ]);
    agent = new AgentProcess(
      { VIEWER_CACHE_SERVER_URL: url, VIEWER_CACHE_AGENT_TOKEN: token },
      prefix,
    );
    await pollUntil(
      async () => (await readyz()).body['queues']?.[`${WS}/default` as never] === 1,
      30_000,
    );
    expect((await readyz()).body['queues']).toEqual({ 'other/default': 1, 'demo/default': 1 });
    const answer = await appRun(2);
    expect([answer.status, answer.fromCache]).toEqual([200, false]);
  });
});
