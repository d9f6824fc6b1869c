/** A promise with its settle functions outside: lets a test hold a runnable open, never sleep. */
export interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
  reject(reason: unknown): void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (reason: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * Resolves once `count` calls to `arrive()` have happened: a barrier for "all N runnables have
 * started" without polling.
 */
export function countdown(count: number): { arrive(): void; readonly done: Promise<void> } {
  const all = deferred<void>();
  let left = count;
  if (left <= 0) all.resolve();
  return {
    arrive() {
      left--;
      if (left === 0) all.resolve();
    },
    done: all.promise,
  };
}
