import { randomBytes } from 'node:crypto';
import { InvalidJobError } from '../errors.js';
import type { Job, RunOrigin } from '../job.js';
import { type NamedRun, namedRunOf } from '../named_run.js';
import { isReplyId } from './direct_replies.js';
import { permsFromJson } from './job_records.js';
import type { QueueMessage } from './queue_names.js';
import type { QueueKeys } from './queue_seal.js';

/** Where a message belongs: the queue it was put on (a copy moved to another opens nowhere). */
export interface QueuePlace {
  readonly prefix: string;
  readonly name: string;
}

/**
 * The job record, sealed into the queue message (server side, at run start): perms with the
 * viewer, origin, args, runnable — AES-256-GCM under the deployment secret's record key. The
 * associated data binds it to its queue, workspace, BullMQ job id and deadline, so a message
 * whose clear fields were edited, or that was copied under another job id or queue, opens
 * nowhere. Args and perms travel as the JSON text the server wrote (the worker must see exactly
 * what the key was built from).
 */
export function sealJob(
  keys: QueueKeys,
  place: QueuePlace,
  job: Job,
  origin: RunOrigin['kind'] | 'unknown',
  queueId: string,
  deadline: number,
  traceparent: string | null = null,
  childUrl: string | null = null,
  named: NamedRun | null = null,
  once: string | null = null,
  /** This server reads large answers by reference (answer_refs.ts); earlier versions do not. */
  answersByRef = false,
  /** The server's reply id: its worker also answers on that channel (direct_replies.ts). */
  replyTo: string | null = null,
): QueueMessage {
  if (once !== null && !ONCE_RE.test(once)) throw new TypeError('once must be a once-id');
  if (replyTo !== null && !isReplyId(replyTo)) throw new TypeError('replyTo must be a reply id');
  const fields: unknown[] = [
    job.id,
    job.runnable.path,
    job.runnable.hash,
    JSON.stringify(job.args),
    JSON.stringify(job.perms),
    // The key the server's cache named for this run, beside the origin: in the one slot every
    // worker version skips, so a worker of an earlier version opens the record as before (it
    // refuses a record with more fields) and one of this version uses it (named_run.ts). So
    // does the message's once-id: the deduplication id its job was added under (queue_claim.ts);
    // and whether the server reads a large answer by reference (answer_refs.ts), and where
    // it takes a direct reply (direct_replies.ts).
    named === null && once === null && !answersByRef && replyTo === null
      ? origin
      : {
          origin,
          ...(named === null ? {} : { digest: named.digest, fingerprint: named.fingerprint }),
          ...(once === null ? {} : { once }),
          ...(answersByRef ? { byRef: 1 } : {}),
          ...(replyTo === null ? {} : { reply: replyTo }),
        },
    job.cacheTtlS ?? null,
    traceparent,
  ];
  // Where the job's child runs over HTTP go (the server's advertised address): sealed, so a
  // Redis writer cannot send a worker's live job token to a host of its choosing.
  if (childUrl !== null) fields.push(childUrl);
  const record = JSON.stringify(fields);
  const bound = boundTo(place, job.workspace, queueId, deadline);
  return { workspace: job.workspace, queueId, deadline, record: keys.sealRecord(bound, record) };
}

/**
 * The job a message's record holds, or null when it does not open (forged, edited, another
 * deployment's secret, moved to another queue or job id). Past its deadline is the caller's to
 * check (a clock). A record that opens but is malformed fails closed (E_INVALID_JOB).
 */
export function openJob(keys: QueueKeys, place: QueuePlace, message: QueueMessage): Job | null {
  return openJobRecord(keys, place, message)?.job ?? null;
}

/**
 * {@link openJob}, with the trace context the server sealed beside the job (W3C `traceparent`,
 * when the server was traced): inside the record, so a forged message cannot graft a trace; and
 * the address the job's child runs over HTTP go to (null when the server sealed none).
 */
