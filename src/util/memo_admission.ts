/**
 * Whether a key the memos just missed is kept in them: every one while at least half of their
 * lookups find their key, else one in {@link SAMPLE}.
 *
 * Keeping a key is the dear part of a memo (the parts memo copies a run's args, encodes the
 * copy again to check it, and both memos insert into maps whose generations then die in the old
 * space). When the lookups cycle through more keys than the memos hold, nearly every one misses,
 * is kept, and is dropped before it is looked up again: all cost, no hit. Measured on the
 * in-process hit of `bench/memory_scaling.ts` cycling through 10 k and 100 k distinct runs:
 * 12.3 and 13.4 µs per hit keeping every miss, 5.0 and 5.9 µs keeping none (13 mark-compacts
 * against 2 over the same hits), 7.4–7.7 µs keeping one in 64 (one in 16: 8.0–9.2; one in 256:
 * 7.1–7.2, but four times slower to fill again once the runs in use fit).
 *
 * Sampled, the memos still take in keys that come back often (each miss is a chance), so a
 * skewed load keeps its hot keys; and once the keys in use fit again, the sampled memos find
 * most of them within a few windows and every miss is kept again.
 */
export class MemoAdmission {
  readonly #window: number;
  #lookups = 0;
  #found = 0;
  #sampling = false;
  #passed = 0;
  #kept = 0;

  /** `window`: lookups per decision (the memos' generation size is a fair choice). */
  constructor(window: number) {
    if (!Number.isInteger(window) || window < 1) {
      throw new RangeError('window must be a positive integer');
    }
    this.#window = window;
  }

  /** One lookup of the memos; `found`: whether it found its key. */
  looked(found: boolean): void {
    if (found) this.#found++;
    if (++this.#lookups < this.#window) return;
    // Under half the window found: the memos are churning, sample what they keep.
    this.#sampling = this.#found * 2 < this.#lookups;
    this.#lookups = 0;
    this.#found = 0;
  }

  /** Whether the key just missed is to be kept. */
  admits(): boolean {
    if (this.#sampling) {
      if (++this.#passed < SAMPLE) return false;
      this.#passed = 0;
    }
    this.#kept++;
    return true;
  }

  /** Whether misses are being sampled now. */
  get sampling(): boolean {
    return this.#sampling;
  }

  /** Misses admitted so far. */
  get kept(): number {
    return this.#kept;
  }
}

/** While sampling, one miss in this many is kept. */
const SAMPLE = 64;
