import { coerceError } from '../errors.js';
import type { Logger } from '../logger.js';

/**
 * The result cache's store circuit breaker. After a store failure the store is skipped ("rests")
 * for `restMs`, so that a Redis outage costs runs nothing but their uncached execution instead
 * of a timeout each. A burst of failures is logged once, its end once with the count.
 */
export class StoreBreaker {
  readonly #restMs: number;
  readonly #logger: Logger;
  readonly #now: () => number;
  /** Until when the store is skipped (clock ms). */
  #restingUntil = 0;
  /** Failures in the current burst; the first is logged, the rest summed on recovery. */
  #burstFailures = 0;

  constructor(restMs: number, logger: Logger, now: () => number) {
    this.#restMs = restMs;
    this.#logger = logger;
    this.#now = now;
  }

  /** Whether the store is to be skipped right now. */
  get resting(): boolean {
    return this.#now() < this.#restingUntil;
  }

  /** {@link resting} at a clock reading the caller already made. */
  restingAt(now: number): boolean {
    return now < this.#restingUntil;
  }

  /** Records a failure: starts (or extends) the rest, logs the first of a burst. */
  failed(op: 'get' | 'set', thrown: unknown): { code: string; message: string } {
    if (this.#restMs > 0) this.#restingUntil = this.#now() + this.#restMs;
    const summary = summarize(thrown);
    if (this.#burstFailures++ === 0) {
      this.#logger.warn(
        { op, code: summary.code, reason: summary.message, restMs: this.#restMs },
        'cache store failed; running uncached until it answers again',
      );
    }
    return summary;
  }

  /** Records an answer from the store; ends a burst if one is under way. */
  answered(): void {
    if (this.#burstFailures === 0) return;
    this.#logger.info({ failures: this.#burstFailures }, 'cache store answering again');
    this.#burstFailures = 0;
  }
}

/**
 * Code and message only: store errors can carry the command (key and value) in other fields,
 * and those must not reach a log line.
 */
export function summarize(thrown: unknown): { code: string; message: string } {
  const err = coerceError(thrown) as Error & { code?: unknown };
  const code = typeof err.code === 'string' ? err.code : 'E_UNKNOWN';
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : '';
  return { code, message: err.message + cause };
}
