/**
 * What the queue benches share: the worker process they measure (`queue_worker_process.ts`)
 * and the floor beside it, bare BullMQ round trips through that same process.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Queue, QueueEvents } from 'bullmq';
import type { Redis } from 'ioredis';
import { createExecutor, createQueueExecutor } from '../src/index.js';
import { QUEUE_BENCH_RUNNABLES, QUEUE_BENCH_SECRET } from './queue_runnables.js';

const WORKER = fileURLToPath(new URL('./queue_worker_process.ts', import.meta.url));

export interface QueueWorkerPlace {
  readonly databaseUrl: string;
  readonly redisUrl: string;
  readonly queuePrefix: string;
  readonly cachePrefix: string;
  /** Job slots of the worker (ours and the bare one alike). */
  readonly concurrency: number;
}

/**
 * Starts a worker process and resolves once it says `ready`. `nodeFlags`: e.g. `--cpu-prof
 * --cpu-prof-dir=DIR` (a space-separated string, as an environment variable gives it).
 */
export async function startQueueWorker(
  place: QueueWorkerPlace,
  nodeFlags = '',
): Promise<ChildProcess> {
  const flags = nodeFlags.split(' ').filter(Boolean);
  const child = spawn(process.execPath, [...flags, '--import', 'tsx', WORKER], {
    env: {
      ...process.env,
      DATABASE_URL: place.databaseUrl,
      REDIS_URL: place.redisUrl,
      QUEUE_PREFIX: place.queuePrefix,
      CACHE_PREFIX: place.cachePrefix,
      CONCURRENCY: String(place.concurrency),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => line === 'ready' && resolve());
    child.once('exit', (code) => reject(new Error(`worker exited ${code}`)));
  });
  return child;
}

export async function stopQueueWorker(child: ChildProcess): Promise<void> {
  child.kill('SIGTERM');
  await once(child, 'exit');
}

export interface BareRoundTrips {
  /**
   * One bare BullMQ round trip: add a job, the worker process returns it, await it on the
   * queue's event stream (subscribed before adding, as the queue executor waits). `work`: the
   * worker runs the same ~1 ms runnable on the job first (the fair floor for throughput).
   */
  trip(name: 'r' | 'work'): Promise<void>;
  close(): Promise<void>;
}

/** Bare round trips on queue `bare` under `prefix`, on connections of their own. */
export async function bareRoundTrips(redis: Redis, prefix: string): Promise<BareRoundTrips> {
  // BullMQ never closes a connection it is handed: these are closed by `close`.
  const connections = [redis.duplicate(), redis.duplicate()] as const;
  for (const connection of connections) connection.on('error', () => {});
  const queue = new Queue('bare', { connection: connections[0], prefix });
  const events = new QueueEvents('bare', { connection: connections[1], prefix });
  events.setMaxListeners(0);
  await Promise.all([queue.waitUntilReady(), events.waitUntilReady()]);
  let n = 0;
  return {
    async trip(name) {
      const jobId = `b${n++}`;
      const done = new Promise<void>((resolve) => {
        const onDone = () => {
          events.off(`completed:${jobId}` as 'completed', onDone);
          resolve();
        };
        events.on(`completed:${jobId}` as 'completed', onDone);
      });
      await queue.add(name, { n }, { jobId, removeOnComplete: true, removeOnFail: true });
      await done;
    },
    async close() {
      await queue.close();
      await events.close();
      for (const connection of connections) connection.disconnect();
    },
  };
}

/**
 * The enqueuing side every queue bench measures: the in-process executor of the bench runnables
 * and a queue executor over it on `redis` under `prefix`, ready (its first misses know the fleet).
 */
export async function benchQueueExecutor(redis: Redis, prefix: string) {
  const local = createExecutor({ runnables: QUEUE_BENCH_RUNNABLES });
  const queue = createQueueExecutor({
    executor: local,
    redis,
    secretKey: QUEUE_BENCH_SECRET,
    prefix,
  });
  await queue.ready();
  return { local, queue };
}
