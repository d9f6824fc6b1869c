/** Polls `condition` until it holds; fails after `timeoutMs` (never a fixed sleep). */
export async function waitUntil(
  what: string,
  condition: () => boolean | Promise<boolean>,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let delay = 5; ; delay = Math.min(delay * 2, 100)) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}
