import { randomBytes } from 'node:crypto';
import type { Job as BullJob } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import type { RunnableDefinition } from '../../../src/index.js';
import { replyChannel } from '../../../src/queue/direct_replies.js';
import type { QueueMessage } from '../../../src/queue/queue_names.js';
import { routedQueueName } from '../../../src/queue/queue_names.js';
import { QueueKeys } from '../../../src/queue/queue_seal.js';
import { openJobRecord } from '../../../src/queue/sealed_job.js';
import { deferred } from '../../helpers/deferred.js';
import { captureLogger } from '../../helpers/log_capture.js';
import { app, type OrdersDb, ordersDb, runFor, SECRET_KEY, WS } from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';
import { waitUntil } from '../../helpers/wait.js';

// Direct replies (direct_replies.ts), on a real Redis and Postgres: a worker answers the server
// that added its job on that server's own channel, ahead of BullMQ's `completed` event; the
// event still answers whenever a reply is lost, and a reply that is not the run's is dropped.

const ALICE = 'alice@example.com';
const QUEUE = routedQueueName('jobs', WS, 'default');
const keys = new QueueKeys(SECRET_KEY);

const runnables: Record<string, RunnableDefinition> = {
  mine: { cacheTtlS: 300, fn: async (args, ctx) => ({ viewer: ctx.viewer ?? null, n: args['n'] }) },
};

let fx: OrdersDb;
let datatables: Datatables;

beforeAll(async () => {
  fx = await ordersDb();
  datatables = await fx.open({ migrate: false });
  await new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables).migrate();
});

afterAll(async () => {
  await fx?.close();
});

/** What a job's record says, opened with the deployment's secret as its worker opens it. */
function opened(d: QueueDeployment, job: BullJob) {
  const message = job.data as QueueMessage;
  const record = openJobRecord(keys, { prefix: d.prefix, name: QUEUE }, message);
  if (record === null) throw new Error('the record did not open');
  return { message, record };
}

/** The genuine answer to a job: what `mine` returns for its viewer, sealed to its queue id. */
function genuine(d: QueueDeployment, job: BullJob): string {
  const { message, record } = opened(d, job);
  const value = { viewer: record.job.perms.endUserEmail, n: record.job.args['n'] };
  return keys.sealResult(message.queueId, Buffer.from(JSON.stringify(value)));
}

/** Publishes `answer` as the reply to `job`, on the channel its record names. */
async function reply(d: QueueDeployment, job: BullJob, answer: string, once?: string) {
  const { record } = opened(d, job);
  expect(record.replyTo).toMatch(/^[A-Za-z0-9_-]{16,64}$/);
  const channel = replyChannel(d.prefix, 'jobs', record.replyTo!);
  await d.redis.publish(channel, `${once ?? record.once} ${answer}`);
}

const run = (through: Awaited<ReturnType<QueueDeployment['server']>>, n = randomBytes(4)) =>
  runFor(through.registry, 'mine', app(ALICE), {
    through: through.cached,
    args: { n: n.toString('hex') },
  });

