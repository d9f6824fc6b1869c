/**
 * What a process opened, to be closed last-opened-first, once. As graphile-worker's releasers: a
 * second `release()` is the first one's promise (it never runs the steps again, nor forwards),
 * and a step pushed after release began is run at once (what opened it raced the stop) rather
 * than left open.
 */
export class ReleaseStack {
  readonly #steps: (() => Promise<unknown>)[] = [];
  #released: Promise<void> | null = null;

  /** Adds a clean-up step; it runs before every step pushed earlier. */
  push(step: () => Promise<unknown>): void {
    if (this.#released !== null) {
      void step().catch(() => {});
      return;
    }
    this.#steps.push(step);
  }

  /** Whether release has begun. */
  get released(): boolean {
    return this.#released !== null;
  }

  /**
   * Runs every step, last pushed first, each awaited before the next (a pool ends before the
   * embedded PostgreSQL under it stops). A step that fails does not stop the others. Calling it
   * again returns the first call's promise.
   */
  release(): Promise<void> {
    this.#released ??= (async () => {
      // Popped, not reversed in place: the list is consumed once, whatever calls it again.
      for (let step = this.#steps.pop(); step !== undefined; step = this.#steps.pop()) {
        await step().catch(() => {});
      }
    })();
    return this.#released;
  }
}
