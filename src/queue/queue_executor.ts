import { context } from '@opentelemetry/api';
import { type ConnectionOptions, Queue, QueueEvents } from 'bullmq';
import { type Duration, resolveDuration } from '../duration.js';
import {
  errorClassOf,
  QueryFailedError,
  QueueResultInvalidError,
  QueueTimeoutError,
  QueueUnavailableError,
  QueueWorkerLostError,
  type ViewerCacheError,
} from '../errors.js';
import type { Executor, JobRequest } from '../executor/executor.js';
import type { Job, RunOptions, RunOrigin } from '../job.js';
import { ComputedResult, type JobResult } from '../job_result.js';
import { type Logger, silentLogger } from '../logger.js';
import { inSpan, SpanKind, sdkTracer, traceparentOf } from '../tracing.js';
import { CLOSE_WAIT_MS, settleWithin } from '../util/settle_within.js';
import {
  HEARTBEAT_TTL_MS,
  heartbeatKey,
  QUEUE_DEFAULTS,
  type QueueMessage,
} from './queue_names.js';
import { QueueKeys } from './queue_seal.js';
import { sealJob } from './sealed_job.js';

/** Longest an enqueue may take before the run fails with E_QUEUE_UNAVAILABLE. */
const ADD_TIMEOUT_MS = 2000;

/** A Redis client the queue may duplicate (ioredis `Redis` or `Cluster`). */
export interface QueueRedis {
  duplicate(): unknown;
}

export interface RawQueueExecutorOptions {
  /**
   * The registry of runnables (createJob, runnable): the same apps the workers run. Its `run` is
   * never called: jobs run on workers.
   */
  executor: Executor;
  /**
   * The Redis the cache uses (single node or Cluster): duplicated for the queue's producer and
   * its event listener, with `maxRetriesPerRequest: null` as BullMQ's blocking reads need.
   */
  redis: QueueRedis;
  /** The deployment secret (VIEWER_CACHE_SECRET_KEY), the same on every server and worker. */
  secretKey: string;
  /** Longest the server waits for a worker to finish a job. @default '60s' */
  wait?: Duration;
  /** @default '{viewer-cache}' (a Cluster hash tag) */
  prefix?: string;
  /** @default 'jobs' */
  name?: string;
  /** @default silent */
  logger?: Logger;
  /**
   * Where the jobs' child runs over HTTP go: this server's advertised address, asked at each
   * enqueue and sealed into the record, so a worker needs no address of its own. Returning null
   * (or leaving this out) seals none. @default none
   */
  childUrl?: () => string | null;
}

/** An {@link Executor} whose runs happen on queue workers. */
export interface QueueExecutor extends Executor {
  /** Resolves once the queue and its event listener are connected. */
  ready(): Promise<void>;
  /** Workers whose heartbeat is fresh (seen within 15 s). */
  liveWorkers(): Promise<number>;
  /** Jobs in the queue by state: waiting for a worker, running, delayed. */
  jobCounts(): Promise<{ waiting: number; active: number; delayed: number }>;
  close(): Promise<void>;
}

/**
 * Runs jobs on workers through BullMQ (server side). Put it under `withResultCache` exactly where
 * the in-process executor was: the cache records nothing new, answers hits before this is called
 * (nothing is enqueued for a hit), and hands it the miss with an opaque name of its full key.
 *
 * On a miss the job's record (perms with the viewer, origin, args) is sealed into the message
 * under the deployment secret, bound to the queue, workspace, queue id and deadline (see
 * sealed_job.ts): no Postgres round trip. The message goes under a BullMQ job id that is a
 * keyed hash of the full key: identical misses in flight on any server are one queued job,
 * misses of two viewers are two. The answer comes back on BullMQ's event stream (a blocking
 * read, no polling), sealed to that queue id; failures arrive as codes.
 */
