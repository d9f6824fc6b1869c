import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import type { RunnableDefinition } from '../../../src/index.js';
import { ANSWER_TTL_MS, answerKey, INLINE_ANSWER_MAX } from '../../../src/queue/answer_refs.js';
import { routedQueueName } from '../../../src/queue/queue_names.js';
import { QueueKeys } from '../../../src/queue/queue_seal.js';
import { OnceIds, sealJob } from '../../../src/queue/sealed_job.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  runFor,
  SECRET_KEY,
  WS,
} from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';
import { waitUntil } from '../../helpers/wait.js';

// A worker's large answer travels by reference (answer_refs.ts), on a real Redis and Postgres:
// kept under a key of its own for a while, the event stream carrying only its reference; small
// answers, and answers to servers of earlier versions, inline as before.

const ALICE = 'alice@example.com';
const QUEUE = routedQueueName('jobs', WS, 'default');
const keys = new QueueKeys(SECRET_KEY);

/** Rows of about `kib` KiB of JSON, each marked with the viewer they were made for. */
const rows = (viewer: string | null, kib: number) =>
  Array.from({ length: Math.round((kib * 1024) / 40) }, (_, i) => ({
    i,
    viewer,
    pad: 'x'.repeat(16),
  }));

const runnables: Record<string, RunnableDefinition> = {
  sized: {
    cacheTtlS: 300,
    fn: async (args, ctx) => rows(ctx.viewer ?? null, Number(args['kib'])),
  },
};

let fx: OrdersDb;
let datatables: Datatables;
let deploy: QueueDeployment;

beforeAll(async () => {
  fx = await ordersDb();
  datatables = await fx.open({ migrate: false });
  deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
  await deploy.migrate();
});

afterAll(async () => {
  await deploy?.close();
  await fx?.close();
});

const answerKeys = (d: QueueDeployment) => d.redis.keys(`${d.prefix}:${QUEUE}:answer:*`);

