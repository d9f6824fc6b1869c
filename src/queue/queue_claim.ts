import type { Job as BullJob } from 'bullmq';
import { coerceError } from '../errors.js';
import type { Job } from '../job.js';
import type { NamedRun } from '../named_run.js';
import { type ClaimRedis, claimJob, claimKey, finishJob, markJobDone } from './job_claims.js';
import { isQueueMessage, type QueueMessage } from './queue_names.js';
import type { QueueKeys } from './queue_seal.js';
import { type OpenedRecord, openJobRecord, type QueuePlace } from './sealed_job.js';

/** A queue message that opened, and the job its record holds (viewer included). */
export interface ClaimedQueueJob {
  readonly message: QueueMessage;
  readonly job: Job;
  /** The server's trace context for the run (W3C `traceparent`), sealed with the job; or null. */
  readonly traceparent: string | null;
  /** Where the job's child runs over HTTP go (the enqueuing server's address, sealed); or null. */
  readonly childUrl: string | null;
  /** The key the server's cache named for the run (sealed), or null: named_run.ts. */
  readonly named: NamedRun | null;
  /** The message's once-id (sealed), or null: a server of an earlier version. */
  readonly once: string | null;
  /** The server reads a large answer by reference (answer_refs.ts). */
  readonly answersByRef: boolean;
  /** The server's reply id: answer on its channel too (direct_replies.ts); or null. */
  readonly replyTo: string | null;
  /** Marks the job finished (its message is refused from now on): before answering. */
  finish(): Promise<void>;
}

/**
 * The check every kind of worker makes before running a queued job (a database worker, and a
 * server taking one for an agent): the message is exactly `{ workspace, queueId, deadline,
 * record }`, its queue id is the BullMQ job's, its deadline has not passed, its record opens
 * under the secret bound to all of those and to this queue, and it is no replay. The job —
 * viewer included — comes from that sealed record alone. null: refuse it.
 *
 * No replay: a server of this version adds each job under a deduplication id of its own, its
 * once-id, sealed in the record too, with a TTL past the deadline. BullMQ adds no job under a
 * deduplication id whose key lives (whatever other deduplication options the add asks for),
 * and none under a job id that is still there (queued, running); the worker runs a job only
 * when the id it was added under is its record's. So a message put back after its job ended —
 * under its own id: not added; without it or under another: refused here — runs nothing until
 * past its deadline, when the message itself is refused; and the check costs the worker no
 * round trip (the claim below cost one before every run). A job whose worker was lost runs once
 * more, as BullMQ's stall check allows (`maxStalledCount: 1`). A record naming no once-id (a
 * server of an earlier version) takes a one-time claim instead (job_claims.ts).
 */
export async function claimQueuedJob(
  keys: QueueKeys,
  place: QueuePlace,
  redis: ClaimRedis,
  bullJob: BullJob<unknown, string>,
): Promise<ClaimedQueueJob | null> {
  const data = bullJob.data;
  if (!isQueueMessage(data) || data.queueId !== bullJob.id || data.deadline <= Date.now())
    return null;
  let opened: OpenedRecord | null;
  try {
    opened = openJobRecord(keys, place, data);
  } catch {
    opened = null;
  }
  if (opened === null) return null;
  const key = claimKey(place.prefix, place.name, opened.job.id);
  if (opened.once !== null) {
    if (bullJob.opts.deduplication?.id !== opened.once) return null;
    // Finished, its claim is marked too: a worker of an earlier version refuses it as well.
    return { message: data, ...opened, finish: () => markJobDone(redis, key, data.deadline) };
  }
  if (!(await claimJob(redis, key, data.deadline).catch(() => false))) return null;
  return { message: data, ...opened, finish: () => finishJob(redis, key) };
}

/** The code a failure travels as: ours, or E_EXECUTOR_FAILED (Redis keeps reasons in clear). */
export function queueFailureCode(thrown: unknown): string {
  const err = coerceError(thrown) as Error & { code?: unknown; sqlstate?: unknown };
  if (typeof err.code !== 'string' || !/^E_[A-Z_]+$/.test(err.code)) return 'E_EXECUTOR_FAILED';
  // A refused statement keeps its SQLSTATE (a code, never data): `E_QUERY_FAILED:42501`.
  return typeof err.sqlstate === 'string' && /^[0-9A-Z]{5}$/.test(err.sqlstate)
    ? `${err.code}:${err.sqlstate}`
    : err.code;
}
