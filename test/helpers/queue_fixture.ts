import { randomBytes } from 'node:crypto';
import { type Job as BullJob, Worker } from 'bullmq';
import { Cluster, Redis } from 'ioredis';
import pg from 'pg';
import type { Datatables } from '../../src/datatable/datatables.js';
import {
  type CachedExecutor,
  type CacheStore,
  createExecutor,
  createQueueExecutor,
  createQueueWorker,
  type Executor,
  type Logger,
  migrateQueue,
  type QueueExecutor,
  type QueueJobOutcome,
  type QueueWorker,
  RedisCacheStore,
  type RunnableDefinition,
  SharedJobTokens,
  withResultCache,
} from '../../src/index.js';
import { fleetKey, fleetMember, routedQueueName } from '../../src/queue/queue_names.js';
import { settleWithin } from '../../src/util/settle_within.js';
import { SECRET_KEY } from './orders_db.js';
import { waitUntil } from './wait.js';

/** A queue prefix of its own (a hash tag, as in production), for one test file. */
export function queuePrefix(): string {
  return `{vc-test-${randomBytes(4).toString('hex')}}`;
}

export interface QueueSide {
  readonly cached: CachedExecutor;
  readonly queue: QueueExecutor;
  readonly registry: Executor;
}

/**
 * Servers and workers of one deployment, in this process: each server is a result cache over a
 * queue executor; each worker a result cache over the in-process executor, taking jobs.
 */
export class QueueDeployment {
  readonly prefix = queuePrefix();
  readonly cachePrefix = `vc-test:${this.prefix}:`;
  readonly outcomes: QueueJobOutcome[] = [];
  readonly redis: Redis | Cluster;
  readonly pool: pg.Pool;
  readonly #closers: (() => Promise<unknown>)[] = [];

  constructor(
    readonly redisUrl: string,
    databaseUrl: string,
    readonly datatables: Datatables,
    readonly runnables: Record<string, RunnableDefinition>,
    /** A Redis Cluster instead of `redisUrl` (a client the caller closes). */
    readonly cluster?: Cluster,
  ) {
    this.redis = cluster ?? new Redis(redisUrl, { maxRetriesPerRequest: null });
    this.redis.on('error', () => {});
    this.pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    this.pool.on('error', () => {});
  }

  async migrate(): Promise<void> {
    await migrateQueue(this.pool);
  }

  store(): RedisCacheStore {
    const store = new RedisCacheStore({
      redis: this.cluster ?? this.redisUrl,
      prefix: this.cachePrefix,
    });
    this.#closers.push(() => store.close());
    return store;
  }

  async server(
    options: {
      wait?: number;
      secretKey?: string;
      group?: string;
      noWorkersWait?: number;
      /** The server's Redis client instead of the deployment's (the caller closes it). */
      redis?: Redis;
      logger?: Logger;
    } = {},
  ): Promise<QueueSide> {
    const registry = createExecutor({ runnables: this.runnables });
    const queue = createQueueExecutor({
      executor: registry,
      redis: options.redis ?? this.redis,
      ...(options.logger === undefined ? {} : { logger: options.logger }),
      secretKey: options.secretKey ?? SECRET_KEY,
      prefix: this.prefix,
      ...(options.wait === undefined ? {} : { wait: options.wait }),
      ...(options.group === undefined ? {} : { group: options.group }),
      // Worker processes of a loaded machine take seconds to start: misses wait for one (a test
      // of the fail-fast gives its own, short, wait).
      noWorkersWait: options.noWorkersWait ?? 30_000,
    });
    this.#closers.push(() => queue.close());
    await queue.ready();
    const cached = withResultCache(queue, {
      store: this.store(),
      fingerprint: this.datatables.fingerprint,
      seal: { secretKey: SECRET_KEY },
    });
    return { cached, queue, registry };
  }

  async worker(
    options: {
      concurrency?: number;
      secretKey?: string;
      lockDuration?: number;
      /** @default ['demo'] (the orders fixture's workspace) */
      workspaces?: string[];
      group?: string;
      onFinished?: (outcome: QueueJobOutcome) => void;
      /** Wraps the worker's store (a test holding its writes' acknowledgements). */
      wrapStore?: (store: CacheStore) => CacheStore;
    } = {},
  ): Promise<QueueWorker> {
    const executor = createExecutor({
      runnables: this.runnables,
      datatables: this.datatables,
      jobTokens: new SharedJobTokens({
        redis: this.redis,
        prefix: this.prefix,
        secretKey: options.secretKey ?? SECRET_KEY,
      }),
    });
    const cached = withResultCache(executor, {
      store: options.wrapStore?.(this.store()) ?? this.store(),
      // Tracked, as the worker command does (see src/server/start/worker.ts): the worker learns.
      fingerprint: this.datatables.fingerprint,
      seal: { secretKey: SECRET_KEY },
    });
    const worker = createQueueWorker({
      executor: cached,
      redis: this.redis,
      secretKey: options.secretKey ?? SECRET_KEY,
      prefix: this.prefix,
      workspaces: options.workspaces ?? ['demo'],
      ...(options.group === undefined ? {} : { group: options.group }),
      onFinished: (outcome) => {
        this.outcomes.push(outcome);
        options.onFinished?.(outcome);
      },
      ...(options.concurrency === undefined ? {} : { concurrency: options.concurrency }),
      ...(options.lockDuration === undefined ? {} : { lockDuration: options.lockDuration }),
    });
    this.#closers.push(() => worker.close());
    await worker.ready();
    return worker;
  }

