import { isOnceId, type QueuePlace } from './sealed_job.js';

/**
 * Large answers travel by reference. A worker's answer goes to the waiting servers in BullMQ's
 * `completed` event, and BullMQ keeps the queue's event stream at ≈ 10 000 events: inline, each
 * queue would hold the answers of its last ≈ 3 000 jobs however old (250 MB for results of 61
 * KiB, measured), and BullMQ serialises every return value twice (≈ 0.27 ms each for such an
 * answer here). So an answer longer than {@link INLINE_ANSWER_MAX} (sealed, in base64
 * characters) is written under a key of its own that lives {@link ANSWER_TTL_MS}, and the event
 * carries `@<once-id>` (base64 has no `@`). Every server waiting on the job — the one that added
 * it and any that joined it — reads the key when the event arrives; nothing deletes it early, so
 * none misses it. A worker does this only when the record says its server reads references
 * (servers of earlier versions do not); the answer is sealed to its queue id as before, so a
 * reference edited to name another run's answer opens nowhere.
 */
export const INLINE_ANSWER_MAX = 16 * 1024;

/**
 * How long an answer's key lives: the waiting servers read it as the event arrives, so this is
 * how far a server's event reader may lag (BullMQ's stream allows ≈ 10 000 events: ≈ 3 s at 1 000
 * jobs a second). What Redis holds is this long's worth of large answers: measured at 460
 * answers of 61 KiB a second, 10 s held 300 MB, more than the 254 MB the stream held inline.
 */
export const ANSWER_TTL_MS = 5_000;

const MARK = '@';

/** Where the answer of the message with once-id `once` is kept. */
export function answerKey(place: QueuePlace, once: string): string {
  return `${place.prefix}:${place.name}:answer:${once}`;
}

/** What the `completed` event carries for an answer kept under {@link answerKey}. */
export function answerRef(once: string): string {
  return `${MARK}${once}`;
}

/**
 * The once-id an event's return value refers to; `null` for an answer carried inline; `false`
 * for a reference that names no once-id (never a worker's: a Redis writer's).
 */
export function referredOnce(returned: unknown): string | null | false {
  if (typeof returned !== 'string' || !returned.startsWith(MARK)) return null;
  const once = returned.slice(MARK.length);
  return isOnceId(once) ? once : false;
}

/** What keeping an answer needs of a worker's connection (an ioredis client). */
export interface AnswerRedis {
  set(key: string, value: string, px: 'PX', ms: number): Promise<'OK' | null>;
}

/** How long a worker waits for Redis to take an answer before sending it inline instead. */
const KEEP_TIMEOUT_MS = 2000;

/**
 * Keeps a sealed answer under its key and returns the reference to send in its place — or the
 * answer itself when Redis did not take it in time, which every server reads.
 */
export async function keepAnswer(
  redis: AnswerRedis,
  place: QueuePlace,
  once: string,
  sealed: string,
): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const kept = await Promise.race([
      redis.set(answerKey(place, once), sealed, 'PX', ANSWER_TTL_MS),
      new Promise<null>((resolve) => {
        timer = setTimeout(() => resolve(null), KEEP_TIMEOUT_MS);
      }),
    ]);
    return kept === 'OK' ? answerRef(once) : sealed;
  } catch {
    return sealed;
  } finally {
    clearTimeout(timer);
  }
}
