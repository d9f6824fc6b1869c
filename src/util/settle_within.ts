/** How long close() waits for background work before it goes ahead anyway. */
export const CLOSE_WAIT_MS = 2000;

/**
 * Resolves once every promise of `pending` has settled — re-reading the set, since settling
 * work may add more; a settled one may stay in it — or once `ms` have passed, whichever is
 * first. For close(): wait for background work so that nothing it does runs into ended pools,
 * yet always resolve, even when that work hangs on a dead peer (it then fails later, quietly,
 * on the ended pool).
 */
export async function settleWithin(
  pending: ReadonlySet<Promise<unknown>>,
  ms: number,
): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, ms);
    timer.unref();
  });
  let timedOut = false;
  void expired.then(() => {
    timedOut = true;
  });
  // Settled promises may stay in the set: each is awaited once, never spun on.
  const settled = new WeakSet<Promise<unknown>>();
  try {
    while (!timedOut) {
      const open = [...pending].filter((promise) => !settled.has(promise));
      if (open.length === 0) return;
      await Promise.race([
        Promise.allSettled(open).then(() => {
          for (const promise of open) settled.add(promise);
        }),
        expired,
      ]);
    }
  } finally {
    clearTimeout(timer);
  }
}
