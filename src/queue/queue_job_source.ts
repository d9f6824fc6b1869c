import { type Job as BullJob, type ConnectionOptions, UnrecoverableError, Worker } from 'bullmq';
import { QueueJobRefusedError } from '../errors.js';
import type { Job } from '../job.js';
import { CLOSE_WAIT_MS, settleWithin } from '../util/settle_within.js';
import { type AnswerRedis, INLINE_ANSWER_MAX, keepAnswer } from './answer_refs.js';
import { type ReplyPublisher, replyChannel, sendReply } from './direct_replies.js';
import type { ClaimRedis } from './job_claims.js';
import { type ClaimedQueueJob, claimQueuedJob } from './queue_claim.js';
import {
  DEFAULT_GROUP,
  fleetKey,
  fleetMember,
  HEARTBEAT_TTL_MS,
  routedQueueName,
} from './queue_names.js';
import { type QueueTakerOptions, queueTaker } from './queue_taker.js';

/**
 * A job source's options: a taker's (`lockDuration` is how long a taken job's lock lives without
 * {@link HeldQueueJob.extend}: a holder that goes silent hands it back, and it is retried once).
 */
export type RawQueueJobSourceOptions = QueueTakerOptions;

/** A queued job taken by hand: verified, its record claimed, its lock held until it ends. */
export interface HeldQueueJob {
  /** The job as its record has it (the viewer is the record's). */
  readonly job: Job;
  /** Renews the lock for another lock duration; false when it was lost (the job went back). */
  extend(): Promise<boolean>;
  /**
   * Ends the job with its JSON, sealed to its queue id as a worker's answer is. Call it while
   * the lock is held (`extend()` answered true within the lock duration): the answer goes to
   * the waiting server ahead of BullMQ's completion, which alone checks the lock.
   */
  complete(json: Uint8Array): Promise<void>;
  /** Ends the job with a failure code (only the code reaches Redis). */
  fail(code: string): Promise<void>;
}

export interface QueueJobSource {
  /** Resolves once connected. */
  ready(): Promise<void>;
  /**
   * The next queued job of `workspace` and `group` (default `'default'`), within `waitMs`; null
   * when none came. It is read from that workspace's and group's queue alone, so no other
   * workspace's or group's job is ever met. A message that does not verify, or is a replay, is
   * refused (failed, E_QUEUE_JOB_REFUSED) exactly as a database worker refuses it. While takes
   * of a queue are open (and for a lock duration after the last take or renewal), this source
   * beats that queue's heartbeat, so servers see it taken.
   */
  next(
    workspace: string,
    waitMs: number,
    signal?: AbortSignal,
    group?: string,
  ): Promise<HeldQueueJob | null>;
  close(): Promise<void>;
}

/** One workspace/group queue, read by hand (opened on its first take). */
interface Lane {
  readonly place: { prefix: string; name: string };
  readonly member: string;
  readonly worker: Worker<unknown, string>;
  /** Reads are chained: BullMQ's worker blocks for one caller at a time. */
  turn: Promise<unknown>;
  /** Takes open now. */
  open: number;
  /** The last take, renewal or end (ms). */
  active: number;
  /** Whether its heartbeat is in the fleet set. */
  beating: boolean;
}

/**
 * Jobs of the queues taken one at a time by hand (a BullMQ worker per workspace/group queue
 * that does not run), for a holder that runs them elsewhere — the server, on behalf of agent
 * workers. The same check as a database worker (`claimQueuedJob`), the same sealed answer and
 * bare failure codes, and the same fault model: a job whose lock is not renewed returns to the
 * queue once, then fails (E_QUEUE_WORKER_LOST on the waiting server). It also runs the
 * stalled-job check of each queue it reads, so a queue fed to agents only still gets its lost
 * jobs back.
 */