describe("a worker's answer", () => {
  it('larger than the inline bound is kept under a key of its own, for a while; the event carries its reference', async () => {
    const server = await deploy.server();
    await deploy.worker();
    const kib = 48;
    const mark = await deploy.eventsEnd(QUEUE);
    const result = await runFor(server.registry, 'sized', app(ALICE), {
      through: server.cached,
      args: { kib, n: randomBytes(4).toString('hex') },
    });
    expect(result.fromCache).toBe(false);
    expect(result.value).toEqual(rows(ALICE, kib));
    expect(Buffer.from(result.json()).toString()).toBe(JSON.stringify(rows(ALICE, kib)));
    // The worker replies ahead of the event: wait for the event itself.
    const [latest] = await deploy.completedSince(QUEUE, mark);
    expect(latest).toMatch(/^@[A-Za-z0-9_.-]{8,80}$/);
    const kept = answerKey({ prefix: deploy.prefix, name: QUEUE }, latest!.slice(1));
    const ttl = await deploy.redis.pttl(kept);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(ANSWER_TTL_MS);
    const text = await deploy.redis.get(kept);
    expect(text!.length).toBeGreaterThan(INLINE_ANSWER_MAX);
    // Sealed, as an inline answer is: base64 of the cipher text, no JSON (no viewer, no rows).
    expect(text).toMatch(/^[A-Za-z0-9+/]+=*$/);
  });

  it('within the bound travels inline, and keeps no key', async () => {
    const server = await deploy.server();
    await deploy.worker();
    const before = (await answerKeys(deploy)).length;
    const mark = await deploy.eventsEnd(QUEUE);
    const result = await runFor(server.registry, 'sized', app(ALICE), {
      through: server.cached,
      args: { kib: 1, n: randomBytes(4).toString('hex') },
    });
    expect(result.value).toEqual(rows(ALICE, 1));
    const [latest] = await deploy.completedSince(QUEUE, mark);
    expect(latest!.startsWith('@')).toBe(false);
    expect(latest).toMatch(/^[A-Za-z0-9+/]+=*$/);
    expect((await answerKeys(deploy)).length).toBe(before);
  });

  it('to a server of an earlier version (its record says nothing of references) travels inline, however large', async () => {
    await deploy.worker();
    const registry = (await deploy.server()).registry;
    const job = registry.createJob({
      workspace: WS,
      path: 'sized',
      runAs: PUBLISHER,
      origin: app(ALICE),
      args: { kib: 48, n: randomBytes(4).toString('hex') },
    });
    const queueId = keys.queueId(`job:${WS}:${job.id}`);
    const once = new OnceIds().next();
    const place = { prefix: deploy.prefix, name: QUEUE };
    const before = (await answerKeys(deploy)).length;
    const queue = new Queue(QUEUE, { connection: deploy.redis, prefix: deploy.prefix });
    try {
      for (const byRef of [false, true]) {
        const runOnce = byRef ? new OnceIds().next() : once;
        const message = sealJob(
          keys,
          place,
          job,
          'app',
          queueId,
          Date.now() + 30_000,
          null,
          null,
          null,
          runOnce,
          byRef,
        );
        const outcomes = deploy.outcomes.length;
        const mark = await deploy.eventsEnd(QUEUE);
        await queue.add('run', message, {
          jobId: queueId,
          removeOnComplete: true,
          removeOnFail: true,
          deduplication: { id: runOnce, ttl: 60_000 },
        });
        await waitUntil('the worker answered', () => deploy.outcomes.length > outcomes);
        await waitUntil('the job is gone', async () => (await queue.getJob(queueId)) === undefined);
        expect(deploy.outcomes[outcomes]!.code).toBe('ok');
        const [latest] = await deploy.completedSince(QUEUE, mark);
        if (byRef) {
          // The same job from a server of this version: by reference.
          expect(latest).toBe(`@${runOnce}`);
          expect((await answerKeys(deploy)).length).toBe(before + 1);
        } else {
          expect(latest!.length).toBeGreaterThan(INLINE_ANSWER_MAX);
          const opened = keys.openResult(queueId, latest);
          expect(JSON.parse(opened!.toString())).toEqual(rows(ALICE, 48));
          expect((await answerKeys(deploy)).length).toBe(before);
        }
      }
    } finally {
      await queue.close();
    }
  });

  it("a reference to no kept answer, to another run's, or to no once-id answers nothing", async () => {
    // A rogue worker (anyone who can write to Redis) answers with references, on a deployment
    // of its own where no honest worker competes for the job.
    const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    const place = { prefix: lone.prefix, name: QUEUE };
    // Another run's answer, genuinely sealed (to its own queue id) and kept under a reference.
    const other = 'elsewhere.run.1';
    await lone.redis.set(
      answerKey(place, other),
      keys.sealResult(keys.queueId('another flight'), Buffer.from(JSON.stringify(rows(ALICE, 48)))),
      'PX',
      60_000,
    );
    let answer = '';
    try {
      await lone.rogue(WS, () => answer);
      const server = await lone.server({ wait: 5000 });
      const attempt = (a: string) => {
        answer = a;
        return runFor(server.registry, 'sized', app(ALICE), {
          through: server.cached,
          args: { kib: 1, n: randomBytes(4).toString('hex') },
        });
      };
      await expect(attempt('@never.kept.1')).rejects.toMatchObject({ code: 'E_QUEUE_TIMEOUT' });
      await expect(attempt(`@${other}`)).rejects.toMatchObject({ code: 'E_QUEUE_RESULT_INVALID' });
      await expect(attempt('@no')).rejects.toMatchObject({ code: 'E_QUEUE_RESULT_INVALID' });
      await expect(attempt('@../../etc')).rejects.toMatchObject({ code: 'E_QUEUE_RESULT_INVALID' });
    } finally {
      await lone.close();
    }
  });
});
