/**
 * The audit in queue mode: its cached runs go through the queue path a server with
 * `VIEWER_CACHE_EXECUTION=queue` takes — each miss sealed onto BullMQ on Redis, taken by a worker
 * (here, in this process) that runs it under a result cache of its own — so what is judged is
 * what the worker path serves. Under a queue prefix of the audit's own, so no production worker
 * takes its jobs, and with caches of its own in memory: never the production cache.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  type CacheStore,
  createQueueExecutor,
  createQueueWorker,
  type Datatables,
  type Executor,
  type Logger,
  MemoryCacheStore,
  withResultCache,
} from '../../index.js';

/** The queue side of an audit: what its caches wrap instead of the executor, and its release. */
export interface AuditQueue {
  /** Runs each job on the audit's worker, through the queue. */
  readonly executor: Executor;
  /**
   * A new store for the next pass of the audit, shared by the audit's cache and the worker's
   * (as a server and its workers share one store: the worker writes what the server reads).
   */
  readonly passStore: () => CacheStore;
  /** Jobs the worker finished (each a miss of one of the audit's caches). */
  readonly taken: () => number;
  close(): Promise<void>;
}

/**
 * Opens a queue of the audit's own on `redisUrl` and one worker taking from it. `registry`
 * builds the jobs (the server side); `worker` runs them (the worker side, observed by the audit).
 */
export async function openAuditQueue(options: {
  readonly redisUrl: string;
  readonly secretKey: string;
  /** The workspace the audit runs in: its worker takes that workspace's jobs. */
  readonly workspace: string;
  readonly registry: Executor;
  readonly worker: Executor;
  readonly datatables: Datatables;
  readonly logger?: Logger;
}): Promise<AuditQueue> {
  // A hash tag, as in production; random, so two audits (or a server) never share a queue.
  const prefix = `{vc-audit-${randomBytes(6).toString('hex')}}`;
  const redis = new Redis(options.redisUrl, { maxRetriesPerRequest: null, lazyConnect: true });
  redis.on('error', (err: Error) => options.logger?.debug({ err: err.message }, 'audit redis'));
  const closers: (() => Promise<unknown>)[] = [];
  const close = async () => {
    for (const closer of closers.reverse()) await closer().catch(() => {});
    // The queue's keys are the audit's alone: removed, so an audit leaves nothing in Redis.
    await removeKeys(redis, prefix).catch(() => {});
    redis.disconnect();
  };
  let taken = 0;
  try {
    await redis.connect();
    const queue = createQueueExecutor({
      executor: options.registry,
      redis,
      secretKey: options.secretKey,
      prefix,
      ...(options.logger ? { logger: options.logger } : {}),
    });
    closers.push(() => queue.close());
    await queue.ready();
    // The worker's cache, as the worker command has (tracked fingerprint: it learns), over the
    // store of the audit's current pass.
    let current = new MemoryCacheStore();
    const pass: CacheStore = {
      shared: false,
      get: (key) => current.get(key),
      set: (key, value, ttlMs, tag) => current.set(key, value, ttlMs, tag),
      delete: (key) => current.delete(key),
    };
    const worker = createQueueWorker({
      executor: withResultCache(options.worker, {
        store: pass,
        fingerprint: options.datatables.fingerprint,
      }),
      redis,
      secretKey: options.secretKey,
      prefix,
      workspaces: [options.workspace],
      concurrency: 4,
      onFinished: () => {
        taken++;
      },
      ...(options.logger ? { logger: options.logger } : {}),
    });
    closers.push(() => worker.close());
    await worker.ready();
    const passStore = () => {
      current = new MemoryCacheStore();
      return pass;
    };
    return { executor: queue, passStore, taken: () => taken, close };
  } catch (err) {
    await close();
    throw err;
  }
}

async function removeKeys(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
}
