import { context } from '@opentelemetry/api';
import { type ConnectionOptions, Queue, QueueEvents } from 'bullmq';
import { type Duration, resolveDuration } from '../duration.js';
import {
  errorClassOf,
  NoWorkersError,
  QueryFailedError,
  QueueJobRefusedError,
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
import { NAMED_RUN, type NamedRunOptions } from '../named_run.js';
import { inSpan, SpanKind, sdkTracer, traceparentOf } from '../tracing.js';
import { CLOSE_WAIT_MS, settleWithin } from '../util/settle_within.js';
import { ANSWER_TTL_MS, answerKey, referredOnce } from './answer_refs.js';
import { DirectReplies, type ReplySubscriber } from './direct_replies.js';
import { CLAIM_MARGIN_MS } from './job_claims.js';
import { type FleetRedis, FleetView } from './queue_fleet.js';
import {
  checkGroup,
  DEFAULT_GROUP,
  fleetKey,
  QUEUE_DEFAULTS,
  type QueueMessage,
  routedQueueName,
} from './queue_names.js';
import { QueueKeys } from './queue_seal.js';
import { OnceIds, type QueuePlace, sealJob } from './sealed_job.js';

/** Longest an enqueue may take before the run fails with E_QUEUE_UNAVAILABLE. */
const ADD_TIMEOUT_MS = 2000;

/** What reading a kept answer needs of the server's connection (an ioredis client). */
interface AnswerReader {
  get(key: string): Promise<string | null>;
}

/** How often a miss whose queue has no taker looks again while it waits for one. */
const NO_WORKERS_POLL_MS = 250;

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
  /**
   * The base of the queues' names: a job of workspace `W` goes to the queue `<name>/W/<group>`,
   * which only the workers and agents of that workspace and group read. @default 'jobs'
   */
  name?: string;
  /**
   * The worker group this executor's jobs go to (an agent token's group; a worker's `group`).
   * @default 'default'
   */
  group?: string;
  /**
   * How long a miss whose queue has no live worker or agent (no fresh heartbeat) waits for one
   * before it fails `E_NO_WORKERS` (never longer than `wait`). @default '5s'
   */
  noWorkersWait?: Duration;
  /**
   * For this long after the executor is made, such a miss waits until then at least: workers
   * started beside the server are not failed while they connect. @default 0
   */
  startGrace?: Duration;
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
  /**
   * Workers and agents of this executor's group (any workspace) whose heartbeat is fresh
   * (seen within 15 s).
   */
  liveWorkers(): Promise<number>;
  /** Live workers and agents per `<workspace>/<group>` queue (only those with one). */
  fleet(): Promise<Record<string, number>>;
  /**
   * Jobs by state, in the queues this executor has enqueued on: waiting for a worker, running,
   * delayed.
   */
  jobCounts(): Promise<{ waiting: number; active: number; delayed: number }>;
  close(): Promise<void>;
}

/**
 * Runs jobs on workers through BullMQ (server side). Put it under `withResultCache` exactly where
 * the in-process executor was: the cache records nothing new, answers hits before this is called
 * (nothing is enqueued for a hit), and hands it the miss with an opaque name of its full key.
 *
 * A job goes to the queue of its workspace and this executor's group (`<name>/<workspace>/<group>`,
 * one BullMQ queue each, opened on first use): only that workspace's and group's workers and
 * agents ever read it. A miss whose queue has no live taker (heartbeats) waits `noWorkersWait`
 * for one, then fails `E_NO_WORKERS`; a queue known to be taken costs no round trip for that.
 *
 * On a miss the job's record (perms with the viewer, origin, args) is sealed into the message
 * under the deployment secret, bound to the queue, workspace, queue id and deadline (see
 * sealed_job.ts): no Postgres round trip. The message goes under a BullMQ job id that is a
 * keyed hash of the full key: identical misses in flight on any server are one queued job,
 * misses of two viewers are two. The answer comes back sealed to that queue id, on BullMQ's
 * event stream (a blocking read, no polling) and, sooner, straight from the worker on this
 * server's own channel (direct_replies.ts); failures arrive as codes.
 */