  /**
   * A rogue worker of workspace `workspace`'s default queue (anyone who can write to Redis):
   * every job it takes is answered with `answer(job)`. It beats as a worker of the queue does, so
   * servers enqueue; closed with the deployment.
   */
  async rogue(workspace: string, answer: (job: BullJob) => unknown): Promise<Worker> {
    const connection = this.redis.duplicate();
    connection.on('error', () => {});
    const rogue = new Worker(
      routedQueueName('jobs', workspace, 'default'),
      async (job) => answer(job),
      {
        connection,
        prefix: this.prefix,
      },
    );
    this.#closers.push(async () => {
      await rogue.close();
      connection.disconnect();
    });
    await rogue.waitUntilReady();
    await this.redis.zadd(
      fleetKey(this.prefix, 'jobs'),
      Date.now(),
      fleetMember(workspace, 'default', 'rogue'),
    );
    return rogue;
  }

  /** Where queue `name`'s event stream ends now: the mark to hand `completedSince`. */
  async eventsEnd(name: string): Promise<string> {
    const [last] = (await this.redis.xrevrange(
      `${this.prefix}:${name}:events`,
      '+',
      '-',
      'COUNT',
      1,
    )) as [string, string[]][];
    return last?.[0] ?? '0-0';
  }

  /**
   * The return values of the `completed` events on queue `name`'s stream after `mark`, newest
   * first, once there are `count` of them. A worker replies ahead of BullMQ's completion, so a run can be
   * answered before its event is written: reading the stream right after the run races it.
   */
  async completedSince(name: string, mark: string, count = 1): Promise<string[]> {
    let values: string[] = [];
    await waitUntil(`${count} completed event(s) on ${name} after ${mark}`, async () => {
      const entries = (await this.redis.xrange(
        `${this.prefix}:${name}:events`,
        `(${mark}`,
        '+',
      )) as [string, string[]][];
      values = entries
        .map(([, fields]) =>
          Object.fromEntries(fields.flatMap((v, i) => (i % 2 ? [] : [[v, fields[i + 1]]]))),
        )
        .filter((event) => event['event'] === 'completed')
        .map((event) => JSON.parse(event['returnvalue'] as string) as string)
        .reverse();
      return values.length >= count;
    });
    return values;
  }

  /** Every key of the queue and the cache, with its value as text (whatever its type). */
  async dump(): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    const nodes = this.redis instanceof Cluster ? this.redis.nodes('master') : [this.redis];
    for (const node of nodes) {
      for (const match of [`${this.prefix}*`, `${this.cachePrefix}*`]) {
        let cursor = '0';
        do {
          const [next, keys] = await node.scan(cursor, 'MATCH', match, 'COUNT', 1000);
          cursor = next;
          for (const key of keys) out.set(key, await this.#value(key));
        } while (cursor !== '0');
      }
    }
    return out;
  }

  async #value(key: string): Promise<string> {
    const type = await this.redis.type(key);
    const r = this.redis;
    switch (type) {
      case 'string':
        return (await r.getBuffer(key))?.toString('latin1') ?? '';
      case 'hash':
        return JSON.stringify(await r.hgetall(key));
      case 'list':
        return JSON.stringify(await r.lrange(key, 0, -1));
      case 'set':
        return JSON.stringify(await r.smembers(key));
      case 'zset':
        return JSON.stringify(await r.zrange(key, 0, -1, 'WITHSCORES'));
      case 'stream':
        return JSON.stringify(await r.xrange(key, '-', '+'));
      default:
        return '';
    }
  }

  async close(): Promise<void> {
    for (const close of this.#closers.reverse()) await close().catch(() => {});
    // This client retries forever: against a Redis a test has killed, the clean-up is bounded.
    const cleanup = (async () => {
      const keys = [...(await this.dump().catch(() => new Map<string, string>())).keys()];
      for (const key of keys) await this.redis.del(key).catch(() => {});
    })();
    await settleWithin(new Set([cleanup]), 5000);
    if (this.cluster === undefined) this.redis.disconnect();
    await this.pool.end();
  }
}
