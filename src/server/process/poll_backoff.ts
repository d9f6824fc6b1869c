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

/** What a {@link BackoffPoller} runs and whom it tells. */
export interface BackoffPollerOptions {
  /** The pause between rounds while polls answer. */
  readonly periodMs: number;
  /** One round; a rejection is a failed poll (reported, then retried after a longer pause). */
  readonly poll: () => Promise<void>;
  /** A poll failed: called once per failure, hence once per backoff step. */
  readonly failed: (err: unknown, state: { failedPolls: number; retryInMs: number }) => void;
  /** The first poll that answered after `failedPolls` failures in a row. */
  readonly answeredAgain: (failedPolls: number) => void;
}

/**
 * A background poller on a {@link PollBackoff}: one round at a time (a round that would start
 * while one runs is skipped), its timer unref'd (it never holds the process up), stopped for
 * good by `stop()`.
 */
export class BackoffPoller {
  readonly #options: BackoffPollerOptions;
  readonly #backoff: PollBackoff;
  #timer: NodeJS.Timeout | undefined;
  #polling = false;
  #stopped = false;

  constructor(options: BackoffPollerOptions) {
    this.#options = options;
    this.#backoff = new PollBackoff(options.periodMs);
  }

  /** Starts the rounds: the first now (`pollFirst`, awaited) or after one period. */
  async start(options: { pollFirst?: boolean } = {}): Promise<void> {
    this.#stopped = false;
    if (options.pollFirst !== false) await this.pollNow();
    this.#next();
  }

  /** Stops the rounds; one already running finishes, and nothing is scheduled after it. */
  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
  }

  /** One round now (nothing if one is running); its failure is reported, never thrown. */
  async pollNow(): Promise<void> {
    if (this.#polling) return;
    this.#polling = true;
    try {
      await this.#options.poll();
      const failedPolls = this.#backoff.answered();
      if (failedPolls > 0) this.#options.answeredAgain(failedPolls);
    } catch (err) {
      this.#backoff.failed();
      const { failures: failedPolls, delayMs: retryInMs } = this.#backoff;
      this.#options.failed(err, { failedPolls, retryInMs });
    } finally {
      this.#polling = false;
    }
  }

  #next(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      void this.pollNow().then(() => this.#next());
    }, this.#backoff.delayMs);
    this.#timer.unref();
  }
}