export function createQueueExecutor(options: RawQueueExecutorOptions): QueueExecutor {
  const { executor, redis } = options;
  if (typeof executor?.createJob !== 'function')
    throw new TypeError('executor must be an Executor (createExecutor) with the apps');
  if (typeof redis?.duplicate !== 'function')
    throw new TypeError('redis must be an ioredis Redis or Cluster client');
  const keys = new QueueKeys(options.secretKey);
  const onceIds = new OnceIds();
  const waitMs = resolveDuration(options.wait ?? '60s', 'wait');
  const prefix = options.prefix ?? QUEUE_DEFAULTS.prefix;
  const base = options.name ?? QUEUE_DEFAULTS.name;
  const group = checkGroup(options.group ?? DEFAULT_GROUP);
  // Checks the base name once (a workspace and group that are surely valid).
  routedQueueName(base, 'w', group);
  const noWorkersMs = resolveDuration(options.noWorkersWait ?? '5s', 'noWorkersWait');
  const graceUntil = Date.now() + resolveDuration(options.startGrace ?? 0, 'startGrace');
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
  // Where this server's workers answer it straight away (direct_replies.ts): one subscriber.
  const replies = new DirectReplies(
    duplicate() as unknown as ReplySubscriber,
    prefix,
    base,
    logger,
  );
  const fleet = new FleetView(
    producer as unknown as FleetRedis,
    fleetKey(prefix, base),
    ADD_TIMEOUT_MS,
  );

  /** One BullMQ queue and event listener per workspace (this executor's group), opened on use. */
  interface Route {
    readonly name: string;
    readonly place: { readonly prefix: string; readonly name: string };
    readonly slot: string;
    readonly queue: Queue<QueueMessage, string>;
    /** Resolves once the listener reads from before anything this route adds. */
    readonly events: Promise<QueueEvents>;
    /** The listener once it reads (the hot path takes it without awaiting). */
    opened: QueueEvents | null;
    /**
     * Redis's clock (ms) just before this route's first add. The listener replays from a little
     * earlier; an answer or failure stamped before it is an earlier run's of the same queue id
     * (a key that failed a moment ago, then missed again) and is never this run's.
     */
    since: number;
    readonly listener: ReturnType<typeof duplicate>;
  }
  const routes = new Map<string, Route>();
  const route = (workspace: string): Route => {
    let found = routes.get(workspace);
    if (found !== undefined) return found;
    const name = routedQueueName(base, workspace, group);
    const queue = new Queue<QueueMessage, string>(name, { connection: producer, prefix });
    queue.on('error', (err) => logger.debug({ err: err.message }, 'queue error'));
    const listener = duplicate();
    // The listener reads the event stream from a time on Redis's own clock taken before the
    // first add (less 100 ms: another Cluster node's skew), not from "now" whenever its first
    // read lands: an answer that comes at once is not missed. (An event replayed from before
    // that time is an earlier run's, and no waiter takes it: see `since`.)
    const time = (producer as unknown as { time(): Promise<[string, string]> }).time();
    const events = time.then(([seconds, micros]) => {
      created.since = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
      const from = created.since - 100;
      const listening = new QueueEvents(name, {
        connection: listener,
        prefix,
        lastEventId: `${from}-0`,
      });
      listening.on('error', (err) => logger.debug({ err: err.message }, 'queue events error'));
      // Events fire per job id: one listener each, removed on settle, so no cap applies.
      listening.setMaxListeners(0);
      return listening;
    });
    const created: Route = {
      name,
      place: { prefix, name },
      slot: `${workspace}/${group}`,
      queue,
      listener,
      opened: null,
      since: Number.POSITIVE_INFINITY,
      events: events.then(async (listening) => {
        await listening.waitUntilReady();
        created.opened = listening;
        return listening;
      }),
    };
    found = created;
    // A failed start is retried by the next miss of this workspace.
    created.events.catch(() => {
      if (routes.get(workspace) === created) routes.delete(workspace);
      void settleWithin(new Set([queue.close()]), CLOSE_WAIT_MS).then(() => listener.disconnect());
    });
    routes.set(workspace, found);
    return found;
  };

  /**
   * Resolves when `slot` has a live worker or agent; else, once none came within the wait,
   * rejects E_NO_WORKERS. (A slot the last read saw taken is not asked: see `enqueue`.)
   */
  const taken = async (slot: string): Promise<void> => {
    const until = Date.now() + Math.min(waitMs, Math.max(noWorkersMs, graceUntil - Date.now()));
    for (;;) {
      let counts: Map<string, number>;
      try {
        counts = await fleet.read();
      } catch (err) {
        throw new QueueUnavailableError(undefined, { cause: err });
      }
      if ((counts.get(slot) ?? 0) > 0) return;
      const left = until - Date.now();
      if (left <= 0) {
        throw new NoWorkersError(
          `no worker or agent takes the jobs of this workspace for group ${group}: start one (worker --workspaces …, or an agent with a token of the workspace and group)`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(NO_WORKERS_POLL_MS, left)));
    }
  };
  /** The origin kind of jobs built here, for their record. */
  const origins = new WeakMap<Job, RunOrigin['kind']>();

  /**
   * What a run's wait ends with: the return value of the job's `completed` event (a sealed
   * answer, or a reference to one), or a direct reply that already opened for this run.
   */
  type Arrived = { readonly returned: unknown } | { readonly opened: Buffer };

  /**
   * Waits for the job of `queueId` on the event stream and, when its record names this server's
   * reply id, for the worker's direct reply to the message with once-id `once` too: the first
   * to come answers. A direct reply is taken only when it opens for this queue id (the event's
   * own check, made here, so that one that fails it is dropped and the event answers instead of
   * failing the run); a worker sends none for an answer kept by reference.
   */
  const waitFor = (
    events: QueueEvents,
    queueId: string,
    once: string,
    direct: boolean,
    since: number,
    ms: number,
  ): Promise<Arrived> =>
    new Promise((resolve, reject) => {
      const earlier = (id: string) => Number.parseInt(id, 10) < since;
      const done = () => {
        clearTimeout(timer);
        events.off(`completed:${queueId}` as 'completed', onCompleted);
        events.off(`failed:${queueId}` as 'failed', onFailed);
        if (direct) replies.forget(once);
      };
      const onCompleted = (args: { returnvalue: unknown }, id: string) => {
        if (earlier(id)) return;
        done();
        resolve({ returned: args.returnvalue });
      };
      if (direct)
        replies.expect(once, (answer) => {
          const opened = keys.openResult(queueId, answer);
          if (opened === null) return false;
          done();
          resolve({ opened });
          return true;
        });
      const onFailed = (args: { failedReason: string }, id: string) => {
        if (earlier(id)) return;
        done();
        reject(failureOf(args.failedReason));
      };
      const timer = setTimeout(() => {
        done();
        reject(new QueueTimeoutError(`no worker finished the job within ${waitMs} ms`));
      }, ms);
      events.on(`completed:${queueId}` as 'completed', onCompleted);
      events.on(`failed:${queueId}` as 'failed', onFailed);
    });

  /** Adds the message (or joins the job of that queue id) and waits for its answer. */
  const addAndWait = async (
    routed: Route,
    events: QueueEvents,
    queueId: string,
    message: QueueMessage,
    once: string,
    direct: boolean,
    deadline: number,
  ): Promise<Arrived> => {
    const { queue } = routed;
    // Subscribed before adding: a job that finishes at once is not missed.
    const answer = waitFor(
      events,
      queueId,
      once,
      direct,
      routed.since,
      Math.max(0, deadline - Date.now()),
    );
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
          // The replay guard (queue_claim.ts): no job is added again under this message's
          // once-id until it is past its deadline, and a worker runs none added under another.
          deduplication: { id: once, ttl: deadline + CLAIM_MARGIN_MS - Date.now() },
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
    return answer;
  };

  /** The sealed answer an event carried, or the one it refers to (answer_refs.ts). */
  const answerOf = async (place: QueuePlace, returned: unknown): Promise<unknown> => {
    const once = referredOnce(returned);
    if (once === null) return returned;
    if (once === false) throw new QueueResultInvalidError();
    let kept: string | null;
    let late: NodeJS.Timeout | undefined;
    try {
      kept = await Promise.race([
        (producer as unknown as AnswerReader).get(answerKey(place, once)),
        new Promise<never>((_, reject) => {
          late = setTimeout(() => reject(new Error('no answer')), ADD_TIMEOUT_MS);
        }),
      ]);
    } catch (err) {
      throw new QueueUnavailableError(undefined, { cause: err });
    } finally {
      clearTimeout(late);
    }
    // Only a server that read the event more than ANSWER_TTL_MS late (or a Redis writer).
    if (kept === null)
      throw new QueueTimeoutError(
        `the worker's answer was gone when this server read it (kept ${ANSWER_TTL_MS} ms)`,
      );
    return kept;
  };

  const enqueue = async (
    job: Job,
    runOptions: RunOptions | undefined,
    traceparent: string | null,
  ): Promise<JobResult> => {
    const routed = route(job.workspace);
    // Nobody to take it: say so within seconds, not after the wait (which blames the runnable).
    if (fleet.known(routed.slot) === null) await taken(routed.slot);
    let events = routed.opened;
    let slow: NodeJS.Timeout | undefined;
    if (events === null)
      try {
        // Bounded like the add: a listener that cannot start (Redis away) fails the run fast.
        events = await Promise.race([
          routed.events,
          new Promise<never>((_, reject) => {
            slow = setTimeout(() => reject(new Error('no answer')), ADD_TIMEOUT_MS);
          }),
        ]);
        clearTimeout(slow);
      } catch (err) {
        clearTimeout(slow);
        throw new QueueUnavailableError(undefined, { cause: err });
      }
    const { place } = routed;
    const queueId = keys.queueId(runOptions?.flight ?? `job:${job.workspace}:${job.id}`);
    // Whole milliseconds: the message's deadline is checked as an integer (a wait of '1.5ms').
    const deadline = Math.ceil(Date.now() + waitMs);
    // The record outlives the wait by nothing: a worker that reaches the job after the server
    // gave up finds it past its deadline and refuses it.
    const seal = (once: string, replyTo: string | null) =>
      sealJob(
        keys,
        place,
        job,
        origins.get(job) ?? 'unknown',
        queueId,
        deadline,
        traceparent,
        options.childUrl?.() ?? null,
        (runOptions as NamedRunOptions | undefined)?.[NAMED_RUN] ?? null,
        once,
        true,
        replyTo,
      );
    // The add joins a job of the same queue id still there (another server's miss of the same
    // key: coalesced by design) — or a stale one, past its deadline, that its worker is about to
    // refuse: this run must not take that refusal for its own answer. So a refusal while this
    // run's own deadline is ahead is answered by adding once more (the stale job is gone by
    // then), with a message of its own (a new once-id: the first may have been added and
    // refused, and BullMQ would not add it again); a second refusal is this run's. At most once
    // more, and never twice executed: a refused job ran nothing.
    let arrived: Arrived;
    for (let attempt = 1; ; attempt++) {
      const once = onceIds.next();
      const replyTo = replies.replyTo;
      try {
        arrived = await addAndWait(
          routed,
          events,
          queueId,
          seal(once, replyTo),
          once,
          replyTo !== null,
          deadline,
        );
        break;
      } catch (err) {
        if (!(err instanceof QueueJobRefusedError) || attempt > 1 || Date.now() >= deadline)
          throw err;
      }
    }
    const json =
      'opened' in arrived
        ? arrived.opened
        : keys.openResult(queueId, await answerOf(place, arrived.returned));
    if (json === null) throw new QueueResultInvalidError();
    // Parsed only if read: an HTTP answer forwards these bytes (the worker's own serialisation,
    // authenticated by the seal) without parsing them.
    return ComputedResult.received(job.id, json, true);
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
      // Connected, and the fleet read once (so the first misses know who takes what).
      await fleet.read().catch(() => {});
      await (producer as unknown as { ping(): Promise<unknown> }).ping();
      // Never fails: without its subscription a server waits on the events alone.
      await replies.started;
    },
    async liveWorkers() {
      let n = 0;
      for (const [slot, count] of await fleet.read()) if (slot.endsWith(`/${group}`)) n += count;
      return n;
    },
    async fleet() {
      return Object.fromEntries(await fleet.read());
    },
    async jobCounts() {
      const out = { waiting: 0, active: 0, delayed: 0 };
      for (const { queue } of routes.values()) {
        const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
        out.waiting += (counts['waiting'] ?? 0) + (counts['prioritized'] ?? 0);
        out.active += counts['active'] ?? 0;
        out.delayed += counts['delayed'] ?? 0;
      }
      return out;
    },
    async close() {
      // With Redis gone, BullMQ's close and a QUIT wait for it to come back (these clients retry
      // forever): bounded, then the sockets are dropped, so a server still stops.
      const closing = new Set<Promise<unknown>>();
      for (const r of routes.values()) {
        closing.add(r.queue.close());
        closing.add(r.events.then((events) => events.close()).catch(() => {}));
      }
      await settleWithin(closing, CLOSE_WAIT_MS);
      replies.close();
      for (const client of [producer, ...[...routes.values()].map((r) => r.listener)])
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
