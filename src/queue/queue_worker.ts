import { type Job as BullJob, type ConnectionOptions, UnrecoverableError, Worker } from 'bullmq';
import { QueueJobRefusedError } from '../errors.js';
import type { JobExecutor } from '../job.js';
import { GIVEN_RUN, type NamedRun, type NamedRunOptions } from '../named_run.js';
import { runTraced } from '../tracing.js';
import { CLOSE_WAIT_MS, settleWithin } from '../util/settle_within.js';
import { type CorkableClient, corkForTick, uncorkNow } from '../util/tick_cork.js';
import { type AnswerRedis, INLINE_ANSWER_MAX, keepAnswer } from './answer_refs.js';
import { type ReplyPublisher, replyChannel, sendReply } from './direct_replies.js';
import type { ClaimRedis } from './job_claims.js';
import { claimQueuedJob, queueFailureCode } from './queue_claim.js';
import {
  checkGroup,
  checkWorkspace,
  DEFAULT_GROUP,
  fleetKey,
  fleetMember,
  HEARTBEAT_TTL_MS,
  routedQueueName,
} from './queue_names.js';
import { type QueueTakerOptions, queueTaker } from './queue_taker.js';
import { CHILD_QUEUE_DEPTHS, runQueued } from './queued_run.js';

/** How one job ended on this worker: `ok`, or the error code it failed with. */
export interface QueueJobOutcome {
  readonly path: string | null;
  readonly code: string;
  readonly ms: number;
  /** How long the job waited in the queue before this worker took it (ms). */
  readonly waitedMs: number;
  /** Whether this is the job's second run (its first worker was lost). */
  readonly retried: boolean;
  /** The nesting depth of the queue it came from (0: queued by a server; d: a child). */
  readonly depth: number;
}

/** A worker's options: a taker's (a worker that dies mid-job hands it back after its lock), and: */
export interface RawQueueWorkerOptions extends QueueTakerOptions {
  /**
   * What runs the jobs: the in-process executor with the apps, under `withResultCache` with the
   * same store, fingerprint and seal as the servers (so it looks up, checks the fingerprint and
   * writes the sealed entry exactly as a server in process does). Give it the fingerprint
   * *tracked* — `fingerprint: datatables.fingerprint` — so the worker, which runs the job, learns
   * what the runnable depends on and shares the set (the data tables' learned sets, in Postgres):
   * the servers read that set before keying, so they look up the key the worker stored under.
   */
  executor: JobExecutor;
  /**
   * The workspaces whose jobs this worker runs: it reads their queues (of its `group`) and no
   * other, so it never meets another workspace's job.
   */
  workspaces: readonly string[];
  /** The worker group it serves (the servers' `group`). @default 'default' */
  group?: string;
  /**
   * Jobs run at once, per workspace served. Above 8 they are taken by up to 4 BullMQ workers on
   * that queue, each with its share of the slots and a blocking Redis connection of its own (see
   * `takerSlots` in queue_worker.ts). @default 1
   */
  concurrency?: number;
  /**
   * The nesting depth of the jobs this worker takes (with `name` the queue of that depth,
   * `childQueueName`): 0 for the jobs servers queue, d for job-token children of depth d-1 jobs.
   * The tokens of its jobs carry it, so their children go one queue deeper. @default 0
   */
  depth?: number;
  /** Called once per finished job (metrics). */
  onFinished?: (outcome: QueueJobOutcome) => void;
  /** Told when this worker finds a job whose worker was lost (BullMQ's stalled check). */
  onStalled?: () => void;
}

export interface QueueWorker {
  /** This worker's id in the heartbeat set. */
  readonly id: string;
  /** Jobs running now. */
  readonly running: number;
  /** Resolves once connected and taking jobs. */
  ready(): Promise<void>;
  /** Stops taking jobs, lets the running ones finish, then disconnects. */
  close(): Promise<void>;
}

/**
 * A queue worker: takes `{ workspace, queueId, deadline, record }` messages, runs a job only when
 * its record opens under the secret (bound to this queue, the workspace, the job id and the
 * deadline), the deadline has not passed and it is no replay (queue_claim.ts), and reads the
 * job — viewer included — from that sealed record alone. Answers travel sealed to the queue id;
 * failures as bare codes.
 */
