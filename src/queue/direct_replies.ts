import { randomBytes } from 'node:crypto';
import type { Logger } from '../logger.js';

/*
 * Direct replies: a worker's answer goes straight to the server that added the job, on a Redis
 * channel of that server's own, besides BullMQ's `completed` event. The event comes out of
 * BullMQ's completion script and the server's blocking read of the queue's event stream; the
 * reply is published before that script runs, on the same connection, so the server that waits
 * has its answer one script and one stream read sooner (measured: see CHANGELOG, 2026-12-07).
 *
 * It is only ever a shortcut. The event still carries the answer, for every server that joined
 * the job and whenever a reply is lost (Redis pub/sub delivers at most once: a subscriber
 * reconnecting misses what was published meanwhile). A reply is the same sealed bytes as the
 * event's, so it opens only for its queue id; one that does not open is dropped and the event
 * answers. An answer kept by reference (answer_refs.ts) is not replied: a reference published
 * by anyone could only make the server read a key the event would name anyway.
 */

/** What a server's subscriber connection needs (an ioredis client, single node or Cluster). */
export interface ReplySubscriber {
  subscribe(channel: string): Promise<unknown>;
  on(event: 'message', fn: (channel: string, message: string) => void): unknown;
  disconnect(): void;
  readonly status?: string;
}

/** What a worker's connection needs to send a reply. */
export interface ReplyPublisher {
  publish(channel: string, message: string): Promise<unknown>;
}

/** A server's reply id: what its records name, and the end of its channel's name. */
const REPLY_ID_RE = /^[A-Za-z0-9_-]{16,64}$/;

/** Whether `value` has a reply id's form (a record naming anything else is malformed). */
export function isReplyId(value: unknown): value is string {
  return typeof value === 'string' && REPLY_ID_RE.test(value);
}

/** The channel the server with reply id `id` reads, for queues of `prefix` and base name `base`. */
export function replyChannel(prefix: string, base: string, id: string): string {
  return `${prefix}:${base}:reply:${id}`;
}

/**
 * Sends `answer` (sealed) for the message with once-id `once` to the server whose channel is
 * `channel`, without waiting: a reply that fails is one the event replaces.
 */
export function sendReply(
  redis: ReplyPublisher,
  channel: string,
  once: string,
  answer: string,
): void {
  // A once-id has no space (isOnceId): the first space ends it.
  redis.publish(channel, `${once} ${answer}`).catch(() => {});
}

/**
 * Takes a reply when it is this run's: true if it was (the waiter is done), false to drop it and
 * keep waiting (a reply that does not open for the run: never a worker's).
 */
export type ReplyTaker = (answer: string) => boolean;

/** The server's end: one subscriber connection and the runs waiting on it, by once-id. */
export class DirectReplies {
  /** Named in the records of this server's jobs (sealed): where their workers reply. */
  readonly id = randomBytes(16).toString('base64url');
  readonly #channel: string;
  readonly #client: ReplySubscriber;
  readonly #waiting = new Map<string, ReplyTaker>();
  #subscribed = false;
  #closed = false;
  /** Settles once the first subscription is confirmed (or failed: then never used). */
  readonly started: Promise<void>;

  constructor(client: ReplySubscriber, prefix: string, base: string, logger: Logger) {
    this.#client = client;
    this.#channel = replyChannel(prefix, base, this.id);
    client.on('message', (channel, message) => {
      if (channel === this.#channel) this.#take(message);
    });
    // ioredis subscribes again by itself after a reconnect; a reply published while it was
    // away is lost, and the event answers that run (a little later).
    this.started = client.subscribe(this.#channel).then(
      () => {
        this.#subscribed = true;
      },
      (err: unknown) => {
        // E.g. an ACL without pub/sub: every run still works, a fraction of a ms slower.
        logger.warn(
          { err: (err as Error).message },
          "queued answers come by BullMQ's events alone: this server could not subscribe to its reply channel",
        );
      },
    );
  }

  /**
   * The reply id to seal into a record, or null when no reply could reach this server now (not
   * subscribed, or its connection is down): the worker then answers by the event alone.
   */
  get replyTo(): string | null {
    if (!this.#subscribed || this.#closed) return null;
    const status = this.#client.status;
    return status === undefined || status === 'ready' ? this.id : null;
  }

  /** Waits for the reply to the message with once-id `once` (until {@link forget}). */
  expect(once: string, take: ReplyTaker): void {
    this.#waiting.set(once, take);
  }

  forget(once: string): void {
    this.#waiting.delete(once);
  }

  /** Runs waiting now (a test's and a leak check's figure). */
  get waiting(): number {
    return this.#waiting.size;
  }

  close(): void {
    this.#closed = true;
    this.#waiting.clear();
    this.#client.disconnect();
  }

  #take(message: string): void {
    const space = message.indexOf(' ');
    if (space <= 0) return;
    const once = message.slice(0, space);
    const take = this.#waiting.get(once);
    // Unknown: a run already answered by its event, gave up, or never this server's.
    if (take === undefined) return;
    if (take(message.slice(space + 1))) this.#waiting.delete(once);
  }
}
