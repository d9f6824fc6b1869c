import { createHmac, hash, hkdfSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { canonicalKeyInput } from '../../src/cache/cache_key.js';
import { SealedEntries } from '../../src/cache/sealed_entry.js';
import type { CacheStore } from '../../src/index.js';
import { MemoryCacheStore, withResultCache } from '../../src/index.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';
import { registerSealingSuite } from '../sealing_suite.js';

/** The memory store, with the keys written through it remembered (it has no key listing). */
function memoryTarget() {
  const store = new MemoryCacheStore();
  const written = new Set<string>();
  const recording: CacheStore = {
    get: (key) => store.get(key),
    set: (key, value, ttlMs) => {
      written.add(key);
      return store.set(key, value, ttlMs);
    },
    delete: (key) => store.delete(key),
  };
  const raw = {
    keys: async () => [...written],
    get: async (key: string) => {
      const value = await store.get(key);
      return value === null ? null : Buffer.from(value);
    },
    set: (key: string, value: Buffer) => store.set(key, value, 3_600_000),
  };
  return { store: recording, raw };
}

registerSealingSuite('MemoryCacheStore', {
  create: memoryTarget,
  cleanup: async () => {},
});

describe('SealedEntries', () => {
  const secret = Buffer.from('0123456789abcdef'.repeat(4));

  it('names keys with HMAC-SHA-256(HKDF name key, SHA-256(key input))', () => {
    const input = canonicalKeyInput(makeJob({ viewer: 'alice@example.com', args: { a: 1 } }));
    const nameKey = Buffer.from(
      hkdfSync(
        'sha256',
        secret,
        'viewer-cache result cache',
        'viewer-cache v1: entry key name, HMAC-SHA-256',
        32,
      ),
    );
    const expected = createHmac('sha256', nameKey)
      .update(hash('sha256', input, 'buffer'))
      .digest();
    expect(new SealedEntries(secret).digest(input)).toBe(expected.toString('hex'));
  });

  it('opens what it sealed, as the same bytes, and only before the expiry', () => {
    const codec = new SealedEntries(secret);
    const digest = '07'.repeat(32);
    const payload = Buffer.from('{"rows":["é😀"]}');
    const entry = codec.encode(digest, 2000, payload);
    expect(Buffer.from(codec.decode(entry, digest, 1999) as Uint8Array).equals(payload)).toBe(true);
    expect(codec.decode(entry, digest, 2000)).toBe('expired');
    expect(codec.decode(entry, '08'.repeat(32), 1999)).toBe('unauthentic');
  });
});

describe('the seal option', () => {
  const store = new MemoryCacheStore();
  const inner = new CountingExecutor();

  it('refuses a secret shorter than 32 bytes with a TypeError naming the option, not the value', () => {
    for (const secretKey of ['short-secret', Buffer.alloc(31), '']) {
      let thrown: unknown;
      try {
        withResultCache(inner, { store, seal: { secretKey } });
      } catch (err) {
        thrown = err;
      }
      expect(thrown).toBeInstanceOf(TypeError);
      expect((thrown as Error).message).toMatch(/seal\.secretKey/);
      expect((thrown as Error).message).not.toContain('short-secret');
    }
    expect(() => withResultCache(inner, { store, seal: 'x'.repeat(40) as never })).toThrow(/seal/);
    expect(() => withResultCache(inner, { store, seal: { secretKey: 42 as never } })).toThrow(
      /seal\.secretKey/,
    );
  });

  it('accepts 32 bytes, as a string or as bytes', () => {
    withResultCache(inner, { store, seal: { secretKey: 'k'.repeat(32) } });
    withResultCache(inner, { store, seal: { secretKey: new Uint8Array(32) } });
  });
});