export function createQueueWorker(options: RawQueueWorkerOptions): QueueWorker {
  const { executor } = options;
  if (typeof executor?.run !== 'function') throw new TypeError('executor must run jobs');
  const concurrency = options.concurrency ?? 1;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000)
    throw new TypeError('concurrency must be an integer from 1 to 1000');
  const depth = options.depth ?? 0;
  if (!Number.isInteger(depth) || depth < 0 || depth > CHILD_QUEUE_DEPTHS)
    throw new TypeError(`depth must be an integer from 0 to ${CHILD_QUEUE_DEPTHS}`);
  const { redis, keys, lockMs, prefix, name: base, logger, id } = queueTaker(options);
  const group = checkGroup(options.group ?? DEFAULT_GROUP);
  if (!Array.isArray(options.workspaces) || options.workspaces.length === 0)
    throw new TypeError('workspaces must name the workspaces whose jobs this worker runs');
  const workspaces = [...new Set(options.workspaces.map((w) => checkWorkspace(w, 'workspaces')))];
  let running = 0;
  let closing: Promise<void> | null = null;

  const finished = (outcome: QueueJobOutcome) => {
    // One line per job: path, outcome code, duration; never the viewer, args or rows.
    logger.info(outcome, 'job finished');
    try {
      options.onFinished?.(outcome);
    } catch {
      // a metrics callback never fails a job
    }
  };

  const refuse = (
    started: number,
    path: string | null,
    bullJob: BullJob<unknown, string>,
  ): never => {
    finished({
      path,
      code: QueueJobRefusedError.code,
      ms: performance.now() - started,
      ...queued(bullJob),
      depth,
    });
    throw new UnrecoverableError(QueueJobRefusedError.code);
  };

  const processor =
    (place: { prefix: string; name: string }) =>
    async (bullJob: BullJob<unknown, string>): Promise<string> => {
      const started = performance.now();
      corkForTick(connection);
      const claimed = await claimQueuedJob(keys, place, connection, bullJob);
      if (claimed === null) return refuse(started, null, bullJob);
      const { message, job } = claimed;
      const path = job.runnable.path;
      running += 1;
      try {
        const { retried } = queued(bullJob);
        // The job's code sees its depth and its server's address (child runs over HTTP).
        const queuedRun = { depth, childUrl: claimed.childUrl };
        // The server looked the key up and missed a moment ago: the worker does not read the
        // store again (one round trip less), except on a stall retry, whose first run may have
        // stored it. Either way it answers without waiting for its entry's write (see
        // WRITE_BEHIND).
        // Its entry's write goes on this worker's connection when the store is on the same
        // Redis (write_affinity.ts): in the answer's own `writev`, and run before it.
        const result = await runQueued(queuedRun, connection, () =>
          runTraced(claimed.traceparent, 'viewer_cache.queue.run', () =>
            executor.run(job, runOptions(retried, claimed.named)),
          ),
        );
        const json = result.json();
        finishBeforeAnswer(connection, claimed);
        finished({ path, code: 'ok', ms: performance.now() - started, ...queued(bullJob), depth });
        const sealed = keys.sealResult(message.queueId, json);
        const { once, replyTo } = claimed;
        // A large answer waits in Redis under a key of its own, not in the event stream.
        const answer =
          claimed.answersByRef && once !== null && sealed.length > INLINE_ANSWER_MAX
            ? await keepAnswer(connection, place, once, sealed)
            : sealed;
        // Straight to the server that waits (direct_replies.ts), when inline; the event still
        // carries it.
        if (replyTo !== null && once !== null && answer === sealed)
          replyAhead(replyChannel(prefix, base, replyTo), once, answer);
        return answer;
      } catch (thrown) {
        finishBeforeAnswer(connection, claimed);
        const code = queueFailureCode(thrown);
        finished({ path, code, ms: performance.now() - started, ...queued(bullJob), depth });
        // Only the code reaches Redis (BullMQ keeps failure reasons in clear).
        throw new UnrecoverableError(code);
      } finally {
        running -= 1;
      }
    };

  /**
   * Sends a reply on the worker's connection, after the entry's write and the claim's finish,
   * and — the first reply of a tick — at once, in a write of its own ahead of BullMQ's
   * completion: sent in the same write, Redis runs the completion in the same pass and answers
   * the server's event read together with the reply (measured: the reply then came first in 1
   * run of 5, and saved nothing). Later replies of the same tick (a loaded worker finishing
   * several jobs in one) leave with the tick's other commands: a write of their own for every
   * reply made 2.1 writes per queued miss at 32 callers, against 0.4 before direct replies and
   * 0.5–0.8 this way (`bench/queue_cpu.ts`).
   */
  let aheadThisTick = false;
  const endTick = () => {
    aheadThisTick = false;
  };
  const replyAhead = (channel: string, once: string, answer: string) => {
    sendReply(connection, channel, once, answer);
    if (aheadThisTick) return;
    aheadThisTick = true;
    process.nextTick(endTick);
    uncorkNow(connection);
  };

  const connection = redis.duplicate() as ConnectionOptions & {
    on(event: 'error', fn: (err: Error) => void): void;
    quit(): Promise<unknown>;
    disconnect(): void;
    zadd(key: string, score: number, member: string): Promise<unknown>;
    zrem(key: string, member: string): Promise<unknown>;
    zremrangebyscore(key: string, min: number | string, max: number | string): Promise<unknown>;
    readonly status: string;
  } & ClaimRedis &
    AnswerRedis &
    ReplyPublisher;
  connection.on('error', (err) => logger.debug({ err: err.message }, 'worker redis error'));
  // BullMQ workers on each workspace's queue of this group only (no other queue): `concurrency`
  // slots in all per workspace, split between them.
  const slots = takerSlots(concurrency);
  const workers = workspaces.flatMap((workspace) =>
    slots.map((share) => take(routedQueueName(base, workspace, group), share)),
  );
  function take(name: string, share: number): Worker<unknown, string> {
    const worker = new Worker<unknown, string>(name, processor({ prefix, name }), {
      connection,
      prefix,
      concurrency: share,
      lockDuration: lockMs,
      stalledInterval: Math.max(1000, Math.floor(lockMs / 2)),
      // A job whose worker died returns to the queue once; a second loss fails it (coded).
      maxStalledCount: 1,
      removeOnComplete: { count: 0 },
      removeOnFail: { count: 0 },
    });
    worker.on('error', (err) => logger.debug({ err: err.message }, 'worker error'));
    worker.on('stalled', () => {
      // At warn: a lost worker is the operator's news (the job runs once more, as its viewer).
      logger.warn("a job's worker was lost; it is handed back and runs once more");
      try {
        options.onStalled?.();
      } catch {
        // a metrics callback never fails the worker
      }
    });
    return worker;
  }

  // The fleet's heartbeats: one member per queue served, in the one set every server reads.
  const beatKey = fleetKey(prefix, base);
  const members = workspaces.map((workspace) => fleetMember(workspace, group, id));
  const beat = () => {
    const now = Date.now();
    for (const member of members) connection.zadd(beatKey, now, member).catch(() => {});
    connection.zremrangebyscore(beatKey, '-inf', now - 4 * HEARTBEAT_TTL_MS).catch(() => {});
  };
  beat();
  const beating = setInterval(beat, HEARTBEAT_TTL_MS / 3);
  beating.unref();

  return {
    id,
    get running() {
      return running;
    },
    async ready() {
      await Promise.all(workers.map((worker) => worker.waitUntilReady()));
    },
    close() {
      // Once: a second call waits for the first stop rather than starting another.
      closing ??= (async () => {
        clearInterval(beating);
        // Finishes the jobs it holds (BullMQ waits for the active ones) and takes no new ones —
        // unless Redis stays unreachable for a lock duration: this worker can then neither renew
        // the locks nor report what it finishes (BullMQ would wait for it forever), and the jobs
        // it holds are handed back by BullMQ's stalled check (retried once, on the same record).
        const graceful = Promise.all(workers.map((worker) => worker.close()));
        graceful.catch(() => {});
        if (!(await untilOrUnreachable(graceful, connection, lockMs))) {
          logger.warn(
            { running, lockMs },
            'worker stop: Redis unreachable for a lock duration, jobs handed back',
          );
          // Pending commands fail at once on the dropped sockets, so the close above unwinds.
          await settleWithin(new Set(workers.map((w) => w.disconnect())), CLOSE_WAIT_MS);
        }
        // Redis may be gone (this client retries forever): the heartbeat's removal is bounded,
        // and the socket dropped; a stale heartbeat expires on its own.
        await settleWithin(
          new Set(members.map((member) => connection.zrem(beatKey, member))),
          CLOSE_WAIT_MS,
        );
        connection.disconnect();
      })();
      return closing;
    },
  };
}

