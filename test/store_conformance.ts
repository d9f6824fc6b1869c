import { randomBytes } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { CacheStore } from '../src/index.js';

/** How the conformance suite drives one store implementation. */
export interface StoreConformanceTarget {
  /** A fresh (or freshly cleared) store for each test. */
  create(): Promise<CacheStore> | CacheStore;
  /**
   * Lets at least `ms` milliseconds pass on the clock the store expires entries by: advance an
   * injected clock, or wait until the server's own clock has moved that far.
   */
  elapse(ms: number): Promise<void>;
  /** Runs after each test: delete what the test wrote, close what it opened. */
  cleanup(store: CacheStore): Promise<void>;
}

const LONG_TTL = 60_000;

function bytes(text: string): Uint8Array {
  return new Uint8Array(Buffer.from(text, 'utf8'));
}

function expectBytes(actual: Uint8Array | null, expected: Uint8Array): void {
  expect(actual).toBeInstanceOf(Uint8Array);
  expect(actual!.byteLength).toBe(expected.byteLength);
  expect(
    Buffer.from(actual!.buffer, actual!.byteOffset, actual!.byteLength).equals(
      Buffer.from(expected),
    ),
  ).toBe(true);
}

/**
 * The contract every {@link CacheStore} must keep: get/set/delete over bytes, TTL expiry,
 * overwrite, binary-safe values, missing keys as null, and keys of any characters.
 */
export function registerStoreConformance(name: string, target: StoreConformanceTarget): void {
  describe(`CacheStore conformance: ${name}`, () => {
    let store: CacheStore;

    beforeEach(async () => {
      store = await target.create();
    });

    afterEach(async () => {
      await target.cleanup(store);
    });

    it('returns null for a key that was never set', async () => {
      expect(await store.get('never-set')).toBeNull();
    });

    it('returns the bytes that were set', async () => {
      await store.set('k', bytes('{"hello":"world"}'), LONG_TTL);
      expectBytes(await store.get('k'), bytes('{"hello":"world"}'));
    });

    it('overwrites a key, keeping only the last value', async () => {
      await store.set('k', bytes('first value, longer'), LONG_TTL);
      await store.set('k', bytes('second'), LONG_TTL);
      expectBytes(await store.get('k'), bytes('second'));
    });

    it('deletes a key, and deleting a missing key resolves', async () => {
      await store.set('k', bytes('v'), LONG_TTL);
      await store.set('keep', bytes('kept'), LONG_TTL);
      await store.delete('k');
      expect(await store.get('k')).toBeNull();
      expectBytes(await store.get('keep'), bytes('kept'));
      await expect(store.delete('never-set')).resolves.toBeUndefined();
    });

    it('keeps keys apart', async () => {
      await store.set('a', bytes('A'), LONG_TTL);
      await store.set('b', bytes('B'), LONG_TTL);
      expectBytes(await store.get('a'), bytes('A'));
      expectBytes(await store.get('b'), bytes('B'));
    });

    it('is binary-safe: zero bytes, every byte value, invalid UTF-8', async () => {
      const values: Record<string, Uint8Array> = {
        zeros: new Uint8Array(16),
        leadingZero: Uint8Array.from([0, 1, 2, 0]),
        everyByte: Uint8Array.from({ length: 256 }, (_, i) => i),
        invalidUtf8: Uint8Array.from([0xff, 0xfe, 0x80, 0xc3, 0x28, 0xed, 0xa0, 0x80]),
        crlf: bytes('a\r\nb\r\n$3\r\n*1\r\n'),
        empty: new Uint8Array(0),
      };
      for (const [k, v] of Object.entries(values)) await store.set(k, v, LONG_TTL);
      for (const [k, v] of Object.entries(values)) expectBytes(await store.get(k), v);
    });

    it('stores 64 KiB values intact', async () => {
      const big = new Uint8Array(randomBytes(64 * 1024));
      big[0] = 0;
      big[big.length - 1] = 0;
      await store.set('big', big, LONG_TTL);
      expectBytes(await store.get('big'), big);
    });

    it('stores only the bytes of a view, not its whole backing buffer', async () => {
      const backing = bytes('xxxx-the-view-yyyy');
      const view = backing.subarray(4, backing.length - 4);
      await store.set('view', view, LONG_TTL);
      expectBytes(await store.get('view'), bytes('-the-view-'));
    });

    it('takes keys with unicode, slashes, spaces and glob characters, and keeps them apart', async () => {
      const keys = [
        'ws/cache/0123',
        'ws/cache/0123/',
        'ws%2Fcache%2F0123',
        'été/日本語/😀',
        'e\u0301te\u0301/日本語/😀',
        'with space',
        'glob*?[chars]',
        'tab\there',
        '{braces}',
      ];
      for (const [i, k] of keys.entries()) await store.set(k, bytes(`value ${i}`), LONG_TTL);
      for (const [i, k] of keys.entries()) expectBytes(await store.get(k), bytes(`value ${i}`));
      await store.delete(keys[0]!);
      expect(await store.get(keys[0]!)).toBeNull();
      expectBytes(await store.get(keys[1]!), bytes('value 1'));
    });

    it('expires an entry after its TTL (milliseconds)', async () => {
      await store.set('short', bytes('short'), 5);
      await store.set('long', bytes('long'), LONG_TTL);
      await target.elapse(20);
      expect(await store.get('short')).toBeNull();
      expectBytes(await store.get('long'), bytes('long'));
    });

    it('an overwrite sets a new TTL', async () => {
      await store.set('k', bytes('old'), 5);
      await store.set('k', bytes('new'), LONG_TTL);
      await target.elapse(20);
      expectBytes(await store.get('k'), bytes('new'));
      await store.set('k', bytes('newer'), 5);
      await target.elapse(20);
      expect(await store.get('k')).toBeNull();
    });

    it('keeps an entry for at least a fractional TTL below 1 ms until it elapses', async () => {
      await store.set('tiny', bytes('tiny'), 0.4);
      await target.elapse(20);
      expect(await store.get('tiny')).toBeNull();
    });
  });
}