describe('a direct reply', () => {
  it("is sent by the worker on its server's channel: the event's own sealed answer", async () => {
    const deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    const listener = new Redis(inject('redisUrl'));
    listener.on('error', () => {});
    try {
      const server = await deploy.server();
      await deploy.worker();
      const heard = deferred<[string, string]>();
      listener.on('pmessage', (_pattern, channel, message) => heard.resolve([channel, message]));
      await listener.psubscribe(`${deploy.prefix}:jobs:reply:*`);
      const mark = await deploy.eventsEnd(QUEUE);
      const n = randomBytes(4);
      const result = await run(server, n);
      expect(result.value).toEqual({ viewer: ALICE, n: n.toString('hex') });
      const [channel, message] = await heard.promise;
      expect(channel).toMatch(/:jobs:reply:[A-Za-z0-9_-]{22}$/);
      const [once, answer] = [
        message.slice(0, message.indexOf(' ')),
        message.slice(message.indexOf(' ') + 1),
      ];
      expect(once).toMatch(/^[A-Za-z0-9_.-]{8,80}$/);
      // The very answer the event carried (sealed: no viewer, no rows in clear); the event may
      // come after the reply.
      const [latest] = await deploy.completedSince(QUEUE, mark);
      expect(latest).toBe(answer);
      expect(message).not.toContain(ALICE);
    } finally {
      listener.disconnect();
      await deploy.close();
    }
  });

  it('answers the run ahead of the event: a worker whose event answer is garbage still answers right', async () => {
    // A hand-made worker on a deployment of its own: it replies with the genuine answer, then
    // completes the job with what would fail the run (E_QUEUE_RESULT_INVALID) were it read.
    const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    try {
      await lone.rogue(WS, async (job) => {
        await reply(lone, job, genuine(lone, job));
        return 'not an answer';
      });
      const server = await lone.server({ wait: 10_000 });
      for (let i = 0; i < 3; i++) {
        const n = randomBytes(4);
        const result = await run(server, n);
        expect(result.value).toEqual({ viewer: ALICE, n: n.toString('hex') });
      }
    } finally {
      await lone.close();
    }
  });

  it("that is not the run's is dropped, and the event answers", async () => {
    const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    try {
      await lone.rogue(WS, async (job) => {
        const another = keys.sealResult(keys.queueId('another flight'), Buffer.from('{"n":"x"}'));
        // Garbage; another run's answer, genuinely sealed; references to another message's kept
        // answer and to this one's (no reply is a reference: anyone may publish one); and the
        // right answer to another once-id: none of them is taken.
        const own = `@${opened(lone, job).record.once}`;
        for (const forged of ['garbage', another, '@someone.else.1', own, ''])
          await reply(lone, job, forged);
        await reply(lone, job, genuine(lone, job), 'someone.else.2');
        return genuine(lone, job);
      });
      const server = await lone.server({ wait: 10_000 });
      const n = randomBytes(4);
      const result = await run(server, n);
      expect(result.value).toEqual({ viewer: ALICE, n: n.toString('hex') });
    } finally {
      await lone.close();
    }
  });

  it('refused a subscription (a Redis user without pub/sub): the server says so at warn, and the events answer', async () => {
    const deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    const user = `vc-no-pubsub-${randomBytes(4).toString('hex')}`;
    const password = randomBytes(12).toString('hex');
    // Every key and command, no channel: SUBSCRIBE is refused (NOPERM).
    await deploy.redis.acl('SETUSER', user, 'on', `>${password}`, '~*', '+@all', 'resetchannels');
    const limited = new Redis(inject('redisUrl'), {
      maxRetriesPerRequest: null,
      username: user,
      password,
    });
    limited.on('error', () => {});
    const { logger, lines } = captureLogger();
    let server: Awaited<ReturnType<QueueDeployment['server']>> | undefined;
    try {
      await deploy.worker();
      server = await deploy.server({ redis: limited, logger, noWorkersWait: 10_000 });
      const warned = lines().filter((l) => l['level'] === 40);
      expect(warned).toHaveLength(1);
      expect(String(warned[0]!['msg'])).toMatch(/events alone/);
      const n = randomBytes(4);
      expect((await run(server, n)).value).toEqual({ viewer: ALICE, n: n.toString('hex') });
    } finally {
      // Closed while its user exists: deleting the user drops its connections.
      await server?.queue.close();
      limited.disconnect();
      await deploy.redis.acl('DELUSER', user);
      await deploy.close();
    }
  });

  it('lost with its connection: runs are answered by the event, and by replies again once it is back', async () => {
    const lone = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables);
    // The server's connections carry a name of their own, so its subscriber can be found.
    const name = `vc-replies-${randomBytes(4).toString('hex')}`;
    const named = new Redis(inject('redisUrl'), {
      maxRetriesPerRequest: null,
      connectionName: name,
    });
    named.on('error', () => {});
    let directOnly = false;
    try {
      await lone.rogue(WS, async (job) => {
        const answer = genuine(lone, job);
        if (!directOnly) return answer;
        await reply(lone, job, answer);
        return 'not an answer';
      });
      const server = await lone.server({ redis: named, noWorkersWait: 10_000 });
      const subscriber = async () => {
        const list = (await lone.redis.client('LIST')) as string;
        return list
          .split('\n')
          .filter((line) => line.includes(` name=${name} `) && / flags=\S*P/.test(line))
          .map((line) => /^id=(\d+)/.exec(line)![1]!);
      };
      const [id] = await subscriber();
      expect(id).toBeDefined();
      await lone.redis.client('KILL', 'ID', id!);
      // Whatever the record says meanwhile, the event answers.
      const n = randomBytes(4);
      expect((await run(server, n)).value).toEqual({ viewer: ALICE, n: n.toString('hex') });
      // ioredis subscribes again by itself; then a run answered by its reply alone passes.
      await waitUntil('the subscriber is back', async () => (await subscriber()).length === 1);
      const channels = (await lone.redis.pubsub(
        'CHANNELS',
        `${lone.prefix}:jobs:reply:*`,
      )) as string[];
      expect(channels).toHaveLength(1);
      directOnly = true;
      const m = randomBytes(4);
      expect((await run(server, m)).value).toEqual({ viewer: ALICE, n: m.toString('hex') });
    } finally {
      await lone.close();
    }
  });
});
