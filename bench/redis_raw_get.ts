/**
 * `redis_raw_get`: the baseline of every Redis row — a plain ioredis `getBuffer` of the exact
 * entry `redis_hit` reads (same key, same bytes, envelope included), with no cache around it.
 */
import type { Redis } from 'ioredis';
import type { ScenarioSet, SizeFixture } from './fixtures.js';
import { BenchInvariantError } from './helpers.js';
import { OURS_REDIS_PREFIX } from './redis_hit.js';

/** Needs `redisHit(fx, client)` to have filled the entries first; `client` is the shared one. */
export async function redisRawGet(fx: SizeFixture, client: Redis): Promise<ScenarioSet> {
  const keys = fx.keys.map((key) => OURS_REDIS_PREFIX + key);
  const first = await client.getBuffer(keys[0]!);
  // The envelope adds a header and the key to the payload; the baseline moves the same bytes.
  const entryBytes = first?.byteLength ?? 0;
  if (entryBytes <= fx.bytes) {
    throw new BenchInvariantError('redis_raw_get: entries missing; fill redis_hit first');
  }
  const n = keys.length;
  return {
    scenarios: [
      {
        id: 'redis_raw_get',
        label: 'raw ioredis `getBuffer` of the same entry (baseline)',
        async: true,
        op: async (i: number) => {
          const entry = await client.getBuffer(keys[i % n]!);
          if (entry?.byteLength !== entryBytes) {
            throw new BenchInvariantError('redis_raw_get: entry missing');
          }
        },
      },
    ],
    close: async () => {},
  };
}
