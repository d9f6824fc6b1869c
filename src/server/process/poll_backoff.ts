/** Longest pause between two polls while Postgres does not answer (the backoff's cap). */
export const MAX_POLL_BACKOFF_MS = 15_000;

/**
 * The pause between a background poller's rounds: its period while its polls answer, doubled
 * per failure in a row while they do not (capped at {@link MAX_POLL_BACKOFF_MS}, or the period
 * if that is longer). A poller logs one warning per failed poll, hence one per backoff step,
 * and one info line on the first poll that answers again: an outage of Postgres costs a
 * handful of lines, not several a second.
 */
export class PollBackoff {
  readonly #periodMs: number;
  readonly #capMs: number;
  #failures = 0;

  /** @param capMs the longest pause. @default {@link MAX_POLL_BACKOFF_MS} */
  constructor(periodMs: number, capMs = MAX_POLL_BACKOFF_MS) {
    this.#periodMs = periodMs;
    this.#capMs = capMs;
  }

  /** Polls failed in a row (0 while they answer). */
  get failures(): number {
    return this.#failures;
  }

  /** The pause before the next poll. */
  get delayMs(): number {
    if (this.#failures === 0) return this.#periodMs;
    const cap = Math.max(this.#periodMs, this.#capMs);
    return Math.min(this.#periodMs * 2 ** this.#failures, cap);
  }

  /** A poll failed: one step further. */
  failed(): void {
    this.#failures++;
  }

  /** A poll answered: how many had failed in a row before it (0: nothing to report). */
  answered(): number {
    const failed = this.#failures;
    this.#failures = 0;
    return failed;
  }
}
