import { Queue, QueueEvents } from 'bullmq';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  createExecutor,
  createQueueExecutor,
  createQueueJobSource,
  type QueueJobOutcome,
  type RunnableDefinition,
} from '../../../src/index.js';
import { fleetKey, fleetMember, routedQueueName } from '../../../src/queue/queue_names.js';
import { QueueKeys } from '../../../src/queue/queue_seal.js';
import { sealJob } from '../../../src/queue/sealed_job.js';
import { app, type OrdersDb, ordersDb, PUBLISHER, SECRET_KEY } from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';
import { waitUntil } from '../../helpers/wait.js';

// Fleets by workspace and group (issue 33, item 6), on one real Redis: every workspace's jobs
// go to a queue of their own per worker group, so a worker or agent of workspace A never
// receives — never fetches, locks, opens or claims — a job of workspace B; a message copied
// into another workspace's queue does not open there; and a miss whose queue nobody takes
// fails E_NO_WORKERS at once instead of waiting out the queue's wait.

const A = 'demo';
const B = 'other';
const ALICE = 'alice@example.com';

let fx: OrdersDb;
let datatables: Datatables;
let deploy: QueueDeployment;
const keys = new QueueKeys(SECRET_KEY);

const runnables: Record<string, RunnableDefinition> = {
  // No data table: the same runnable serves both workspaces.
  echo: { cacheTtlS: 0, fn: async (args) => args },
};

const run = (
  side: Awaited<ReturnType<QueueDeployment['server']>>,
  workspace: string,
  args: Record<string, unknown>,
) =>
  side.cached.run(
    side.registry.createJob({
      workspace,
      path: 'echo',
      runAs: PUBLISHER,
      origin: app(ALICE),
      args,
    }),
  );

/** Outcomes of one worker (its own list, besides the deployment's). */
function recorder() {
  const outcomes: QueueJobOutcome[] = [];
  return { outcomes, onFinished: (o: QueueJobOutcome) => void outcomes.push(o) };
}

beforeAll(async () => {
  fx = await ordersDb();
  datatables = await fx.open({ migrate: false });
});

afterEach(async () => {
  await deploy?.close();
});

afterAll(async () => {
  await fx?.close();
});

const fresh = () => {
  deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
  return deploy;
};

