/**
 * The one-time claim of a queued job, kept in Redis beside the queue: the replay guard of the
 * jobs of servers of an earlier version (a record that names no once-id, sealed_job.ts), and
 * the mark every finished job leaves for the workers of an earlier version. BullMQ's job-id
 * uniqueness and its lock already keep one message from running twice at once; what is left is
 * a message put back after its job ended. So:
 *
 * | state of `…:claim:<job id>` | a take |
 * |---|---|
 * | absent | claims it (`SET NX`, expiring after the deadline): runs |
 * | 1 (claimed, its worker lost) | `INCR` → 2: runs once more, as the record says (a stall retry) |
 * | ≥ 2, or {@link DONE} | refused |
 *
 * A finished job is marked {@link DONE} before its answer is handed back, so a replay of its
 * message is refused until the deadline, after which the message itself is refused. One command
 * on a first take, one at the end; no Postgres round trip. The key carries only the job id (a
 * random UUID): nothing about the viewer, args or runnable.
 */

/** The claim count a finished job is set to: far above any allowed take. */
const DONE = 1_000_000;

/**
 * How long a claim (or a job's deduplication key, queue_claim.ts) outlives its deadline: a
 * worker whose clock lags Redis' still sees it.
 */
export const CLAIM_MARGIN_MS = 300_000;

/** The Redis commands a claim needs (ioredis `Redis` or `Cluster`). */
export interface ClaimRedis {
  set(key: string, value: number, px: 'PXAT', at: number, nx: 'NX'): Promise<'OK' | null>;
  set(key: string, value: number, xx: 'XX', keep: 'KEEPTTL'): Promise<'OK' | null>;
  set(key: string, value: number, px: 'PXAT', at: number): Promise<'OK' | null>;
  incr(key: string): Promise<number>;
}

export function claimKey(prefix: string, name: string, jobId: string): string {
  return `${prefix}:${name}:claim:${jobId}`;
}

/** Takes the claim: true for a first take or one stall retry, false for anything after. */
export async function claimJob(redis: ClaimRedis, key: string, deadline: number): Promise<boolean> {
  if ((await redis.set(key, 1, 'PXAT', deadline + CLAIM_MARGIN_MS, 'NX')) === 'OK') return true;
  return (await redis.incr(key)) <= 2;
}

/** Marks the job finished: its message is refused from now on. */
export async function finishJob(redis: ClaimRedis, key: string): Promise<void> {
  await redis.set(key, DONE, 'XX', 'KEEPTTL');
}

/**
 * Marks finished a job that took no claim (its message is guarded by BullMQ's deduplication):
 * a worker of an earlier version, which knows only claims, refuses its message from now on.
 */
export async function markJobDone(redis: ClaimRedis, key: string, deadline: number): Promise<void> {
  await redis.set(key, DONE, 'PXAT', deadline + CLAIM_MARGIN_MS);
}
