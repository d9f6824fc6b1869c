import { createCipheriv, createHash, hkdfSync, randomBytes } from 'node:crypto';
import { type JobsOptions, Queue } from 'bullmq';
import { Redis, type RedisOptions } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import {
  createExecutor,
  createQueueWorker,
  type Job,
  type JobResult,
  RedisCacheStore,
  type RunnableDefinition,
  SharedJobTokens,
  withResultCache,
} from '../../../src/index.js';
import { claimJob, claimKey } from '../../../src/queue/job_claims.js';
import {
  fleetKey,
  fleetMember,
  type QueueMessage,
  routedQueueName,
} from '../../../src/queue/queue_names.js';
import { QueueKeys } from '../../../src/queue/queue_seal.js';
import { OnceIds, openJobRecord, sealJob } from '../../../src/queue/sealed_job.js';
import { deferred } from '../../helpers/deferred.js';
import {
  app,
  type OrdersDb,
  ordersDb,
  PUBLISHER,
  ROWS,
  runFor,
  SECRET_KEY,
  WS,
} from '../../helpers/orders_db.js';
import { QueueDeployment, type QueueSide } from '../../helpers/queue_fixture.js';
import { setsDuring } from '../../helpers/redis.js';
import { waitUntil } from '../../helpers/wait.js';

// Jobs on workers (SPEC invariant 19), on a real Redis and Postgres: the server records the
// viewer and seals the job record into the message; the worker reads the viewer from the sealed
// record alone.

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const MARKER_ARG = 'needle-arg-7f3c';

let fx: OrdersDb;
let datatables: Datatables;
let deploy: QueueDeployment;
let executions = 0;
let gate = deferred<void>();
gate.resolve();

const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id'] as number);
const runnables: Record<string, RunnableDefinition> = {
  report: {
    cacheTtlS: 300,
    fn: async (_args, ctx) => {
      executions++;
      const client = await ctx.datatable('main', { as: 'viewer' });
      await gate.promise;
      return ids((await client.query('select id from orders order by id')).rows);
    },
  },
  uncached: {
    fn: async (_args, ctx) => {
      const client = await ctx.datatable('main', { as: 'viewer' });
      return ids((await client.query('select id from orders order by id')).rows);
    },
  },
  token: {
    cacheTtlS: 0,
    // Checks its own token from "another server" (a verifier of its own) while it runs.
    fn: async (_args, ctx) => ({
      token: ctx.jobToken,
      live: (
        await new SharedJobTokens({
          redis: deploy.redis,
          prefix: deploy.prefix,
          secretKey: SECRET_KEY,
        }).verify(String(ctx.jobToken))
      )?.perms.endUserEmail,
    }),
  },
  quiet: {
    cacheTtlS: 0,
    // Never reads ctx.jobToken: looks, while it runs, for any job token written to Redis.
    fn: async () => ({
      tokensInRedis: (await deploy.redis.keys(`${deploy.prefix}:jobtoken:*`)).length,
    }),
  },
};

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

