/** A millisecond clock that only moves when a test says so. Starts far from 0 on purpose. */
export class ManualClock {
  #t: number;

  constructor(start = 1_700_000_000_000) {
    this.#t = start;
  }

  /** Pass this as a `now` option. */
  readonly now = (): number => this.#t;

  advance(ms: number): void {
    this.#t += ms;
  }
}
