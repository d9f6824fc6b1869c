/**
 * `sealed_floor`: what a sealed hit cannot do without — the baseline of the sealed rows. Per hit:
 * HMAC-SHA-256 of the canonical key text (the keyed name), one ioredis `getBuffer` of a sealed
 * entry of the same size as `redis_hit_sealed` reads (12-byte nonce and 16-byte tag around the
 * payload, a 24-byte clear header as associated data), and the AES-256-GCM open of its payload.
 * No envelope checks, no viewer, no fingerprint, no single flight, no counters: the sealed hit
 * is judged against this (SPEC "Performance"), because the floor itself is well above a raw GET.
 */
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { canonicalKeyInput } from '../src/cache/cache_key.js';
import { RUN_PREFIX, type ScenarioSet, type SizeFixture, TTL_S } from './fixtures.js';
import { BenchInvariantError } from './helpers.js';

const HEADER = 24;
const TAG = 16;

/** `redis` is the run's shared client, as for `redis_raw_get`. */
export async function sealedFloor(fx: SizeFixture, redis: Redis): Promise<ScenarioSet> {
  const nameKey = randomBytes(32);
  const sealKey = randomBytes(32);
  const prefix = `${RUN_PREFIX}floor:`;
  // The key text is what a hit builds anyway (it is not part of the floor's cost to make it).
  const texts = fx.jobs.map((job) => canonicalKeyInput(job, null));
  const name = (text: string) =>
    `${prefix}${fx.jobs[0]!.workspace}/cache/${createHmac('sha256', nameKey).update(text).digest('hex')}`;
  const pipeline = redis.pipeline();
  for (const text of texts) {
    pipeline.set(name(text), sealFloorEntry(sealKey, fx.json, TTL_S * 1000), 'EX', TTL_S);
  }
  await pipeline.exec();
  const n = texts.length;
  const { bytes } = fx;
  return {
    scenarios: [
      {
        id: 'sealed_floor',
        label:
          'sealed floor: HMAC of the key text + `getBuffer` of a sealed entry + AES-256-GCM open',
        async: true,
        op: async (i: number) => {
          const entry = await redis.getBuffer(name(texts[i % n]!));
          if (entry === null) throw new BenchInvariantError('sealed_floor: entry missing');
          const payload = openFloorEntry(sealKey, entry);
          if (payload.byteLength !== bytes) throw new BenchInvariantError('sealed_floor: size');
        },
      },
    ],
    close: async () => {},
  };
}

/**
 * A sealed floor entry: a 24-byte clear header (magic, expiry, nonce) as associated data, the
 * payload under AES-256-GCM, its 16-byte tag. What the floors open; not the library's format.
 */
export function sealFloorEntry(sealKey: Buffer, payload: Uint8Array, ttlMs: number): Buffer {
  const entry = Buffer.alloc(HEADER + payload.byteLength + TAG);
  entry.write('VC', 0, 'latin1');
  entry.writeDoubleBE(Date.now() + ttlMs, 4);
  randomBytes(12).copy(entry, 12);
  const cipher = createCipheriv('aes-256-gcm', sealKey, entry.subarray(12, HEADER));
  cipher.setAAD(entry.subarray(0, HEADER));
  cipher.update(payload).copy(entry, HEADER);
  cipher.final();
  cipher.getAuthTag().copy(entry, entry.byteLength - TAG);
  return entry;
}

/** The payload of a {@link sealFloorEntry}: the open a sealed hit cannot do without. */
export function openFloorEntry(sealKey: Buffer, entry: Buffer): Buffer {
  const tagAt = entry.byteLength - TAG;
  const decipher = createDecipheriv('aes-256-gcm', sealKey, entry.subarray(12, HEADER));
  decipher.setAAD(entry.subarray(0, HEADER));
  decipher.setAuthTag(entry.subarray(tagAt));
  const payload = decipher.update(entry.subarray(HEADER, tagAt));
  decipher.final();
  return payload;
}
