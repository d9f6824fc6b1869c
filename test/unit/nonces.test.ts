import { describe, expect, it } from 'vitest';
import { fillNonce, newNonce } from '../../src/util/nonces.js';

describe('nonces drawn from the pool', () => {
  it('never hands out the same bytes twice, across several refills of the pool', () => {
    // 3,000 × 12 bytes is almost nine 4 KiB pools: a pool not advanced, not refilled, or
    // refilled with the same bytes repeats nonces here.
    const seen = new Set<string>();
    for (let i = 0; i < 3000; i++) seen.add(newNonce(12).toString('hex'));
    expect(seen.size).toBe(3000);
  });

  it('writes exactly the bytes asked for, where asked, and they look random', () => {
    const target = Buffer.alloc(40, 0xab);
    fillNonce(target, 4, 12);
    expect(target.subarray(0, 4).every((b) => b === 0xab)).toBe(true);
    expect(target.subarray(16).every((b) => b === 0xab)).toBe(true);
    // Byte values over 48 KiB of nonces: CSPRNG output covers all 256 (a zeroed or constant
    // pool would not).
    const values = new Set<number>();
    for (let i = 0; i < 4096; i++) for (const b of newNonce(12)) values.add(b);
    expect(values.size).toBe(256);
  });

  it('refuses a length it was not made for', () => {
    expect(() => newNonce(0)).toThrow(RangeError);
    expect(() => newNonce(65)).toThrow(RangeError);
    expect(() => newNonce(1.5)).toThrow(RangeError);
  });
});
