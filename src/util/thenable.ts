/** Whether `value` is a promise (or any thenable), so a synchronous answer can skip the hop. */
export function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}