describe('a miss runs on a worker, as the viewer the server recorded', () => {
  it('each viewer gets their own rows; a hit is answered without enqueueing', async () => {
    const server = await deploy.server();
    await deploy.worker();
    const before = deploy.outcomes.length;
    const a = await runFor(server.registry, 'report', app(ALICE), {
      through: server.cached,
      args: { v: 1 },
    });
    const b = await runFor(server.registry, 'report', app(BOB), {
      through: server.cached,
      args: { v: 1 },
    });
    expect(a.value).toEqual(ROWS['emea']);
    expect(b.value).toEqual(ROWS['amer']);
    expect(deploy.outcomes.length - before).toBe(2);
    // The worker wrote the sealed entry: the server's next run is a hit, and no job is queued.
    const again = await runFor(server.registry, 'report', app(ALICE), {
      through: server.cached,
      args: { v: 1 },
    });
    expect(again.fromCache).toBe(true);
    expect(again.value).toEqual(ROWS['emea']);
    expect(deploy.outcomes.length - before).toBe(2);
    // Nothing was written to Postgres for them: the record travels sealed in the message.
    const { rows } = await deploy.pool.query(
      'select (select count(*) from viewer_cache_queue.job)::int as n, (select count(*) from viewer_cache_queue.job_token)::int as t',
    );
    expect(rows[0]).toEqual({ n: 0, t: 0 });
  });

  it('a run with no viewer asking for the viewer is refused with its code, never cached', async () => {
    const server = await deploy.server();
    await expect(
      runFor(server.registry, 'uncached', { kind: 'schedule' }, { through: server.cached }),
    ).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
  });

  it('a job token is valid on any server while its job runs, and refused once it ended', async () => {
    const server = await deploy.server();
    const result = await runFor(server.registry, 'token', app(ALICE), { through: server.cached });
    const { token, live } = result.value as { token: string; live: string };
    expect(token).toMatch(/^vcjob_/);
    expect(live).toBe(ALICE);
    const tokens = new SharedJobTokens({
      redis: deploy.redis,
      prefix: deploy.prefix,
      secretKey: SECRET_KEY,
    });
    expect(await tokens.verify(token)).toBeNull();
  });

  it('a runnable that never reads its job token costs no token command', async () => {
    const server = await deploy.server();
    await deploy.worker();
    // Other tests' ended tokens are marked there already: none is added while this one runs.
    const before = (await deploy.redis.keys(`${deploy.prefix}:jobtoken:*`)).length;
    const result = await runFor(server.registry, 'quiet', app(ALICE), { through: server.cached });
    expect(result.value).toEqual({ tokensInRedis: before });
  });

  it('a Redis writer cannot mint a job token, nor another deployment make one', async () => {
    const tokens = new SharedJobTokens({
      redis: deploy.redis,
      prefix: deploy.prefix,
      secretKey: SECRET_KEY,
    });
    // The previous scheme's grant, sealed under a key derived from the token alone: anyone
    // who could write the key could choose a token and a viewer.
    const minted = `vcjob_${randomBytes(32).toString('base64url')}`;
    const digest = createHash('sha256').update(`job token v1:${minted}`).digest('base64url');
    const key = `${deploy.prefix}:jobtoken:${digest}`;
    const grant = JSON.stringify([
      'j1',
      WS,
      JSON.stringify({ email: PUBLISHER, endUserEmail: BOB }),
    ]);
    const iv = randomBytes(12);
    const cipher = createCipheriv(
      'aes-256-gcm',
      Buffer.from(hkdfSync('sha256', minted, 'viewer-cache job token', 'grant v1', 32)),
      iv,
    );
    cipher.setAAD(Buffer.from(key));
    const body = Buffer.concat([cipher.update(grant, 'utf8'), cipher.final()]);
    const stored = Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64');
    await deploy.redis.set(key, stored, 'PX', 60_000);
    expect(await tokens.verify(minted)).toBeNull();
    // A token another deployment's secret made, and one edited, do not verify here.
    const job = (await deploy.server()).registry.createJob({
      workspace: WS,
      path: 'uncached',
      runAs: PUBLISHER,
      origin: app(BOB),
    });
    const foreign = new SharedJobTokens({
      redis: deploy.redis,
      prefix: deploy.prefix,
      secretKey: 'another-deployment-secret-000000000',
    }).issue(job);
    expect(await tokens.verify(foreign)).toBeNull();
    const own = tokens.issue(job);
    expect((await tokens.verify(own))?.perms.endUserEmail).toBe(BOB);
    const edited = `${own.slice(0, 20)}${own[20] === 'A' ? 'B' : 'A'}${own.slice(21)}`;
    expect(await tokens.verify(edited)).toBeNull();
    // Ended: refused by every verifier from then on.
    await tokens.revoke(job);
    expect(await tokens.verify(own)).toBeNull();
  });
});

