/**
 * At most one execution per key at a time; callers that find one in flight await it instead of
 * starting another. The key must be the *full* cache key: two viewers never share a flight.
 */
export class SingleFlight<T> {
  readonly #flights = new Map<string, Promise<T>>();

  get size(): number {
    return this.#flights.size;
  }

  get(key: string): Promise<T> | undefined {
    return this.#flights.get(key);
  }

  /** Runs `fn` as the flight for `key`; the entry is removed however `fn` settles. */
  run(key: string, fn: () => Promise<T>): Promise<T> {
    const flight = fn().finally(() => {
      if (this.#flights.get(key) === flight) this.#flights.delete(key);
    });
    this.#flights.set(key, flight);
    return flight;
  }
}