export function createQueueExecutor(options: RawQueueExecutorOptions): QueueExecutor {
  const { executor, redis } = options;
  if (typeof executor?.createJob !== 'function')
    throw new TypeError('executor must be an Executor (createExecutor) with the apps');
  if (typeof redis?.duplicate !== 'function')
    throw new TypeError('redis must be an ioredis Redis or Cluster client');
  const keys = new QueueKeys(options.secretKey);
  const waitMs = resolveDuration(options.wait ?? '60s', 'wait');
  const prefix = options.prefix ?? QUEUE_DEFAULTS.prefix;
  const name = options.name ?? QUEUE_DEFAULTS.name;
  const logger = options.logger ?? silentLogger;
  const duplicate = () => {
    const client = redis.duplicate() as ConnectionOptions & {
      options?: { maxRetriesPerRequest?: number | null; redisOptions?: object };
      on(event: 'error', fn: (err: Error) => void): void;
    };
    client.on('error', (err) => logger.debug({ err: err.message }, 'queue redis error'));
    return client;
  };
  const producer = duplicate();
  const listener = duplicate();
  const queue = new Queue<QueueMessage, string>(name, { connection: producer, prefix });
  queue.on('error', (err) => logger.debug({ err: err.message }, 'queue error'));
  const events = new QueueEvents(name, { connection: listener, prefix });
  events.on('error', (err) => logger.debug({ err: err.message }, 'queue events error'));
  // Events fire per job id: one listener each, removed on settle, so no cap applies.
  events.setMaxListeners(0);
  /** The origin kind of jobs built here, for their record. */
  const origins = new WeakMap<Job, RunOrigin['kind']>();
  const place = { prefix, name };

  const waitFor = (queueId: string): Promise<unknown> =>
    new Promise((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        events.off(`completed:${queueId}` as 'completed', onCompleted);
        events.off(`failed:${queueId}` as 'failed', onFailed);
      };
      const onCompleted = (args: { returnvalue: unknown }) => {
        done();
        resolve(args.returnvalue);
      };
      const onFailed = (args: { failedReason: string }) => {
        done();
        reject(failureOf(args.failedReason));
      };
      const timer = setTimeout(() => {
        done();
        reject(new QueueTimeoutError(`no worker finished the job within ${waitMs} ms`));
      }, waitMs);
      events.on(`completed:${queueId}` as 'completed', onCompleted);
      events.on(`failed:${queueId}` as 'failed', onFailed);
    });

  const enqueue = async (
    job: Job,
    runOptions: RunOptions | undefined,
    traceparent: string | null,
  ): Promise<JobResult> => {
    const queueId = keys.queueId(runOptions?.flight ?? `job:${job.workspace}:${job.id}`);
    // The record outlives the wait by nothing: a worker that reaches the job after the server
    // gave up finds it past its deadline and refuses it.
    const message = sealJob(
      keys,
      place,
      job,
      origins.get(job) ?? 'unknown',
      queueId,
      // Whole milliseconds: the message's deadline is checked as an integer (a wait of '1.5ms').
      Math.ceil(Date.now() + waitMs),
      traceparent,
      options.childUrl?.() ?? null,
    );
    // Subscribed before adding: a job that finishes at once is not missed.
    const answer = waitFor(queueId);
    answer.catch(() => {});
    let late: NodeJS.Timeout | undefined;
    try {
      // BullMQ's connection queues commands while Redis is away: a run fails fast instead.
      await Promise.race([
        queue.add('run', message, {
          jobId: queueId,
          removeOnComplete: true,
          removeOnFail: true,
          stackTraceLimit: 0,
          attempts: 1,
        }),
        new Promise((_, reject) => {
          late = setTimeout(() => reject(new Error('no answer')), ADD_TIMEOUT_MS);
        }),
      ]);
    } catch (err) {
      throw new QueueUnavailableError(undefined, { cause: err });
    } finally {
      clearTimeout(late);
    }
    const sealed = await answer;
    const json = keys.openResult(queueId, sealed);
    if (json === null) throw new QueueResultInvalidError();
    return ComputedResult.withJson(job.id, JSON.parse(json.toString('utf8')), json, true);
  };

  // Traced: a PRODUCER span around the enqueue and the wait, whose context travels sealed in
  // the record, so the worker's spans join the server's trace.
  const run = (job: Job, runOptions?: RunOptions): Promise<JobResult> => {
    const tracer = sdkTracer();
    if (tracer === null) return enqueue(job, runOptions, null);
    return inSpan(
      tracer,
      'viewer_cache.queue.enqueue',
      { 'messaging.system': 'bullmq', 'messaging.operation.type': 'send' },
      () => enqueue(job, runOptions, traceparentOf(context.active())),
      SpanKind.PRODUCER,
    );
  };

  return {
    runnable: (path) => executor.runnable(path),
    createJob(request: JobRequest) {
      const job = executor.createJob(request);
      origins.set(job, request.origin.kind);
      return job;
    },
    run,
    async ready() {
      await Promise.all([queue.waitUntilReady(), events.waitUntilReady()]);
    },
    async liveWorkers() {
      const client = producer as unknown as {
        zcount(key: string, min: number, max: string): Promise<number>;
      };
      return client.zcount(heartbeatKey(prefix, name), Date.now() - HEARTBEAT_TTL_MS, '+inf');
    },
    async jobCounts() {
      const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
      return {
        waiting: (counts['waiting'] ?? 0) + (counts['prioritized'] ?? 0),
        active: counts['active'] ?? 0,
        delayed: counts['delayed'] ?? 0,
      };
    },
    async close() {
      // With Redis gone, BullMQ's close and a QUIT wait for it to come back (these clients retry
      // forever): bounded, then the sockets are dropped, so a server still stops.
      await settleWithin(new Set([queue.close(), events.close()]), CLOSE_WAIT_MS);
      for (const client of [producer, listener])
        (client as unknown as { disconnect(): void }).disconnect();
    },
  };
}

/** A worker's failure: a code it sent, as that code's error; anything else, a lost worker. */
function failureOf(reason: unknown): ViewerCacheError {
  // A refused statement travels as `E_QUERY_FAILED:SQLSTATE` (queue_claim.ts).
  const [code, sqlstate] = typeof reason === 'string' ? reason.split(':') : [];
  if (code === QueryFailedError.code) return new QueryFailedError(undefined, { sqlstate });
  const Coded = errorClassOf(code);
  if (Coded !== undefined) return new Coded();
  // BullMQ's own reasons (stalled more than allowed, lock lost): the worker died mid-job.
  return new QueueWorkerLostError();
}
