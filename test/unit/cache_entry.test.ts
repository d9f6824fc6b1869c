import { describe, expect, it } from 'vitest';
import { decodeEntry, encodeEntry } from '../../src/cache/cache_entry.js';

const key = 'ab'.repeat(32);
const other = 'cd'.repeat(32);
const payload = Buffer.from('{"rows":[1,2,3],"who":"é"}');
const now = 1_700_000_000_000;

function decodedText(result: Uint8Array | string): string {
  if (typeof result === 'string') throw new Error(`rejected: ${result}`);
  return Buffer.from(result).toString('utf8');
}

describe('cache entry envelope', () => {
  it('round-trips the payload as a view into the entry (no copy)', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    const decoded = decodeEntry(entry, key, now);
    expect(decodedText(decoded)).toBe(payload.toString('utf8'));
    expect((decoded as Uint8Array).buffer).toBe(entry.buffer);
  });

  it('round-trips from a plain Uint8Array view at an offset (as a store may hand back)', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    const backing = new Uint8Array(entry.byteLength + 7);
    backing.set(entry, 3);
    const view = new Uint8Array(backing.buffer, 3, entry.byteLength);
    expect(decodedText(decodeEntry(view, key, now))).toBe(payload.toString('utf8'));
  });

  it('round-trips empty and binary payloads', () => {
    expect(decodedText(decodeEntry(encodeEntry(key, now + 1, new Uint8Array(0)), key, now))).toBe(
      '',
    );
    const binary = Uint8Array.from({ length: 256 }, (_, i) => i);
    const decoded = decodeEntry(encodeEntry(key, now + 1, binary), key, now);
    expect(Buffer.from(decoded as Uint8Array).equals(Buffer.from(binary))).toBe(true);
  });

  it('is a miss ("corrupt") when truncated, at every length', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    for (let length = 0; length < entry.byteLength; length++) {
      expect(decodeEntry(entry.subarray(0, length), key, now)).toBe('corrupt');
    }
  });

  it('is a miss ("corrupt") with trailing bytes', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    expect(decodeEntry(Buffer.concat([entry, Buffer.from([0])]), key, now)).toBe('corrupt');
  });

  it('is a miss ("corrupt") with a wrong magic or version', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    for (const [offset, value] of [
      [0, 0x57],
      [1, 0x00],
      [2, 1],
      [2, 3],
    ] as const) {
      const bad = Buffer.from(entry);
      bad[offset] = value;
      expect(decodeEntry(bad, key, now)).toBe('corrupt');
    }
  });

  it('is a miss ("corrupt") for garbage and for a bare JSON payload', () => {
    expect(decodeEntry(Buffer.from('garbage that is long enough'), key, now)).toBe('corrupt');
    expect(decodeEntry(payload, key, now)).toBe('corrupt');
  });

  it('is a miss ("foreign-key") when copied under another key, whichever byte differs', () => {
    const entry = encodeEntry(other, now + 1000, payload);
    expect(decodeEntry(entry, key, now)).toBe('foreign-key');
    for (const at of [0, 1, 27, 63]) {
      const near = key.slice(0, at) + (key[at] === 'a' ? 'b' : 'a') + key.slice(at + 1);
      expect(decodeEntry(encodeEntry(near, now + 1000, payload), key, now)).toBe('foreign-key');
    }
    // an uppercase spelling of the same bytes is not the key either
    expect(decodeEntry(entry, other.toUpperCase(), now)).toBe('foreign-key');
  });

  it('is a miss ("expired") at and after its expiry', () => {
    const entry = encodeEntry(key, now + 1000, payload);
    expect(decodeEntry(entry, key, now + 999)).toBeInstanceOf(Uint8Array);
    expect(decodeEntry(entry, key, now + 1000)).toBe('expired');
    expect(decodeEntry(entry, key, now + 10_000)).toBe('expired');
  });

  it('treats a NaN expiry as expired', () => {
    const entry = Buffer.from(encodeEntry(key, now + 1000, payload));
    entry.writeDoubleBE(Number.NaN, 4);
    expect(decodeEntry(entry, key, now)).toBe('expired');
  });

  it('refuses a digest that is not 64 lowercase hex characters', () => {
    for (const bad of ['ab'.repeat(31), 'ab'.repeat(33), 'zz'.repeat(32), 'AB'.repeat(32)]) {
      expect(() => encodeEntry(bad, now, payload)).toThrow(RangeError);
    }
  });
});
