import type { Job as BullJob } from 'bullmq';
import type pg from 'pg';
import { coerceError } from '../errors.js';
import type { Job } from '../job.js';
import { claimJobRecord } from './job_records.js';
import { isQueueMessage, type QueueMessage } from './queue_names.js';
import type { QueueKeys } from './queue_seal.js';

/** A queue message that verified, and the job its record holds (viewer included). */
export interface ClaimedQueueJob {
  readonly message: QueueMessage;
  readonly job: Job;
}

/**
 * The check every kind of worker makes before running a queued job (a database worker, and a
 * server taking one for an agent): the message is exactly `{ workspace, jobId, queueId, mac }`,
 * its queue id is the BullMQ job's, its MAC verifies under the secret, and its Postgres record
 * can be claimed (exists, same workspace, not finished, within its deadline, retried at most
 * once). The job — viewer included — comes from that record alone. null: refuse it.
 */
export async function claimQueuedJob(
  keys: QueueKeys,
  pool: pg.Pool,
  bullJob: BullJob<unknown, string>,
): Promise<ClaimedQueueJob | null> {
  const data = bullJob.data;
  if (!isQueueMessage(data) || data.queueId !== bullJob.id || !keys.verify(data)) return null;
  const job = await claimJobRecord(pool, data.workspace, data.jobId).catch(() => null);
  return job === null ? null : { message: data, job };
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