/**
 * A worker's entry write is sent before its answer, not awaited: the answer's own commands (the
 * claim's finish, BullMQ's completion) leave for Redis after it, and the server acts on the
 * answer only once Redis has run them, so waiting for the write's reply bought nothing but a
 * round trip on every queued miss. When the store is on the worker's Redis the write goes on
 * the worker's own connection, so Redis runs it before the answer by contract; a store
 * elsewhere writes on its own connection, in the order sent. Should an answer overtake its
 * write there (the store still connecting on the worker's first job), the caller's next run
 * misses and runs once more as the same viewer. A write that fails
 * is counted as ever (`store-failed`) and the next lookup misses. Measured with
 * `bench/queue_bench.ts`, two alternations: the queued miss's added p50 over in process
 * 1.65–1.69× a bare BullMQ round trip awaited, 1.46× not.
 */
const WRITE_BEHIND = Object.freeze({ writeBehind: true });
const KNOWN_MISS = Object.freeze({ knownMiss: true, writeBehind: true });

/**
 * What a queued job's run is told: WRITE_BEHIND on a stall retry, else KNOWN_MISS; and the key
 * its server named, when its record holds one (the worker's cache uses it instead of deriving
 * the same key again, if its fingerprint agrees: named_run.ts).
 */
function runOptions(retried: boolean, named: NamedRun | null): NamedRunOptions {
  const options = retried ? WRITE_BEHIND : KNOWN_MISS;
  return named === null ? options : { ...options, [GIVEN_RUN]: named };
}