export function openJobRecord(
  keys: QueueKeys,
  place: QueuePlace,
  message: QueueMessage,
): OpenedRecord | null {
  const bound = boundTo(place, message.workspace, message.queueId, message.deadline);
  const text = keys.openRecord(bound, message.record);
  if (text === null) return null;
  const fields = JSON.parse(text) as unknown;
  if (!Array.isArray(fields) || fields.length < 7 || fields.length > 9)
    throw new InvalidJobError('malformed record');
  const [id, path, hash, args, perms, origin, cacheTtlS, traceparent = null, childUrl = null] =
    fields as [unknown, unknown, unknown, unknown, unknown, unknown, unknown, unknown?, unknown?];
  if (childUrl !== null && !isHttpUrl(childUrl)) throw new InvalidJobError('malformed record');
  if (traceparent !== null && (typeof traceparent !== 'string' || traceparent.length > 256))
    throw new InvalidJobError('malformed record');
  if (typeof id !== 'string' || typeof path !== 'string' || typeof hash !== 'string')
    throw new InvalidJobError('malformed record');
  if (typeof args !== 'string' || typeof perms !== 'string')
    throw new InvalidJobError('malformed record');
  if (cacheTtlS !== null && typeof cacheTtlS !== 'number')
    throw new InvalidJobError('malformed record');
  const job: Job = Object.freeze({
    id,
    workspace: message.workspace,
    runnable: Object.freeze({ path, hash }),
    args: JSON.parse(args) as Record<string, unknown>,
    perms: permsFromJson(perms),
    ...(cacheTtlS === null ? {} : { cacheTtlS }),
  });
  // A server of an earlier version wrote the origin alone: the worker derives the key itself,
  // and takes the job's claim (queue_claim.ts).
  const once = (origin as { once?: unknown } | null)?.once;
  if (once !== undefined && (typeof once !== 'string' || !ONCE_RE.test(once)))
    throw new InvalidJobError('malformed record');
  const byRef = (origin as { byRef?: unknown } | null)?.byRef;
  if (byRef !== undefined && byRef !== 1) throw new InvalidJobError('malformed record');
  // A reply goes to the server's channel with the once-id: a record with one needs the other.
  const reply = (origin as { reply?: unknown } | null)?.reply;
  if (reply !== undefined && (!isReplyId(reply) || once === undefined))
    throw new InvalidJobError('malformed record');
  return {
    job,
    traceparent,
    childUrl,
    named: namedRunOf(origin),
    once: once ?? null,
    answersByRef: byRef === 1,
    replyTo: reply ?? null,
  };
}

/** A once-id: what a server's {@link OnceIds} makes (and room to change how). */
const ONCE_RE = /^[A-Za-z0-9_.-]{8,80}$/;

/** Whether `value` has a once-id's form. */
export function isOnceId(value: string): boolean {
  return ONCE_RE.test(value);
}

/**
 * The once-ids of one process: a random prefix and a counter, so no two messages share one
 * (a replay needs its own message's, which BullMQ keeps refusing until past the deadline). Not
 * a secret: it is in the job's options in clear, as its deduplication id.
 */
export class OnceIds {
  readonly #prefix = randomBytes(9).toString('base64url');
  #n = 0;
  next(): string {
    this.#n += 1;
    return `${this.#prefix}.${this.#n.toString(36)}`;
  }
}

/** What a record holds besides the job. */
export interface OpenedRecord {
  readonly job: Job;
  /** The server's trace context (W3C `traceparent`), or null. */
  readonly traceparent: string | null;
  /** Where the job's child runs over HTTP go (the server's advertised address), or null. */
  readonly childUrl: string | null;
  /** The key the server's cache named for the run, or null (named_run.ts). */
  readonly named: NamedRun | null;
  /**
   * The deduplication id the server added the job under (its replay guard, queue_claim.ts), or
   * null: a server of an earlier version, whose jobs are guarded by a claim.
   */
  readonly once: string | null;
  /** The server reads a large answer by reference (answer_refs.ts): earlier versions do not. */
  readonly answersByRef: boolean;
  /** The server's reply id (direct_replies.ts), or null: it waits on the event alone. */
  readonly replyTo: string | null;
}

function isHttpUrl(value: unknown): value is string {
  if (typeof value !== 'string' || value.length > 2048) return false;
  try {
    const url = new URL(value);
    return url.protocol === 'http:' || url.protocol === 'https:';
  } catch {
    return false;
  }
}

/** The associated data: an array, so no two different places share one encoding. */
function boundTo(place: QueuePlace, workspace: string, queueId: string, deadline: number): string {
  return JSON.stringify(['job record v1', place.prefix, place.name, workspace, queueId, deadline]);
}