export function createQueueJobSource(options: RawQueueJobSourceOptions): QueueJobSource {
  const { redis, keys, lockMs, prefix, name: base, logger, id } = queueTaker(options);
  let taken = 0;
  let closing = false;

  const connection = redis.duplicate() as ConnectionOptions & {
    on(event: 'error', fn: (err: Error) => void): void;
    disconnect(): void;
    zadd(key: string, score: number, member: string): Promise<unknown>;
    zrem(key: string, member: string): Promise<unknown>;
    ping(): Promise<unknown>;
  } & ClaimRedis &
    AnswerRedis &
    ReplyPublisher;
  connection.on('error', (err) => logger.debug({ err: err.message }, 'job source redis error'));

  const beatKey = fleetKey(prefix, base);
  const lanes = new Map<string, Lane>();
  const lane = (workspace: string, group: string): Lane => {
    const name = routedQueueName(base, workspace, group);
    let found = lanes.get(name);
    if (found !== undefined) return found;
    const worker = new Worker<unknown, string>(name, null, {
      connection,
      prefix,
      autorun: false,
      lockDuration: lockMs,
      stalledInterval: Math.max(1000, Math.floor(lockMs / 2)),
      maxStalledCount: 1,
      // A blocking read lasts at most a second: a take honours its wait to about that.
      drainDelay: 1,
    });
    worker.on('error', (err) => logger.debug({ err: err.message }, 'job source error'));
    // Lost jobs (a holder that went silent) come back even when no database worker runs.
    void worker.startStalledCheckTimer().catch(() => {});
    found = {
      place: { prefix, name },
      member: fleetMember(workspace, group, id),
      worker,
      turn: Promise.resolve(),
      open: 0,
      active: Date.now(),
      beating: false,
    };
    lanes.set(name, found);
    return found;
  };

  // A queue is taken while a take is open on it, or within a lock duration of its last take or
  // renewal (an agent holding a job renews it every third of that).
  const beat = (only?: Lane) => {
    const now = Date.now();
    for (const l of only === undefined ? lanes.values() : [only]) {
      if (l.open > 0 || now - l.active < lockMs) {
        l.beating = true;
        connection.zadd(beatKey, now, l.member).catch(() => {});
      } else if (l.beating) {
        l.beating = false;
        connection.zrem(beatKey, l.member).catch(() => {});
      }
    }
  };
  const beating = setInterval(beat, HEARTBEAT_TTL_MS / 3);
  beating.unref();

  const fetch = (
    l: Lane,
    token: string,
    signal: AbortSignal | undefined,
  ): Promise<BullJob<unknown, string> | undefined> => {
    // A take whose caller is gone by its turn does not start a blocking read.
    const read = l.turn.then(() =>
      closing || signal?.aborted === true ? undefined : l.worker.getNextJob(token, { block: true }),
    );
    l.turn = read.catch(() => {});
    return read;
  };

  const held = (
    l: Lane,
    bull: BullJob<unknown, string>,
    token: string,
    claimed: ClaimedQueueJob,
  ): HeldQueueJob => {
    const queueId = bull.id ?? '';
    let ended = false;
    const end = async (how: () => Promise<unknown>) => {
      if (ended) return;
      ended = true;
      l.active = Date.now();
      await claimed.finish().catch(() => {});
      await how();
    };
    return {
      job: claimed.job,
      async extend() {
        if (ended) return false;
        l.active = Date.now();
        return bull.extendLock(token, lockMs).then(
          (n) => n === 1,
          () => false,
        );
      },
      complete: (json) =>
        end(async () => {
          const sealed = keys.sealResult(queueId, json);
          // A large answer waits in Redis under a key of its own, as a worker's does.
          const answer =
            claimed.answersByRef && claimed.once !== null && sealed.length > INLINE_ANSWER_MAX
              ? await keepAnswer(connection, l.place, claimed.once, sealed)
              : sealed;
          // Straight to the server that waits, as a worker's (direct_replies.ts), when inline:
          // sent before the completion, in a write of its own (nothing corks this connection).
          if (claimed.replyTo !== null && claimed.once !== null && answer === sealed)
            sendReply(
              connection,
              replyChannel(prefix, base, claimed.replyTo),
              claimed.once,
              answer,
            );
          return bull.moveToCompleted(answer, token, false);
        }),
      fail: (code) => end(() => bull.moveToFailed(new UnrecoverableError(code), token, false)),
    };
  };

  return {
    async ready() {
      await connection.ping();
    },
    async next(workspace, waitMs, signal, group = DEFAULT_GROUP) {
      const l = lane(workspace, group);
      const until = Date.now() + waitMs;
      l.open++;
      l.active = Date.now();
      if (!l.beating) beat(l);
      try {
        do {
          const token = `${id}:${++taken}`;
          const bull = await fetch(l, token, signal);
          if (bull === undefined) continue;
          // Lost more often than allowed (BullMQ defers that failure to the next taker): failed,
          // and the waiting server answers E_QUEUE_WORKER_LOST.
          if (bull.deferredFailure) {
            await bull
              .moveToFailed(new UnrecoverableError(bull.deferredFailure), token, false)
              .catch(() => {});
            continue;
          }
          const claimed = await claimQueuedJob(keys, l.place, connection, bull);
          if (claimed === null) {
            await bull
              .moveToFailed(new UnrecoverableError(QueueJobRefusedError.code), token, false)
              .catch(() => {});
            continue;
          }
          return held(l, bull, token, claimed);
        } while (!closing && signal?.aborted !== true && Date.now() < until);
        return null;
      } finally {
        l.open--;
        l.active = Date.now();
      }
    },
    async close() {
      closing = true;
      clearInterval(beating);
      const stopping = new Set<Promise<unknown>>();
      for (const l of lanes.values()) {
        stopping.add(l.worker.close());
        if (l.beating) stopping.add(connection.zrem(beatKey, l.member));
      }
      await settleWithin(stopping, CLOSE_WAIT_MS);
      connection.disconnect();
    },
  };
}
