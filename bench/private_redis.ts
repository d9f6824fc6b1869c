import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { Queue, QueueEvents, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { freePort } from '../test/helpers/free_port.js';

/**
 * A `redis-server` of this bench's own (nothing persisted), for counts and traces no other
 * client disturbs; resolves once it answers PING (within 10 s). Kill `child` when done.
 */
export async function privateRedis(): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--save', '', '--appendonly', 'no', '--bind', '127.0.0.1'],
    { stdio: 'ignore' },
  );
  const url = `redis://127.0.0.1:${port}`;
  const deadline = Date.now() + 10_000;
  for (;;) {
    const probe = new Redis(url, { lazyConnect: true, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await probe.connect();
      await probe.ping();
      probe.disconnect();
      return { url, child };
    } catch (err) {
      probe.disconnect();
      if (Date.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

/**
 * A bare BullMQ round trip on `redis` under `prefix`: add a job, a worker in this process
 * returns its data, the caller awaits its completion — subscribed to the job's own event before
 * adding it, as the queue executor waits. The floor the queue benches read beside a queued miss.
 */
export async function bareBullmq(
  redis: Redis,
  prefix: string,
): Promise<{ roundTrip(i: number): Promise<void>; close(): Promise<void> }> {
  const options = { connection: redis.duplicate(), prefix };
  const queue = new Queue('bare', options);
  const events = new QueueEvents('bare', { ...options, connection: redis.duplicate() });
  const worker = new Worker('bare', async (job) => job.data, {
    ...options,
    connection: redis.duplicate(),
    concurrency: 8,
  });
  await Promise.all([queue.waitUntilReady(), events.waitUntilReady(), worker.waitUntilReady()]);
  events.setMaxListeners(0);
  return {
    async roundTrip(i) {
      const jobId = `b${i}-${randomBytes(4).toString('hex')}`;
      const done = new Promise<void>((resolve) => {
        const onDone = () => {
          events.off(`completed:${jobId}` as 'completed', onDone);
          resolve();
        };
        events.on(`completed:${jobId}` as 'completed', onDone);
      });
      await queue.add('r', { i }, { jobId, removeOnComplete: true, removeOnFail: true });
      await done;
    },
    async close() {
      await Promise.allSettled([queue.close(), events.close(), worker.close()]);
    },
  };
}