describe("an earlier run's answer is not this run's", () => {
  it("a failure of the same queue id stamped just before a new server's first add is not its answer", async () => {
    await deploy.worker();
    const server = await deploy.server();
    const job = server.registry.createJob({
      workspace: WS,
      path: 'uncached',
      runAs: PUBLISHER,
      origin: app(ALICE),
    });
    // What a worker wrote when the same queue id failed a moment ago (a key that failed, then
    // missed again): the server's listener replays its stream from a little before its first
    // add, so it reads this event; the waiter of the new run must not take it.
    const queueId = new QueueKeys(SECRET_KEY).queueId(`job:${WS}:${job.id}`);
    await deploy.redis.xadd(
      `${deploy.prefix}:${routedQueueName('jobs', WS, 'default')}:events`,
      '*',
      'event',
      'failed',
      'jobId',
      queueId,
      'failedReason',
      'E_QUEUE_JOB_REFUSED',
      'prev',
      'active',
    );
    const result = await server.queue.run(job);
    expect(result.value).toEqual(ROWS['emea']);
  });
});

describe("a stale job's refusal is not this run's answer", () => {
  it('a miss that joins a job past its deadline (its server gave up) adds again once that job is refused, and runs', async () => {
    const own = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    try {
      // Alive, but nobody takes anything yet: the first server enqueues and gives up.
      await own.redis.zadd(
        fleetKey(own.prefix, 'jobs'),
        Date.now(),
        fleetMember(WS, 'default', 'idle'),
      );
      const impatient = await own.server({ wait: 300 });
      const job = impatient.registry.createJob({
        workspace: WS,
        path: 'uncached',
        runAs: PUBLISHER,
        origin: app(ALICE),
      });
      await expect(impatient.queue.run(job)).rejects.toMatchObject({ code: 'E_QUEUE_TIMEOUT' });
      // The same queue id from a patient server: its add joins the stale job still waiting.
      const patient = await own.server({ wait: 30_000 });
      const answer = patient.queue.run(job);
      answer.catch(() => {});
      // A worker comes: it refuses the stale job (past its deadline), then runs this one.
      await own.worker();
      const result = await answer;
      expect(result.value).toEqual(ROWS['emea']);
      expect(own.outcomes.map((o) => o.code)).toEqual(['E_QUEUE_JOB_REFUSED', 'ok']);
    } finally {
      await own.close();
    }
  });
});

describe('a queued miss pays Postgres nothing for the queue', () => {
  it('runs, job token included, with the queue schema gone from the database', async () => {
    const server = await deploy.server();
    await deploy.worker();
    // The record travels sealed in the message, the claim and the token live in Redis: with
    // the tables that used to hold them gone, a miss still runs as the recorded viewer.
    await deploy.pool.query('drop schema viewer_cache_queue cascade');
    try {
      const result = await runFor(server.registry, 'token', app(BOB), {
        through: server.cached,
        args: { schemaGone: true },
      });
      expect((result.value as { live: string }).live).toBe(BOB);
    } finally {
      await deploy.migrate();
    }
  });
});

describe('the deadline a message carries', () => {
  it('is whole milliseconds whatever the wait: a fractional wait still runs', async () => {
    const server = await deploy.server({ wait: 30_000.5 });
    await deploy.worker();
    const result = await runFor(server.registry, 'uncached', app(ALICE), {
      through: server.cached,
    });
    expect(result.value).toEqual(ROWS['emea']);
  });
});

describe('a scoped credential on the queue', () => {
  it("a run scoped to one of carol's roles sees only that role's rows, on a worker", async () => {
    const server = await deploy.server();
    await deploy.worker();
    const oid = new Map((await fx.datatables.admin.listRoles(WS)).map((r) => [r.name, r.oid]));
    const job = server.registry.createJob({
      workspace: WS,
      path: 'uncached',
      runAs: PUBLISHER,
      origin: app('carol@example.com'),
      roleScope: [oid.get(fx.EMEA)!],
    });
    const result = await server.cached.run(job);
    expect(result.value).toEqual(ROWS['emea']);
  });
});

