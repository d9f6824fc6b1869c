/**
 * An abort whose `AbortSignal` is made only when someone asks for it. On Node 20 making a
 * signal costs ≈ 3 µs (`new AbortController().signal`, measured here), and most runs never read
 * theirs: a TypeScript runnable that ignores `ctx.signal`, every SQL runnable. The run still
 * knows whether it was aborted, and a signal asked for after the abort comes already aborted.
 */
export class LazyAbort {
  #controller: AbortController | undefined;
  #aborted = false;

  get aborted(): boolean {
    return this.#aborted;
  }

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.#aborted) this.#controller.abort();
    }
    return this.#controller.signal;
  }

  abort(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#controller?.abort();
  }
}
