/**
 * The bytes a store holds for one cached result: a small versioned envelope that names the key it
 * was written under and when it expires, then the result's JSON.
 *
 * ```
 * 0  'V' 'C'          magic
 * 2  u8               format version (1)
 * 3  u8               flags (0)
 * 4  f64 BE           expiry, ms since the epoch
 * 12 u32 BE           payload length
 * 16 u16 BE           key length k
 * 18 k bytes          key (UTF-8)
 * 18+k payload        result JSON (UTF-8)
 * ```
 *
 * A read verifies magic, version, lengths, key and expiry before handing back the payload as a
 * view into the stored bytes (no copy). An entry copied under another key, truncated, written by
 * another format or expired is a miss, never a result.
 */

const MAGIC_0 = 0x56; // 'V'
const MAGIC_1 = 0x43; // 'C'
const FORMAT = 1;
const HEADER = 18;
const MAX_KEY_BYTES = 0xffff;

/** Why an entry was not accepted; counted by the middleware. */
export type EntryRejection = 'corrupt' | 'foreign-key' | 'expired';

export function encodeEntry(key: string, expiresAt: number, payload: Uint8Array): Uint8Array {
  const keyBytes = Buffer.byteLength(key, 'utf8');
  if (keyBytes > MAX_KEY_BYTES) throw new RangeError('cache key too long');
  // decodeEntry compares keys as latin1 (no UTF-8 decode on the hit path), which is exact only
  // for ASCII: 'é' written as UTF-8 would read back as 'Ã©'. Cache keys are ASCII by
  // construction; refuse anything else rather than let two keys compare equal.
  if (keyBytes !== key.length) throw new RangeError('cache key must be ASCII');
  const out = Buffer.allocUnsafe(HEADER + keyBytes + payload.byteLength);
  out[0] = MAGIC_0;
  out[1] = MAGIC_1;
  out[2] = FORMAT;
  out[3] = 0;
  out.writeDoubleBE(expiresAt, 4);
  out.writeUInt32BE(payload.byteLength, 12);
  out.writeUInt16BE(keyBytes, 16);
  out.write(key, HEADER, keyBytes, 'utf8');
  out.set(payload, HEADER + keyBytes);
  return out;
}

/**
 * The payload of `entry` if it was written under exactly `key` and has not expired at `now`;
 * otherwise the reason it is rejected.
 */
export function decodeEntry(
  entry: Uint8Array,
  key: string,
  now: number,
): Uint8Array | EntryRejection {
  if (entry.byteLength < HEADER) return 'corrupt';
  const buf = Buffer.isBuffer(entry)
    ? entry
    : Buffer.from(entry.buffer, entry.byteOffset, entry.byteLength);
  if (buf[0] !== MAGIC_0 || buf[1] !== MAGIC_1 || buf[2] !== FORMAT) return 'corrupt';
  const payloadLength = buf.readUInt32BE(12);
  const keyLength = buf.readUInt16BE(16);
  if (HEADER + keyLength + payloadLength !== buf.byteLength) return 'corrupt';
  // Keys are ASCII by construction (workspace id + hex), so a latin1 read compares exactly and
  // avoids a UTF-8 decode on the hit path.
  if (keyLength !== key.length || buf.toString('latin1', HEADER, HEADER + keyLength) !== key) {
    return 'foreign-key';
  }
  const expiresAt = buf.readDoubleBE(4);
  if (!(expiresAt > now)) return 'expired';
  return buf.subarray(HEADER + keyLength);
}