describe('single flight across servers, scoped to the full key', () => {
  it("two servers' identical misses are one job; two viewers' identical misses are two", async () => {
    const one = await deploy.server();
    const two = await deploy.server();
    await deploy.worker({ concurrency: 4 });
    executions = 0;
    gate = deferred<void>();
    const args = { coalesce: Date.now() };
    const runs = [
      runFor(one.registry, 'report', app(ALICE), { through: one.cached, args }),
      runFor(two.registry, 'report', app(ALICE), { through: two.cached, args }),
      runFor(two.registry, 'report', app(BOB), { through: two.cached, args }),
    ];
    try {
      await waitUntil('both viewers run', () => executions >= 2);
    } finally {
      gate.resolve();
    }
    const [a1, a2, b] = (await Promise.all(runs)) as [JobResult, JobResult, JobResult];
    expect(a1.value).toEqual(ROWS['emea']);
    expect(a2.value).toEqual(ROWS['emea']);
    expect(b.value).toEqual(ROWS['amer']);
    expect(executions).toBe(2);
  });
});

describe("a worker's slots", () => {
  it('all of them run at once, taken by ⌈concurrency / 8⌉ BullMQ workers (at most 4)', async () => {
    // A group of its own: the workers earlier tests started take none of these jobs.
    const server = await deploy.server({ group: 'slots' });
    const worker = await deploy.worker({ concurrency: 20, group: 'slots' });
    // BullMQ never closes a connection it is handed: this one is disconnected below.
    const connection = deploy.redis.duplicate();
    connection.on('error', () => {});
    const queue = new Queue(routedQueueName('jobs', WS, 'slots'), {
      connection,
      prefix: deploy.prefix,
    });
    executions = 0;
    gate = deferred<void>();
    const tag = Date.now();
    const runs = Array.from({ length: 20 }, (_, slot) =>
      runFor(server.registry, 'report', app(ALICE), {
        through: server.cached,
        args: { slot, tag },
      }),
    );
    try {
      // Twenty distinct misses held at the gate: every slot of the twenty is taken.
      await waitUntil('twenty jobs run at once', () => executions >= 20);
      expect(worker.running).toBe(20);
      // Split 7 + 7 + 6 between three BullMQ workers, each reading the queue.
      expect(await queue.getWorkersCount()).toBe(3);
    } finally {
      gate.resolve();
      // Settled before the next test, pass or fail: its outcomes are not theirs.
      await Promise.allSettled(runs);
      await queue.close();
      connection.disconnect();
    }
    for (const result of await Promise.all(runs)) expect(result.value).toEqual(ROWS['emea']);
  });
});

describe("a worker's answer does not wait for its entry's write", () => {
  it('the server is answered while Redis has not acknowledged the write; the entry then serves', async () => {
    const server = await deploy.server({ group: 'behind' });
    // The worker's store holds each write's acknowledgement until released: Redis has the
    // entry (the SET went out), the worker has not heard back.
    const acks: (() => void)[] = [];
    await deploy.worker({
      group: 'behind',
      wrapStore: (store) => ({
        get: (key, tag) => store.get(key, tag),
        set: async (key, value, ttlMs, tag) => {
          await store.set(key, value, ttlMs, tag);
          await new Promise<void>((resolve) => acks.push(resolve));
        },
        delete: (key) => store.delete(key),
      }),
    });
    const before = deploy.outcomes.length;
    const args = { behind: Date.now() };
    try {
      const first = await runFor(server.registry, 'report', app(BOB), {
        through: server.cached,
        args,
      });
      expect(first.value).toEqual(ROWS['amer']);
      // Answered while the worker's write is still held: Redis acknowledges the SET on the
      // store's connection, which may reach the worker after the answer reached the server.
      await waitUntil('Redis acknowledged the entry', () => acks.length === 1);
      const again = await runFor(server.registry, 'report', app(BOB), {
        through: server.cached,
        args,
      });
      expect(again.fromCache).toBe(true);
      expect(deploy.outcomes.length - before).toBe(1);
    } finally {
      for (const ack of acks) ack();
    }
  });
});

