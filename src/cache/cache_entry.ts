import type { RejectionReason } from '../events.js';
import { MAGIC_0, MAGIC_1 } from '../stores/entry_header.js';
import { asBuffer } from '../util/bytes.js';
import { type KeyDigest, keyDigest } from './cache_key.js';

/**
 * How entries are named and written: in clear ({@link plainEntries}, below) or sealed
 * (`sealed_entry.ts`). Chosen once, when the cache is built.
 */
export interface EntryCodec {
  /** The 32-byte digest that names an entry and that its envelope must carry (or be sealed to). */
  digest(keyInput: string): KeyDigest;
  encode(digest: KeyDigest, expiresAt: number, payload: Uint8Array): Uint8Array;
  /** The payload if `entry` belongs to `digest` and is live at `now`; otherwise why not. */
  decode(entry: Uint8Array, digest: KeyDigest, now: number): Uint8Array | RejectionReason;
}

/**
 * The bytes a store holds for one unsealed result: a small versioned envelope that names the key
 * it was written under and when it expires, then the result's JSON.
 *
 * ```
 * 0  'V' 'C'          magic
 * 2  u8               format version (2)
 * 3  u8               flags (0)
 * 4  f64 BE           expiry, ms since the epoch
 * 12 u32 BE           payload length
 * 16 32 bytes         key digest (SHA-256 of the canonical key input)
 * 48 payload          result JSON (UTF-8)
 * ```
 *
 * A read verifies magic, version, length, digest and expiry before handing back the payload as
 * a view into the stored bytes (no copy). An entry copied under another key, truncated, written
 * by another format or expired is a miss, never a result. The digest is compared as 32 raw bytes
 * (format 1 held the key as text and compared a decoded string on every hit). None of this stops
 * someone who can *write* to the store from forging an entry: that is what sealing is for.
 */
export const plainEntries: EntryCodec = {
  digest: keyDigest,
  encode: encodeEntry,
  decode: decodeEntry,
};

const FORMAT = 2;
const DIGEST_AT = 16;
const DIGEST_BYTES = 32;
const HEADER = DIGEST_AT + DIGEST_BYTES;

export function encodeEntry(digest: KeyDigest, expiresAt: number, payload: Uint8Array): Uint8Array {
  return writeEntry(Buffer.allocUnsafe(HEADER + payload.byteLength), digest, expiresAt, payload);
}

/**
 * An opened entry, for a memory tier in front of a sealed shared one: the plain envelope (so a
 * hit still checks the key digest, here the keyed one, and the expiry), in bytes of its own.
 * `allocUnsafe` would hand a small entry a slice of Node's shared 8 KiB pool, which the tier
 * would then keep alive whole while counting only the slice.
 */
export function openedEntry(digest: KeyDigest, expiresAt: number, payload: Uint8Array): Buffer {
  return writeEntry(
    Buffer.allocUnsafeSlow(HEADER + payload.byteLength),
    digest,
    expiresAt,
    payload,
  );
}

function writeEntry(out: Buffer, digest: KeyDigest, expiresAt: number, payload: Uint8Array) {
  out[0] = MAGIC_0;
  out[1] = MAGIC_1;
  out[2] = FORMAT;
  out[3] = 0;
  out.writeDoubleBE(expiresAt, 4);
  out.writeUInt32BE(payload.byteLength, 12);
  writeDigest(out, DIGEST_AT, digest);
  out.set(payload, HEADER);
  return out;
}

/**
 * The payload of `entry` if it was written under exactly `digest` and has not expired at `now`;
 * otherwise the reason it is rejected.
 */
export function decodeEntry(
  entry: Uint8Array,
  digest: KeyDigest,
  now: number,
): Uint8Array | RejectionReason {
  if (entry.byteLength < HEADER) return 'corrupt';
  const buf = asBuffer(entry);
  if (buf[0] !== MAGIC_0 || buf[1] !== MAGIC_1 || buf[2] !== FORMAT) return 'corrupt';
  if (HEADER + buf.readUInt32BE(12) !== buf.byteLength) return 'corrupt';
  if (!holdsDigest(buf, DIGEST_AT, digest)) return 'foreign-key';
  const expiresAt = buf.readDoubleBE(4);
  if (!(expiresAt > now)) return 'expired';
  return buf.subarray(HEADER);
}

const HEX = '0123456789abcdef';
/** Character codes of each byte's two lowercase hex digits. */
const HEX_HIGH = Uint8Array.from({ length: 256 }, (_, b) => HEX.charCodeAt(b >> 4));
const HEX_LOW = Uint8Array.from({ length: 256 }, (_, b) => HEX.charCodeAt(b & 15));

/** Writes a digest's 32 bytes at `offset`; throws unless it is 64 lowercase hex characters. */
export function writeDigest(out: Buffer, offset: number, digest: KeyDigest): void {
  if (digest.length !== 2 * DIGEST_BYTES || out.write(digest, offset, DIGEST_BYTES, 'hex') !== 32) {
    throw new RangeError('key digest must be 32 bytes as 64 hex characters');
  }
  if (!holdsDigest(out, offset, digest)) throw new RangeError('key digest must be lowercase hex');
}

/** Whether `buf[offset, offset + 32)` are the bytes of `digest`; builds nothing to compare. */
function holdsDigest(buf: Buffer, offset: number, digest: KeyDigest): boolean {
  if (digest.length !== 2 * DIGEST_BYTES) return false;
  for (let i = 0; i < DIGEST_BYTES; i++) {
    const byte = buf[offset + i]!;
    if (
      HEX_HIGH[byte] !== digest.charCodeAt(2 * i) ||
      HEX_LOW[byte] !== digest.charCodeAt(2 * i + 1)
    ) {
      return false;
    }
  }
  return true;
}
