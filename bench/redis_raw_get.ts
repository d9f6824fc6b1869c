/**
 * `redis_raw_get`: the baseline of every Redis row — a plain ioredis `getBuffer` of the exact
 * entry `redis_hit` reads (same key, same bytes, envelope included), with no cache around it.
 *
 * `redis_keyed_get`, beside it: the same GET with its key derived per hit by `cachedResultPath`
 * of the job (key input and SHA-256), nothing else — the *keyed floor*, as `value_hit.ts` has
 * one. A viewer-keyed hit cannot skip its key, and right after an idle wait for a reply the key
 * costs 2–3× what it costs in a tight loop (`bench/redis_split.ts`): this row shows how much of
 * `redis_hit`'s distance to the raw GET is the key alone. Not judged: SPEC judges against raw.
 */
import type { Redis } from 'ioredis';
import { cachedResultPath } from '../src/index.js';
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
      {
        id: 'redis_keyed_get',
        label:
          'the same `getBuffer`, its key derived per hit (`cachedResultPath` of the job): the keyed floor',
        async: true,
        op: async (i: number) => {
          const entry = await client.getBuffer(
            OURS_REDIS_PREFIX + cachedResultPath(fx.jobs[i % n]!),
          );
          if (entry?.byteLength !== entryBytes) {
            throw new BenchInvariantError('redis_keyed_get: entry missing');
          }
        },
      },
    ],
    close: async () => {},
  };
}