describe("a worker's entry write goes with its answer when the store is on the worker's Redis", () => {
  /**
   * A worker whose store has a connection of its own named `vc-test-store` (`storeOptions` for
   * it), and the SET commands the server ran while `act` ran, with the connection of each.
   */
  async function watchedWorker(group: string, storeOptions: RedisOptions) {
    const storeClient = new Redis(deploy.redisUrl, {
      connectionName: 'vc-test-store',
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      ...storeOptions,
    });
    storeClient.on('error', () => {});
    const store = new RedisCacheStore({ redis: storeClient, prefix: deploy.cachePrefix });
    const executor = createExecutor({ runnables, datatables: deploy.datatables });
    const worker = createQueueWorker({
      executor: withResultCache(executor, {
        store,
        fingerprint: deploy.datatables.fingerprint,
        seal: { secretKey: SECRET_KEY },
      }),
      redis: deploy.redis,
      secretKey: SECRET_KEY,
      prefix: deploy.prefix,
      workspaces: ['demo'],
      group,
    });
    await worker.ready();
    const sets = (act: () => Promise<unknown>) => setsDuring(deploy.redis as Redis, act);
    return {
      sets,
      close: async () => {
        await worker.close();
        await store.close();
        storeClient.disconnect();
      },
    };
  }

  it('same Redis: the entry leaves on the connection that finishes the job, before the finish', async () => {
    const server = await deploy.server({ group: 'affinity' });
    const watched = await watchedWorker('affinity', {});
    try {
      const seen = await watched.sets(() =>
        runFor(server.registry, 'report', app(ALICE), {
          through: server.cached,
          args: { affinity: Date.now() },
        }),
      );
      const entry = seen.find((s) => s.key.startsWith(deploy.cachePrefix));
      // A job of this version's server takes no claim; its finish marks one (job_claims.ts).
      const finish = seen.find((s) => s.key.includes(':claim:'));
      expect(entry).toBeDefined();
      expect(finish).toBeDefined();
      expect(finish!.args).not.toContain('NX');
      expect(entry!.source).toBe(finish!.source);
      expect(entry!.name).not.toBe('vc-test-store');
      // One connection's commands run in order: the entry is in Redis before the answer.
      expect(seen.indexOf(entry!)).toBeLessThan(seen.indexOf(finish!));
    } finally {
      await watched.close();
    }
  });

  it('another database: the entry stays on the store connection', async () => {
    const server = await deploy.server({ group: 'affinity-db' });
    const watched = await watchedWorker('affinity-db', { db: 1 });
    try {
      const seen = await watched.sets(() =>
        runFor(server.registry, 'report', app(BOB), {
          through: server.cached,
          args: { affinity: Date.now() },
        }),
      );
      const entry = seen.find((s) => s.key.startsWith(deploy.cachePrefix));
      expect(entry).toBeDefined();
      expect(entry!.name).toBe('vc-test-store');
    } finally {
      await watched.close();
      // The worker wrote its entry in database 1, where the fixture does not look.
      const db1 = new Redis(deploy.redisUrl, { db: 1 });
      db1.on('error', () => {});
      const keys = await db1.keys(`${deploy.cachePrefix}*`);
      if (keys.length > 0) await db1.del(...keys);
      db1.disconnect();
    }
  });
});