/** Job slots one BullMQ worker takes, at most, while the queue's cap on workers allows. */
const SLOTS_PER_TAKER = 8;
/** BullMQ workers one queue is taken by, at most: each holds a blocking connection. */
const MAX_TAKERS = 4;

/**
 * How a queue's `concurrency` slots are split between the BullMQ workers that take it: as evenly
 * as can be, 8 or fewer each while at most 4 workers do. A BullMQ worker fetches the next job for
 * a free slot one round trip at a time, each answered only once the event loop comes round
 * again, so with every slot's job busy on the CPU in turn (a queue worker runs its jobs' code in
 * its own thread) one worker lets its free slots wait while jobs wait in the queue, and idles
 * between turns. Measured with `bench/queue_cpu.ts` (32 callers, 32 slots, ~1 ms of CPU per job,
 * two alternations, rounds 2–3): one worker of 32 slots 546–553 misses/s, its event loop busy
 * 84–87 %; four of 8, 697–713 misses/s, busy 98 %. Two of 16 and eight of 4 measured ≈ 0.81× and
 * ≈ 0.86× bare BullMQ against 0.85× for four of 8.
 */
export function takerSlots(concurrency: number): number[] {
  const takers = Math.min(MAX_TAKERS, Math.ceil(concurrency / SLOTS_PER_TAKER));
  const each = Math.floor(concurrency / takers);
  return Array.from({ length: takers }, (_, i) => each + (i < concurrency % takers ? 1 : 0));
}

/**
 * Marks a claimed job finished, without waiting for Redis to answer: the command is written on
 * the connection BullMQ then writes the job's completion (or failure) on, and Redis runs one
 * connection's commands in order, so the claim reads finished before the job leaves the active
 * list — before any server sees the answer or a replay of the message can be added — at no round
 * trip of its own. (A failure was never the job's: the claim still expires after the deadline.)
 */
function finishBeforeAnswer(
  connection: CorkableClient,
  claimed: { finish(): Promise<void> },
): void {
  corkForTick(connection);
  claimed.finish().catch(() => {});
}

/** How often a stopping worker looks at its Redis connection. */
const UNREACHABLE_CHECK_MS = 250;

/**
 * Resolves `true` once `done` settles, or `false` once `connection` has not been ready for
 * `ms` in a row (ioredis' `status`: anything but `ready` means no command is answered).
 */
function untilOrUnreachable(
  done: Promise<unknown>,
  connection: { readonly status: string },
  ms: number,
): Promise<boolean> {
  return new Promise((resolve) => {
    let downSince: number | null = null;
    const check = setInterval(
      () => {
        if (connection.status === 'ready') {
          downSince = null;
          return;
        }
        const now = performance.now();
        downSince ??= now;
        if (now - downSince >= ms) finish(false);
      },
      Math.min(UNREACHABLE_CHECK_MS, ms),
    );
    const finish = (settled: boolean) => {
      clearInterval(check);
      resolve(settled);
    };
    done.then(
      () => finish(true),
      () => finish(true),
    );
  });
}

/** What a BullMQ job says of its time in the queue and its runs. */
function queued(bullJob: BullJob<unknown, string>): { waitedMs: number; retried: boolean } {
  const stalled = (bullJob as { stalledCounter?: unknown }).stalledCounter;
  return {
    waitedMs: Math.max(0, Date.now() - bullJob.timestamp),
    retried: typeof stalled === 'number' && stalled > 0,
  };
}
