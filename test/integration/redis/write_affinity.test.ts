import { Redis, type RedisOptions } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { RedisCacheStore, StoreUnavailableError } from '../../../src/index.js';
import { withWriteAffinity } from '../../../src/util/write_affinity.js';
import {
  deleteKeys,
  rawClient,
  ready,
  redisAddress,
  setsDuring,
  uniquePrefix,
} from '../../helpers/redis.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';

// A store's writes may go on another connection to the same Redis (a queue worker's, for the
// entry of the job it runs: see src/util/write_affinity.ts). Which connection a SET arrived on
// is read from the server itself: MONITOR names each command's client address, CLIENT LIST
// names the connection at that address.

const url = inject('redisUrl');
const prefix = uniquePrefix('write_affinity');
let raw: Redis;
const opened: Redis[] = [];

beforeAll(async () => {
  raw = await rawClient(url);
});

afterEach(async () => {
  for (const client of opened.splice(0)) client.disconnect();
  await deleteKeys(raw, prefix);
});

afterAll(async () => {
  await raw.quit();
});

async function client(name: string, options: RedisOptions = {}, at = url): Promise<Redis> {
  const c = new Redis(at, { connectionName: name, ...options });
  c.on('error', () => {});
  opened.push(c);
  await ready(c);
  return c;
}

/** The connection names the SETs of keys under `under` arrived from, while `act` ran. */
async function setsFrom(under: string, act: () => Promise<unknown>): Promise<string[]> {
  const seen = await setsDuring(raw, act);
  return seen.filter((s) => s.key.startsWith(under)).map((s) => s.name);
}

const ownStoreOptions: RedisOptions = { enableOfflineQueue: false, maxRetriesPerRequest: 0 };
/** What a queue worker's connection is: BullMQ's settings (retries forever, offline queue on). */
const workerOptions: RedisOptions = { maxRetriesPerRequest: null };

describe('a store write under a write affinity', () => {
  it('goes on the affinity connection when it reaches the same server, and reads back', async () => {
    const own = await client('vc-own', ownStoreOptions);
    const worker = await client('vc-worker', workerOptions);
    const store = new RedisCacheStore({ redis: own, prefix });
    const from = await setsFrom(prefix, () =>
      withWriteAffinity(worker, () => store.set('a', Buffer.from('entry a'), 60_000)),
    );
    expect(from).toEqual(['vc-worker']);
    expect(Buffer.from((await store.get('a'))!).toString()).toBe('entry a');
    // Outside it, the store's own connection, as before.
    expect(await setsFrom(prefix, () => store.set('b', Buffer.from('b'), 60_000))).toEqual([
      'vc-own',
    ]);
  });

  it('stays on the store connection when the other is another database (never writes elsewhere)', async () => {
    const own = await client('vc-own', ownStoreOptions);
    const elsewhere = await client('vc-db1', { ...workerOptions, db: 1 });
    const store = new RedisCacheStore({ redis: own, prefix });
    const from = await setsFrom(prefix, () =>
      withWriteAffinity(elsewhere, () => store.set('c', Buffer.from('entry c'), 60_000)),
    );
    expect(from).toEqual(['vc-own']);
    expect(Buffer.from((await store.get('c'))!).toString()).toBe('entry c');
    expect(await elsewhere.exists(`${prefix}c`)).toBe(0);
  });

  it('stays on the store connection when the other has another key prefix', async () => {
    const own = await client('vc-own', ownStoreOptions);
    const prefixed = await client('vc-prefixed', { ...workerOptions, keyPrefix: 'other:' });
    const store = new RedisCacheStore({ redis: own, prefix });
    const from = await setsFrom(prefix, () =>
      withWriteAffinity(prefixed, () => store.set('d', Buffer.from('d'), 60_000)),
    );
    expect(from).toEqual(['vc-own']);
  });

  it('stays on the store connection when the other is not connected now', async () => {
    const own = await client('vc-own', ownStoreOptions);
    const worker = await client('vc-worker', workerOptions);
    worker.disconnect();
    const store = new RedisCacheStore({ redis: own, prefix });
    const from = await setsFrom(prefix, () =>
      withWriteAffinity(worker, () => store.set('e', Buffer.from('e'), 60_000)),
    );
    expect(from).toEqual(['vc-own']);
    expect(await store.get('e')).not.toBeNull();
  });

  it('fails within the store bound, as unavailable, when the affinity connection stops answering', async () => {
    // Both connections through one proxy (the same address, so the same server as far as the
    // store can tell), the worker's with BullMQ's settings, which queue rather than fail.
    const proxy = await TcpProxy.start(redisAddress(url));
    try {
      const at = redisAddress(url).via(proxy.port);
      const own = await client('vc-own', ownStoreOptions, at);
      const worker = await client('vc-worker', workerOptions, at);
      const store = new RedisCacheStore({ redis: own, prefix, commandTimeout: 300 });
      await proxy.setMode('blackhole');
      const started = performance.now();
      const write = withWriteAffinity(worker, () => store.set('f', Buffer.from('f'), 60_000));
      await expect(write).rejects.toBeInstanceOf(StoreUnavailableError);
      expect(performance.now() - started).toBeLessThan(5_000);
    } finally {
      await proxy.stop();
    }
  });

  it('is bounded on the affinity connection itself: its reply never read, the write fails in time', async () => {
    const own = await client('vc-own', ownStoreOptions);
    const worker = await client('vc-worker', workerOptions);
    const store = new RedisCacheStore({ redis: own, prefix, commandTimeout: 300 });
    // Redis answers, but nothing reads the worker connection's replies any more: only this
    // store's own bound can settle the write (its own connection would have answered).
    worker.stream.pause();
    const write = withWriteAffinity(worker, () => store.set('g', Buffer.from('g'), 60_000));
    await expect(write).rejects.toBeInstanceOf(StoreUnavailableError);
    worker.stream.resume();
  });
});