describe('forged queue messages are refused', () => {
  const keys = new QueueKeys(SECRET_KEY);
  /** The queue of the orders workspace's jobs (the default group). */
  const QUEUE = routedQueueName('jobs', WS, 'default');

  /** A job as the server records it (alice's, say): what a genuine message seals. */
  async function jobFor(
    viewer: string,
    workspace = WS,
    path = 'uncached',
    args: Record<string, unknown> = {},
  ): Promise<Job> {
    const registry = (await deploy.server()).registry;
    return registry.createJob({
      workspace,
      path,
      args,
      runAs: PUBLISHER,
      origin: app(viewer),
    });
  }

  function sealed(job: Job, sealKeys = keys, queueId = keys.queueId(`forged:${job.id}`)) {
    const place = { prefix: deploy.prefix, name: QUEUE };
    return sealJob(sealKeys, place, job, 'app', queueId, Date.now() + 60_000);
  }

  async function send(
    data: object,
    jobId = (data as { queueId: string }).queueId,
    extra: Partial<JobsOptions> = {},
  ) {
    const queue = new Queue(QUEUE, { connection: deploy.redis, prefix: deploy.prefix });
    const before = deploy.outcomes.length;
    await queue.add('run', data, { jobId, removeOnComplete: true, removeOnFail: true, ...extra });
    await waitUntil('the worker answered', () => deploy.outcomes.length > before);
    // The worker records its outcome before BullMQ finishes the job: until the job is gone, a
    // next message under the same id would be taken for a duplicate and never run.
    await waitUntil('the job is gone', async () => (await queue.getJob(jobId)) === undefined);
    await queue.close();
    return deploy.outcomes[before]!.code;
  }

  it('a wrong seal, a record of another workspace, another secret, a replay of a finished job', async () => {
    await deploy.worker();
    const job = await jobFor(ALICE);
    const good = sealed(job);
    // A record that is not the server's: bytes flipped.
    const raw = Buffer.from(good.record, 'base64');
    raw[raw.length - 1]! ^= 1;
    expect(await send({ ...good, record: raw.toString('base64') })).toBe('E_QUEUE_JOB_REFUSED');
    // A genuine record moved to another workspace (its clear field edited).
    expect(await send({ ...good, workspace: 'other' })).toBe('E_QUEUE_JOB_REFUSED');
    // Sealed under another deployment's secret.
    const foreign = new QueueKeys('another-deployment-secret-000000000');
    expect(await send(sealed(job, foreign))).toBe('E_QUEUE_JOB_REFUSED');
    // The genuine message runs once (as alice, from the sealed record) ...
    expect(await send(good)).toBe('ok');
    // ... and its replay is refused: the job is finished.
    expect(await send(good)).toBe('E_QUEUE_JOB_REFUSED');
  });

  it('a genuine record copied under another queue id, with a later deadline, or past its own', async () => {
    await deploy.worker();
    const job = await jobFor(ALICE);
    const good = sealed(job);
    // Copied under another BullMQ job id (the clear queue id edited to match, or not).
    const elsewhere = keys.queueId(`elsewhere:${job.id}`);
    expect(await send({ ...good, queueId: elsewhere })).toBe('E_QUEUE_JOB_REFUSED');
    expect(await send(good, elsewhere)).toBe('E_QUEUE_JOB_REFUSED');
    // Its deadline pushed back in clear.
    expect(await send({ ...good, deadline: good.deadline + 3_600_000 })).toBe(
      'E_QUEUE_JOB_REFUSED',
    );
    // A genuine record past its deadline (the server gave up on it).
    const place = { prefix: deploy.prefix, name: QUEUE };
    const late = sealJob(keys, place, job, 'app', keys.queueId(`late:${job.id}`), Date.now() - 1);
    expect(await send(late)).toBe('E_QUEUE_JOB_REFUSED');
    // The message with an extra field (a viewer, say) is not a message.
    expect(await send({ ...good, viewer: BOB })).toBe('E_QUEUE_JOB_REFUSED');
    // None of these took the job's claim: the genuine message still runs, once.
    expect(await send(good)).toBe('ok');
    expect(await send(good)).toBe('E_QUEUE_JOB_REFUSED');
  });

  describe("a message of this version's server: its once-id, not a claim, refuses a replay", () => {
    const onceIds = new OnceIds();
    /** Sealed and added as a server of this version does (queue_executor.ts). */
    function onceMessage(job: Job) {
      const place = { prefix: deploy.prefix, name: QUEUE };
      const queueId = keys.queueId(`once:${job.id}`);
      const deadline = Date.now() + 60_000;
      const once = onceIds.next();
      const message = sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once);
      const added = { deduplication: { id: once, ttl: 120_000 } };
      return { message, once, deadline, added };
    }

    it('runs once; put back under its once-id it is not added, whatever the add asks for', async () => {
      await deploy.worker();
      const job = await jobFor(ALICE);
      const { message, added, deadline } = onceMessage(job);
      const before = deploy.outcomes.length;
      expect(await send(message, message.queueId, added)).toBe('ok');
      const queue = new Queue(QUEUE, { connection: deploy.redis, prefix: deploy.prefix });
      try {
        for (const asked of [{}, { replace: true }, { extend: true }, { keepLastIfActive: true }]) {
          await queue.add('run', message, {
            jobId: message.queueId,
            removeOnComplete: true,
            deduplication: { ...added.deduplication, ...asked },
          });
          expect(await queue.getJob(message.queueId)).toBeUndefined();
        }
      } finally {
        await queue.close();
      }
      // Without its once-id, or under another: added, and refused by the worker.
      expect(await send(message)).toBe('E_QUEUE_JOB_REFUSED');
      const another = { deduplication: { id: onceIds.next(), ttl: 120_000 } };
      expect(await send(message, message.queueId, another)).toBe('E_QUEUE_JOB_REFUSED');
      // Nothing put back ran (a put-back that had been added would be an outcome here).
      expect(deploy.outcomes.slice(before).map((o) => o.code)).toEqual([
        'ok',
        'E_QUEUE_JOB_REFUSED',
        'E_QUEUE_JOB_REFUSED',
      ]);
      // And a worker of an earlier version, which knows only claims, finds the job finished.
      const claim = claimKey(deploy.prefix, QUEUE, job.id);
      expect(await claimJob(deploy.redis as never, claim, deadline)).toBe(false);
    });

    it('added the first time without its once-id, it runs nothing (no claim to fall back on)', async () => {
      await deploy.worker();
      const job = await jobFor(ALICE);
      const { message, added } = onceMessage(job);
      expect(await send(message)).toBe('E_QUEUE_JOB_REFUSED');
      // The genuine add still runs it: the refusal ran nothing and marked nothing.
      expect(await send(message, message.queueId, added)).toBe('ok');
    });
  });

  describe('the key its server named, sealed in the record', () => {
    /** Sealed as a server seals a miss of `job`: with the key its cache named (named_run.ts). */
    function named(job: Job, digest: string, fingerprint: string | null) {
      const place = { prefix: deploy.prefix, name: QUEUE };
      const queueId = keys.queueId(`named:${job.id}`);
      const deadline = Date.now() + 60_000;
      return sealJob(keys, place, job, 'app', queueId, deadline, null, null, {
        digest,
        fingerprint,
      });
    }
    const storedUnder = async (digest: string) =>
      (await deploy.redis.keys(`${deploy.cachePrefix}*${digest}*`)).length;
    /**
     * A job of `report` whose key nothing holds yet, once the deployment has learned what
     * `report` depends on (its first run does: a run that depends on more than its lookup
     * predicted is stored where the next lookup looks, under a key derived for what it learned).
     */
    async function freshReport(server: QueueSide) {
      await runFor(server.registry, 'report', app(BOB), { through: server.cached });
      return jobFor(ALICE, WS, 'report', { named: randomBytes(6).toString('hex') });
    }

    it('is where the worker stores the entry, when the fingerprint it computes is the one named', async () => {
      const server = await deploy.server();
      await deploy.worker();
      const job = await freshReport(server);
      const fingerprint = await datatables.fingerprint(job);
      const digest = randomBytes(32).toString('hex');
      expect(await send(named(job, digest, fingerprint))).toBe('ok');
      await waitUntil('the entry is stored', async () => (await storedUnder(digest)) === 1);
      // The worker took the key from the record: none derived from the job's fields.
      expect((await server.cached.peek(job)).state).toBe('absent');
    });

    it("is the key a server's cache looked up: bound to the job's queue id", async () => {
      // A deployment whose queue no worker takes (its fleet says one does), so the message
      // a server adds waits in the queue to be read.
      const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
      try {
        await lone.redis.zadd(
          fleetKey(lone.prefix, 'jobs'),
          Date.now(),
          fleetMember(WS, 'default', 'nobody'),
        );
        const server = await lone.server({ wait: 1500 });
        const run = runFor(server.registry, 'report', app(ALICE), {
          through: server.cached,
          args: { sealedKey: 1 },
        });
        run.catch(() => {});
        const queue = new Queue(QUEUE, { connection: lone.redis, prefix: lone.prefix });
        let waiting: QueueMessage | undefined;
        let addedUnder: unknown;
        await waitUntil('the message is queued', async () => {
          const queued = (await queue.getWaiting())[0];
          waiting = queued?.data as QueueMessage | undefined;
          addedUnder = queued?.opts.deduplication?.id;
          return waiting !== undefined;
        });
        await queue.close();
        const place = { prefix: lone.prefix, name: QUEUE };
        const opened = openJobRecord(keys, place, waiting!);
        // Added under the once-id its record names: the replay guard (queue_claim.ts).
        expect(opened?.once).toMatch(/^[A-Za-z0-9_.-]{8,80}$/);
        expect(addedUnder).toBe(opened?.once);
        const named = opened?.named;
        expect(named?.digest).toMatch(/^[0-9a-f]{64}$/);
        // The queue id is the keyed hash of the key the server looked up: this digest's.
        expect(keys.queueId(`${WS}/cache/${named!.digest}`)).toBe(waiting!.queueId);
        await expect(run).rejects.toMatchObject({ code: 'E_QUEUE_TIMEOUT' });
      } finally {
        await lone.close();
      }
    });

    it('is not used when the worker computes another fingerprint: the entry goes under the key the job gives', async () => {
      const server = await deploy.server();
      await deploy.worker();
      const job = await freshReport(server);
      const digest = randomBytes(32).toString('hex');
      expect(await send(named(job, digest, 'the roles of another moment'))).toBe('ok');
      await waitUntil(
        'the entry is stored',
        async () => (await server.cached.peek(job)).state === 'present',
      );
      expect(await storedUnder(digest)).toBe(0);
    });
  });

  it("a worker's answer for one viewer never answers another viewer's run", async () => {
    // A rogue worker (anyone who can write to Redis) answers every job with alice's sealed
    // rows, on a deployment of its own where no honest worker competes for the job.
    const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    const aliceSealed = keys.sealResult(keys.queueId('alice-flight'), Buffer.from('[1,3]'));
    try {
      await lone.rogue(WS, () => aliceSealed);
      const server = await lone.server({ wait: 5000 });
      await expect(
        runFor(server.registry, 'uncached', app(BOB), { through: server.cached }),
      ).rejects.toMatchObject({ code: 'E_QUEUE_RESULT_INVALID' });
    } finally {
      await lone.close();
    }
  });
});

describe('nothing the queue keeps in Redis is readable', () => {
  it('no email, args, rows or cache key in clear in any key or value', async () => {
    const server = await deploy.server();
    await deploy.worker();
    gate.resolve();
    const args = { marker: MARKER_ARG };
    const seen: string[] = [];
    const queue = routedQueueName('jobs', WS, 'default');
    const mark = await deploy.eventsEnd(queue);
    server.cached.events.on('cache:miss', () => {});
    for (const viewer of [ALICE, BOB]) {
      const result = await runFor(server.registry, 'report', app(viewer), {
        through: server.cached,
        args,
      });
      seen.push(JSON.stringify(result.value));
    }
    // Everything the two runs leave, their completed events too (a reply may come before them).
    await deploy.completedSince(queue, mark, 2);
    const dump = await deploy.dump();
    expect(dump.size).toBeGreaterThan(0);
    const text = [...dump].map(([k, v]) => `${k}\n${v}`).join('\n');
    for (const needle of [ALICE, BOB, 'alice', MARKER_ARG, PUBLISHER, '[1,3]', '"id"', 'report']) {
      expect(text).not.toContain(needle);
    }
  });
});
