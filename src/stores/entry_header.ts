import { asBuffer } from '../util/bytes.js';

/**
 * The clear header every cache entry starts with, plain or sealed: the part of the bytes a store
 * may read. The cache writes it (cache/cache_entry.ts, cache/sealed_entry.ts), and the
 * two-tier store reads the expiry from it to bound how long its memory tier keeps a copy.
 *
 * ```
 * 0  'V' 'C'          magic
 * 2  u8               format version (2 plain, 3 sealed)
 * 3  u8               flags (0)
 * 4  f64 BE           expiry, ms since the epoch
 * ```
 */
export const MAGIC_0 = 0x56; // 'V'
export const MAGIC_1 = 0x43; // 'C'

/**
 * The expiry an envelope (plain or sealed: both keep it at bytes 4–11, in clear) claims, or
 * `null` when `entry` is no envelope. For bounding how long a tier in front keeps a copy: a
 * claim is not a proof (a forged one fails `decode` on every read), so it only ever shortens.
 */
export function claimedExpiry(entry: Uint8Array): number | null {
  if (entry.byteLength < 12 || entry[0] !== MAGIC_0 || entry[1] !== MAGIC_1) return null;
  const expiresAt = asBuffer(entry).readDoubleBE(4);
  return Number.isFinite(expiresAt) ? expiresAt : null;
}
