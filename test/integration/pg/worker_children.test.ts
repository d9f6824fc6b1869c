import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { childQueueName, createExecutor, type Job } from '../../../src/index.js';
import { routedQueueName } from '../../../src/queue/queue_names.js';
import { QueueKeys } from '../../../src/queue/queue_seal.js';
import { sealJob } from '../../../src/queue/sealed_job.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import demoApps from '../../../src/server/demo/demo.js';
import { DEMO_PUBLISHER } from '../../../src/server/demo/demo_users.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { asRun, httpRequest, pollUntil } from '../../helpers/server_process.js';

// Job-token children of queued jobs (issue 33, item 5): a `viewer-cache worker` started
// WITHOUT VIEWER_CACHE_SERVER_URL and with one slot (concurrency 1, the default) runs the demo's
// `f/orders/remote_child` — a runnable that starts a child over HTTP with its job token. The
// worker sends the child run to the address its server sealed into the job's record; the server
// queues that child one depth deeper (`jobs-child-1`), where the same worker process runs it
// with a slot of its own, as the parent's recorded viewer. Before this, such a child failed
// 503 E_WORKER_MISCONFIGURED on this worker, and with the address given it ran on the server.

const WS = 'demo';
const CAROL = 'carol@example.com';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const prefix = uniquePrefix();
const queuePrefix = `{${prefix}q}`;
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'queue',
  env: {
    // Neither the server nor the worker is told the servers' address.
    VIEWER_CACHE_SERVER_URL: '',
    // A parent stuck behind its own slot would answer 504 after this, well within the test.
    VIEWER_CACHE_QUEUE_WAIT_MS: '20000',
  },
});

const appRun = async (email: string, path: string) =>
  asRun(
    await e2e.request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
      token: demoToken(SECRET_KEY, email),
      body: { path },
    }),
  );

type Logged = Record<string, unknown>;
const workerLog = (): Logged[] => e2e.workers[0]!.lines.map((line) => JSON.parse(line) as Logged);
const finished = (path: string, depth: number, code = 'ok') =>
  workerLog().filter(
    (l) =>
      l['msg'] === 'job finished' &&
      l['path'] === path &&
      l['depth'] === depth &&
      l['code'] === code,
  ).length;
const regions = (rows: unknown) =>
  [...new Set((rows as { region: string }[]).map((r) => r.region))].sort();

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe('a worker with no address of its own runs job-token children', { timeout: 90_000 }, () => {
  it('with one slot, three parents at once: each child runs on the worker one queue deeper, as its parent’s viewer', async () => {
    // Nothing to warn about at start: the address comes with each job.
    expect(workerLog().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED')).toBe(false);
    // Three viewers' parents (remote_child is uncached; nothing is cached yet, so every child
    // is a miss): they queue behind the one depth-0 slot, and each, once running, holds it
    // while it waits on a child that needs a slot. Stuck, they would answer 504 after 20 s.
    const [carol, alice, bob] = await Promise.all(
      [CAROL, ALICE, BOB].map((email) => appRun(email, 'f/orders/remote_child')),
    );
    for (const answer of [carol!, alice!, bob!]) expect(answer.status, answer.text).toBe(200);
    // Each child ran as its parent's recorded viewer: RLS answers per viewer.
    expect(regions(carol!.result)).toEqual(['amer', 'emea']);
    expect(regions(alice!.result)).toEqual(['emea']);
    expect(regions(bob!.result)).toEqual(['amer']);
    // Where they ran: the parents on the depth-0 queue, their children on the depth-1 queue,
    // all on this worker process (the server runs nothing; log lines are read as they come:
    // waited for, then counted exactly).
    await pollUntil(
      async () => finished('f/orders/list', 1) === 3 && finished('f/orders/remote_child', 0) === 3,
      10_000,
    );
    expect(finished('f/orders/list', 0)).toBe(0);
    // The children's entries are their viewers' own: each viewer's list is now a hit with the
    // rows its own child returned.
    for (const [email, parent] of [
      [CAROL, carol!],
      [ALICE, alice!],
      [BOB, bob!],
    ] as const) {
      const list = await appRun(email, 'f/orders/list');
      expect(list.fromCache).toBe(true);
      expect(list.result).toEqual(parent.result);
    }
    // No error line for a missing address.
    expect(workerLog().some((l) => l['code'] === 'E_WORKER_MISCONFIGURED')).toBe(false);
  });

  it('a forged, moved or replayed child message runs nothing', async () => {
    const keys = new QueueKeys(SECRET_KEY);
    // A genuine child job, as a server records it: carol's list (the SQL one: its version is a
    // hash of its text, the same here as in the worker), run as the publisher.
    const { runnables } = await demoApps({
      childRunUrl: () => new URL('http://127.0.0.1:9/unused'),
      env: {},
    });
    const job: Job = createExecutor({ runnables }).createJob({
      workspace: WS,
      path: 'f/orders/list_sql',
      runAs: DEMO_PUBLISHER,
      origin: {
        kind: 'job-token',
        parent: { perms: { email: DEMO_PUBLISHER, endUserEmail: CAROL } },
      },
    });
    // Each depth's queue is routed like the rest: per workspace and group.
    const depth1 = {
      prefix: queuePrefix,
      name: routedQueueName(childQueueName('jobs', 1), WS, 'default'),
    };
    const seal = (place = depth1, sealKeys = keys, childUrl: string | null = null) =>
      sealJob(
        sealKeys,
        place,
        job,
        'job-token',
        keys.queueId(`forged-child:${job.id}:${place.name}`),
        Date.now() + 60_000,
        null,
        childUrl,
      );
    const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: null });
    redis.on('error', () => {});
    const queue = new Queue(depth1.name, { connection: redis, prefix: queuePrefix });
    const done = () => workerLog().filter((l) => l['msg'] === 'job finished');
    // Every job this worker finished (its counter moves as the job ends), its log line read:
    // the next line is the next job's.
    const settled = async () => {
      const metrics = await httpRequest((await e2e.workers[0]!.ready).url, 'GET', '/metrics');
      const total = metrics.text
        .split('\n')
        .filter((line) => line.startsWith('viewer_cache_worker_jobs_total{'))
        .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
      await pollUntil(async () => done().length === total, 10_000);
      return total;
    };
    const send = async (data: { queueId: string }, jobId = data.queueId) => {
      const before = await settled();
      await queue.add('run', data, { jobId, removeOnComplete: true, removeOnFail: true });
      await pollUntil(async () => done().length > before, 10_000);
      return done()[before]!;
    };
    try {
      // Sealed by someone without the secret, pointing the child's token at their own host.
      const foreign = new QueueKeys('another-deployment-secret-000000000');
      const forged = await send(seal(depth1, foreign, 'http://attacker.example:8080'));
      expect([forged['code'], forged['path']]).toEqual(['E_QUEUE_JOB_REFUSED', null]);
      // A genuine record of the depth-0 queue, moved onto the depth-1 queue.
      const moved = await send({
        ...seal({ prefix: queuePrefix, name: routedQueueName('jobs', WS, 'default') }),
      });
      expect(moved['code']).toBe('E_QUEUE_JOB_REFUSED');
      // The genuine child message runs once, at depth 1 ...
      const good = seal();
      const ran = await send(good);
      expect([ran['code'], ran['path'], ran['depth']]).toEqual(['ok', 'f/orders/list_sql', 1]);
      // ... and its replay is refused: the job is finished.
      const replay = await send(good);
      expect([replay['code'], replay['depth']]).toEqual(['E_QUEUE_JOB_REFUSED', 1]);
    } finally {
      await queue.close();
      redis.disconnect();
    }
  });
});
