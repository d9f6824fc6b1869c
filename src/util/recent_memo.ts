/**
 * A bounded memo of recently used entries: two generations of at most `perGeneration` entries
 * each. A lookup reads the current generation, then the previous one (moving what it finds
 * there into the current one); when the current one is full it becomes the previous one and
 * the oldest generation is dropped whole. So it never holds more than `2 × perGeneration`
 * entries, and an entry used at least once per `perGeneration` insertions is never dropped.
 *
 * Cheaper on a hit than `lru-cache` (one `Map.get`, no recency list, no options object): on the
 * result cache's key path, where every hit looks up its key input here, lru-cache's `get` was
 * the largest self-time frame of an in-memory hit.
 */
export class RecentMemo<K, V> {
  readonly #perGeneration: number;
  #current = new Map<K, V>();
  #previous = new Map<K, V>();

  constructor(perGeneration: number) {
    if (!Number.isInteger(perGeneration) || perGeneration < 1) {
      throw new RangeError('perGeneration must be a positive integer');
    }
    this.#perGeneration = perGeneration;
  }

  get(key: K): V | undefined {
    const found = this.#current.get(key);
    if (found !== undefined) return found;
    const old = this.#previous.get(key);
    if (old !== undefined) {
      this.#previous.delete(key);
      this.set(key, old);
    }
    return old;
  }

  set(key: K, value: V): void {
    if (this.#current.size >= this.#perGeneration && !this.#current.has(key)) {
      this.#previous = this.#current;
      this.#current = new Map();
    }
    this.#current.set(key, value);
  }

  /** Entries held, both generations. */
  get size(): number {
    return this.#current.size + this.#previous.size;
  }
}
