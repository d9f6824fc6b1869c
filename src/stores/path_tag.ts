import { createHmac, randomBytes } from 'node:crypto';

/**
 * Keyed per process: a tag means nothing outside the process that computed it, so a store that
 * is handed one (see `CacheStore.get`) learns no runnable's path from it, and a tag copied
 * to another process or into Redis names nothing there.
 */
const TAG_KEY = randomBytes(32);
/** Tags computed, per workspace then path: runnables are few, and the bound keeps them so. */
const memo = new Map<string, Map<string, string>>();
const MEMO_MAX = 4096;
let memoSize = 0;

/**
 * The tag of a runnable's entries in a memory tier (`workspace` + `path`): the result cache
 * hands it to the store when it writes or fills an entry, so that a path invalidation drops
 * exactly that runnable's entries from memory, in every process (each computes the tag from the
 * workspace and path the invalidation message already carries). 128 bits of
 * HMAC-SHA-256 under a per-process key, as 22 base64url characters; the workspace holds no NUL,
 * so `workspace\0path` is unambiguous.
 */
export function pathTag(workspace: string, path: string): string {
  let paths = memo.get(workspace);
  const known = paths?.get(path);
  if (known !== undefined) return known;
  const tag = createHmac('sha256', TAG_KEY)
    .update(`${workspace}\0${path}`)
    .digest('base64url')
    .slice(0, 22);
  if (memoSize >= MEMO_MAX) {
    // Paths are caller-supplied: forget them all rather than grow (tags are recomputed alike).
    memo.clear();
    memoSize = 0;
    paths = undefined;
  }
  if (paths === undefined) {
    paths = new Map();
    memo.set(workspace, paths);
  }
  paths.set(path, tag);
  memoSize++;
  return tag;
}
