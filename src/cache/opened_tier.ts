import type { RejectionReason } from '../events.js';
import type { MemoryTier } from '../stores/store.js';
import { decodeEntry, openedEntry } from './cache_entry.js';
import type { KeyDigest } from './cache_key.js';

/**
 * The memory tier of a sealed cache over two tiers (SPEC invariant 21): it keeps entries
 * *opened*, so a memory hit costs no AES-GCM open (≈ 1 µs at 1 KiB, ≈ 25 µs at 64 KiB on the
 * 2-core VM), while Redis, which other processes and people reach, keeps only sealed ones.
 *
 * An opened entry is the plain envelope (`cache_entry.ts`) carrying the *keyed* digest, held
 * under the keyed name: every hit still checks that the entry was written under exactly this
 * key and has not expired, as an unsealed hit does. Nothing outside the process ever sees it,
 * and the tier never holds the sealed form of an entry (only the cache writes here, always
 * opened; a sealed envelope found here would not decode as plain, a miss).
 */
export class OpenedTier {
  readonly #memory: MemoryTier;
  /**
   * The entry object the last {@link read} that verified found: what a shared value is
   * remembered by (`values: 'shared'`). Read at once, before anything else reads the tier.
   */
  entry: Uint8Array | null = null;

  constructor(memory: MemoryTier) {
    this.#memory = memory;
  }

  /** The payload held for `key` if it belongs to `digest` and is live; `null` when none is held. */
  read(key: string, digest: KeyDigest, now: number): Uint8Array | RejectionReason | null {
    const held = this.#memory.getNow(key);
    if (held === null) return null;
    const payload = decodeEntry(held, digest, now);
    // Whatever does not verify is dropped, so the next read goes to the shared tier.
    if (typeof payload === 'string') void this.#memory.delete(key);
    else this.entry = held;
    return payload;
  }

  /**
   * Keeps `payload` (just opened or just computed) until the earlier of `ttlMs` from `now` and
   * its `expiresAt`. The memory tier drops an entry once *more* than its TTL has passed; the
   * entry itself is expired from `expiresAt` on: one millisecond less keeps the two in step.
   * `tag` (the runnable's `pathTag`) lets a path invalidation drop it alone.
   */
  keep(
    key: string,
    digest: KeyDigest,
    expiresAt: number,
    payload: Uint8Array,
    ttlMs: number,
    now: number,
    tag: string | undefined,
  ): void {
    const ttl = Math.floor(Math.min(ttlMs, expiresAt - now)) - 1;
    if (!(ttl >= 1)) {
      // Already expired: not kept, and an older copy must not outlive it either.
      void this.#memory.delete(key);
      return;
    }
    void this.#memory.set(key, openedEntry(digest, expiresAt, payload), ttl, tag);
  }

  drop(key: string): void {
    void this.#memory.delete(key);
  }
}