describe('two workspaces on one Redis', () => {
  it("each workspace's jobs run only on its own fleet", async () => {
    const d = fresh();
    const server = await d.server();
    const a = recorder();
    const b = recorder();
    await d.worker({ workspaces: [A], onFinished: a.onFinished });
    await d.worker({ workspaces: [B], onFinished: b.onFinished });
    const results = await Promise.all([
      run(server, A, { n: 1 }),
      run(server, A, { n: 2 }),
      run(server, A, { n: 3 }),
      run(server, B, { n: 4 }),
      run(server, B, { n: 5 }),
    ]);
    expect(results.map((r) => (r.value as { n: number }).n)).toEqual([1, 2, 3, 4, 5]);
    expect(a.outcomes.map((o) => o.code)).toEqual(['ok', 'ok', 'ok']);
    expect(b.outcomes.map((o) => o.code)).toEqual(['ok', 'ok']);
  });

  it("a worker of A never fetches B's waiting job; B's worker runs it", async () => {
    const d = fresh();
    const a = recorder();
    await d.worker({ workspaces: [A], onFinished: a.onFinished });
    // A genuine job of B, put on B's queue while only A's worker runs.
    const registry = createExecutor({ runnables });
    const job = registry.createJob({
      workspace: B,
      path: 'echo',
      runAs: PUBLISHER,
      origin: app(ALICE),
      args: { b: 1 },
    });
    const nameB = routedQueueName('jobs', B, 'default');
    const queueId = keys.queueId(`b:${job.id}`);
    const message = sealJob(
      keys,
      { prefix: d.prefix, name: nameB },
      job,
      'app',
      queueId,
      Date.now() + 60_000,
    );
    const queueB = new Queue(nameB, { connection: d.redis, prefix: d.prefix });
    const eventsB = new QueueEvents(nameB, { connection: d.redis.duplicate(), prefix: d.prefix });
    const activeOn: string[] = [];
    eventsB.on('active', ({ jobId }) => activeOn.push(jobId));
    try {
      await eventsB.waitUntilReady();
      await queueB.add('run', message, { jobId: queueId, removeOnComplete: true });
      // A's worker is connected and idle (its own queue empty): B's job is still waiting,
      // never made active (fetched, locked) by anyone.
      expect(await queueB.getJobState(queueId)).toBe('waiting');
      const b = recorder();
      await d.worker({ workspaces: [B], onFinished: b.onFinished });
      await waitUntil('B ran its job', () => b.outcomes.length === 1);
      expect(b.outcomes[0]!.code).toBe('ok');
      // Fetched once, by B's worker; A's worker never met it.
      expect(activeOn).toEqual([queueId]);
      expect(a.outcomes).toEqual([]);
    } finally {
      await queueB.close();
      await eventsB.close();
    }
  });

  it("an agent's take for A never fetches B's job (the server's job source)", async () => {
    const d = fresh();
    const source = createQueueJobSource({
      redis: d.redis,
      secretKey: SECRET_KEY,
      prefix: d.prefix,
    });
    await source.ready();
    const registry = createExecutor({ runnables });
    const job = registry.createJob({
      workspace: B,
      path: 'echo',
      runAs: PUBLISHER,
      origin: app(ALICE),
      args: { b: 2 },
    });
    const nameB = routedQueueName('jobs', B, 'default');
    const queueId = keys.queueId(`b:${job.id}`);
    const message = sealJob(
      keys,
      { prefix: d.prefix, name: nameB },
      job,
      'app',
      queueId,
      Date.now() + 60_000,
    );
    const queueB = new Queue(nameB, { connection: d.redis, prefix: d.prefix });
    const eventsB = new QueueEvents(nameB, { connection: d.redis.duplicate(), prefix: d.prefix });
    const activeOn: string[] = [];
    eventsB.on('active', ({ jobId }) => activeOn.push(jobId));
    try {
      await eventsB.waitUntilReady();
      await queueB.add('run', message, { jobId: queueId, removeOnComplete: true });
      // An agent of A (and one of B's other group) takes for a while: nothing for them.
      expect(await source.next(A, 1500)).toBeNull();
      expect(await source.next(B, 1500, undefined, 'gpu')).toBeNull();
      expect(activeOn).toEqual([]);
      expect(await queueB.getJobState(queueId)).toBe('waiting');
      // An agent of B and its group gets it, opened from the sealed record.
      const held = await source.next(B, 5000);
      expect(held?.job.args).toEqual({ b: 2 });
      await held?.complete(Buffer.from('{"b":2}'));
      expect(activeOn).toEqual([queueId]);
    } finally {
      await queueB.close();
      await eventsB.close();
      await source.close();
    }
  });

  it("a genuine message copied into another workspace's queue does not open there", async () => {
    const d = fresh();
    const a = recorder();
    const b = recorder();
    await d.worker({ workspaces: [B], onFinished: b.onFinished });
    const registry = createExecutor({ runnables });
    const job = registry.createJob({
      workspace: A,
      path: 'echo',
      runAs: PUBLISHER,
      origin: app(ALICE),
      args: { a: 1 },
    });
    const nameA = routedQueueName('jobs', A, 'default');
    const nameB = routedQueueName('jobs', B, 'default');
    const queueId = keys.queueId(`a:${job.id}`);
    const good = sealJob(
      keys,
      { prefix: d.prefix, name: nameA },
      job,
      'app',
      queueId,
      Date.now() + 60_000,
    );
    const queueA = new Queue(nameA, { connection: d.redis, prefix: d.prefix });
    const queueB = new Queue(nameB, { connection: d.redis, prefix: d.prefix });
    try {
      // Copied as it is, and with its clear workspace edited to B's: refused by B's worker.
      await queueB.add('run', good, { jobId: queueId, removeOnFail: true });
      await waitUntil('B refused the copy', () => b.outcomes.length === 1);
      // (The refused job is removed from B's queue before its id can be added again.)
      await waitUntil('the copy is gone', async () => (await queueB.getJob(queueId)) === undefined);
      await queueB.add('run', { ...good, workspace: B }, { jobId: queueId, removeOnFail: true });
      await waitUntil('B refused the edited copy', () => b.outcomes.length === 2);
      expect(b.outcomes.map((o) => o.code)).toEqual(['E_QUEUE_JOB_REFUSED', 'E_QUEUE_JOB_REFUSED']);
      expect(b.outcomes.map((o) => o.path)).toEqual([null, null]);
      // Neither took the job's claim: in its own queue it runs, on A's worker, once.
      await queueA.add('run', good, { jobId: queueId, removeOnComplete: true });
      await d.worker({ workspaces: [A], onFinished: a.onFinished });
      await waitUntil('A ran it', () => a.outcomes.length === 1);
      expect(a.outcomes[0]!.code).toBe('ok');
    } finally {
      await queueA.close();
      await queueB.close();
    }
  });
});

