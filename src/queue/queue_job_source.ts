import { type Job as BullJob, type ConnectionOptions, UnrecoverableError, Worker } from 'bullmq';
import { QueueJobRefusedError } from '../errors.js';
import type { Job } from '../job.js';
import { CLOSE_WAIT_MS, settleWithin } from '../util/settle_within.js';
import type { ClaimRedis } from './job_claims.js';
import { type ClaimedQueueJob, claimQueuedJob } from './queue_claim.js';
import { isQueueMessage } from './queue_names.js';
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
  /** Ends the job with its JSON, sealed to its queue id as a worker's answer is. */
  complete(json: Uint8Array): Promise<void>;
  /** Ends the job with a failure code (only the code reaches Redis). */
  fail(code: string): Promise<void>;
}

export interface QueueJobSource {
  /** Resolves once connected. */
  ready(): Promise<void>;
  /**
   * The next queued job of `workspace`, within `waitMs`; null when none came. A message that
   * does not verify, or whose record cannot be claimed, is refused (failed, E_QUEUE_JOB_REFUSED)
   * exactly as a database worker refuses it; one of another workspace is handed back untouched.
   */
  next(workspace: string, waitMs: number, signal?: AbortSignal): Promise<HeldQueueJob | null>;
  close(): Promise<void>;
}

/**
 * Jobs of the queue taken one at a time by hand (a BullMQ worker that does not run), for a
 * holder that runs them elsewhere — the server, on behalf of an agent worker. The same check as
 * a database worker (`claimQueuedJob`), the same sealed answer and bare failure codes, and the
 * same fault model: a job whose lock is not renewed returns to the queue once, then fails
 * (E_QUEUE_WORKER_LOST on the waiting server). It also runs the stalled-job check, so a queue
 * fed to agents only still gets its lost jobs back.
 */
export function createQueueJobSource(options: RawQueueJobSourceOptions): QueueJobSource {
  const { redis, keys, lockMs, prefix, name, logger, id } = queueTaker(options);
  const place = { prefix, name };
  let taken = 0;
  let closing = false;

  const connection = redis.duplicate() as ConnectionOptions & {
    on(event: 'error', fn: (err: Error) => void): void;
    disconnect(): void;
  } & ClaimRedis;
  connection.on('error', (err) => logger.debug({ err: err.message }, 'job source redis error'));
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

  // BullMQ's worker blocks for one caller at a time (a second concurrent read does not block):
  // reads are chained, so concurrent takes wait their turn instead of spinning.
  let turn: Promise<unknown> = Promise.resolve();
  const fetch = (
    token: string,
    signal: AbortSignal | undefined,
  ): Promise<BullJob<unknown, string> | undefined> => {
    // A take whose caller is gone by its turn does not start a blocking read.
    const read = turn.then(() =>
      closing || signal?.aborted === true ? undefined : worker.getNextJob(token, { block: true }),
    );
    turn = read.catch(() => {});
    return read;
  };

  const held = (
    bull: BullJob<unknown, string>,
    token: string,
    claimed: ClaimedQueueJob,
  ): HeldQueueJob => {
    const queueId = bull.id ?? '';
    let ended = false;
    const end = async (how: () => Promise<unknown>) => {
      if (ended) return;
      ended = true;
      await claimed.finish().catch(() => {});
      await how();
    };
    return {
      job: claimed.job,
      async extend() {
        if (ended) return false;
        return bull.extendLock(token, lockMs).then(
          (n) => n === 1,
          () => false,
        );
      },
      complete: (json) =>
        end(() => bull.moveToCompleted(keys.sealResult(queueId, json), token, false)),
      fail: (code) => end(() => bull.moveToFailed(new UnrecoverableError(code), token, false)),
    };
  };

  return {
    async ready() {
      await worker.waitUntilReady();
    },
    async next(workspace, waitMs, signal) {
      const until = Date.now() + waitMs;
      do {
        const token = `${id}:${++taken}`;
        const bull = await fetch(token, signal);
        if (bull === undefined) continue;
        // Lost more often than allowed (BullMQ defers that failure to the next taker): failed,
        // and the waiting server answers E_QUEUE_WORKER_LOST.
        if (bull.deferredFailure) {
          await bull
            .moveToFailed(new UnrecoverableError(bull.deferredFailure), token, false)
            .catch(() => {});
          continue;
        }
        // Another workspace's job (checked before its record is claimed): back to the queue.
        if (isQueueMessage(bull.data) && bull.data.workspace !== workspace) {
          await bull.moveToWait(token).catch(() => {});
          return null;
        }
        const claimed = await claimQueuedJob(keys, place, connection, bull);
        if (claimed === null) {
          await bull
            .moveToFailed(new UnrecoverableError(QueueJobRefusedError.code), token, false)
            .catch(() => {});
          continue;
        }
        return held(bull, token, claimed);
      } while (!closing && signal?.aborted !== true && Date.now() < until);
      return null;
    },
    async close() {
      closing = true;
      await settleWithin(new Set([worker.close()]), CLOSE_WAIT_MS);
      connection.disconnect();
    },
  };
}
