import type { Redis } from 'ioredis';
import { afterAll, beforeAll, inject } from 'vitest';
import { RedisCacheStore } from '../../../src/index.js';
import { deleteKeys, rawClient, uniquePrefix } from '../../helpers/redis.js';
import { registerSealingSuite } from '../../sealing_suite.js';

const url = inject('redisUrl');
const prefix = uniquePrefix('sealed_entries_redis');
let raw: Redis;
let client: Redis;

beforeAll(async () => {
  raw = await rawClient(url);
  client = await rawClient(url, { enableOfflineQueue: false, maxRetriesPerRequest: 0 });
});

afterAll(async () => {
  await client.quit();
  await raw.quit();
});

// Tampering goes straight into Redis with a raw client, as an attacker with Redis access would.
registerSealingSuite('RedisCacheStore', {
  create: () => ({
    store: new RedisCacheStore({ redis: client, prefix }),
    raw: {
      keys: async () => (await raw.keys(`${prefix}*`)).map((k) => k.slice(prefix.length)),
      get: (key) => raw.getBuffer(prefix + key),
      set: async (key, value) => {
        await raw.set(prefix + key, value, 'PX', 3_600_000);
      },
    },
  }),
  cleanup: async () => {
    await deleteKeys(raw, prefix);
  },
});