describe('groups', () => {
  it("a server's jobs go to its group's workers only", async () => {
    const d = fresh();
    const gpu = await d.server({ group: 'gpu', noWorkersWait: 300 });
    const plain = recorder();
    await d.worker({ workspaces: [A], onFinished: plain.onFinished });
    // Only a default-group worker: the gpu group's miss finds nobody.
    await expect(run(gpu, A, { g: 1 })).rejects.toMatchObject({ code: 'E_NO_WORKERS' });
    const gpuWorker = recorder();
    await d.worker({ workspaces: [A], group: 'gpu', onFinished: gpuWorker.onFinished });
    expect((await run(gpu, A, { g: 2 })).value).toEqual({ g: 2 });
    expect(gpuWorker.outcomes.map((o) => o.code)).toEqual(['ok']);
    expect(plain.outcomes).toEqual([]);
  });
});

describe('a miss whose queue has no live worker', () => {
  it('fails E_NO_WORKERS after the short wait, not the queue wait, and nothing is left queued', async () => {
    const d = fresh();
    const server = await d.server({ wait: 30_000, noWorkersWait: 500 });
    const started = performance.now();
    await expect(run(server, A, { none: 1 })).rejects.toMatchObject({ code: 'E_NO_WORKERS' });
    // Not the 30 s the queue would wait (a bound, not a timing: the miss gave up early).
    expect(performance.now() - started).toBeLessThan(10_000);
    expect(await server.queue.jobCounts()).toEqual({ waiting: 0, active: 0, delayed: 0 });
    // B's worker does not make A's queue taken.
    await d.worker({ workspaces: [B] });
    await expect(run(server, A, { none: 2 })).rejects.toMatchObject({ code: 'E_NO_WORKERS' });
    expect(await server.queue.fleet()).toEqual({ [`${B}/default`]: 1 });
  });

  it('a miss waiting for a worker runs once one starts within the wait', async () => {
    const d = fresh();
    const server = await d.server({ noWorkersWait: 20_000 });
    const pending = run(server, A, { late: 1 });
    await d.worker({ workspaces: [A] });
    expect((await pending).value).toEqual({ late: 1 });
  });

  it('after the last worker stops, misses fail fast again', async () => {
    const d = fresh();
    const server = await d.server({ noWorkersWait: 300 });
    const worker = await d.worker({ workspaces: [A] });
    expect((await run(server, A, { up: 1 })).value).toEqual({ up: 1 });
    await worker.close();
    // Its heartbeat is gone at once (a killed worker's ages out in 15 s).
    await waitUntil('no worker left', async () => (await server.queue.liveWorkers()) === 0);
    await expect(run(server, A, { up: 2 })).rejects.toMatchObject({ code: 'E_NO_WORKERS' });
  });

  it('a queue known to be taken costs no round trip per miss (one fleet read a second at most)', async () => {
    const d = fresh();
    let reads = 0;
    // The executor's own client, counted: every fleet read is one ZRANGEBYSCORE on it.
    const counted = {
      duplicate() {
        const client = d.redis.duplicate() as Redis;
        const zrangebyscore = client.zrangebyscore.bind(client);
        client.zrangebyscore = ((...args: Parameters<typeof zrangebyscore>) => {
          reads++;
          return zrangebyscore(...args);
        }) as typeof client.zrangebyscore;
        return client;
      },
    };
    const registry = createExecutor({ runnables });
    const queue = createQueueExecutor({
      executor: registry,
      redis: counted,
      secretKey: SECRET_KEY,
      prefix: d.prefix,
    });
    try {
      await queue.ready();
      await d.worker({ workspaces: [A], concurrency: 4 });
      const started = performance.now();
      const misses = 40;
      for (let i = 0; i < misses; i++) {
        const job = registry.createJob({
          workspace: A,
          path: 'echo',
          runAs: PUBLISHER,
          origin: app(ALICE),
          args: { i },
        });
        await queue.run(job);
      }
      const seconds = (performance.now() - started) / 1000;
      // ready() read once; then at most one read per second of misses, plus the first one
      // that found the worker (and one in flight at the end).
      expect(reads).toBeLessThanOrEqual(3 + Math.ceil(seconds));
      expect(reads).toBeLessThan(misses);
    } finally {
      await queue.close();
    }
  });

  it('a heartbeat names its queue: a worker of A is counted for A alone', async () => {
    const d = fresh();
    const server = await d.server();
    const worker = await d.worker({ workspaces: [A, B] });
    const members = await d.redis.zrange(fleetKey(d.prefix, 'jobs'), 0, -1);
    expect(members.sort()).toEqual(
      [fleetMember(A, 'default', worker.id), fleetMember(B, 'default', worker.id)].sort(),
    );
    expect(await server.queue.fleet()).toEqual({ [`${A}/default`]: 1, [`${B}/default`]: 1 });
  });
});
