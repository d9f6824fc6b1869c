import { once } from 'node:events';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import type { CachedExecutor } from '../../../src/index.js';
import { RedisCacheStore, withResultCache } from '../../../src/index.js';
import { ManualClock } from '../../helpers/clock.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { deferred } from '../../helpers/deferred.js';
import { makeJob } from '../../helpers/jobs.js';
import { captureLogger } from '../../helpers/log_capture.js';
import { deleteKeys, rawClient, ready, redisAddress, uniquePrefix } from '../../helpers/redis.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';

const url = inject('redisUrl');
const address = redisAddress(url);
const prefix = uniquePrefix('redis_outage');
const alice = 'alice@example.com';
const REST_MS = 1000;
let raw: Redis;
let proxy: TcpProxy;
let client: Redis;
let cache: CachedExecutor;
let inner: CountingExecutor;
let clock: ManualClock;
let warnings: () => unknown[];

beforeAll(async () => {
  raw = await rawClient(url);
});

afterAll(async () => {
  await raw.quit();
});

/** An ioredis client that reaches Redis only through the proxy, configured as production would. */
function proxiedClient(): Redis {
  const proxied = new Redis(address.via(proxy.port), {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => 20,
  });
  proxied.on('error', () => {});
  return proxied;
}

beforeEach(async () => {
  proxy = await TcpProxy.start(address);
  client = proxiedClient();
  await ready(client);
  clock = new ManualClock();
  inner = new CountingExecutor();
  const log = captureLogger();
  warnings = () => log.lines().filter((line) => line['level'] === 40);
  cache = withResultCache(inner, {
    store: new RedisCacheStore({ redis: client, prefix, commandTimeout: 100 }),
    seal: false,
    now: clock.now,
    logger: log.logger,
    storeRestAfterFailure: REST_MS,
  });
});

afterEach(async () => {
  expect(cache.inFlight).toBe(0);
  client.disconnect();
  await proxy.stop();
  await deleteKeys(raw, prefix);
});

const job = (q: number) => makeJob({ viewer: alice, args: { q }, cacheTtlS: 60 });

/** Switches the proxy back to forward and waits for the client to be usable again. */
async function heal(): Promise<void> {
  if (client.status === 'ready') {
    await proxy.setMode('forward');
    // bytes held back by a blackhole drain first, in order; this PING answers after them
    await client.ping();
  } else {
    const isReady = once(client, 'ready');
    await proxy.setMode('forward');
    await isReady;
  }
  clock.advance(REST_MS + 1);
}

describe('Redis stopped or unreachable mid-run', () => {
  it('a GET that timed out and is answered late: counted once, and its reply serves nothing', async () => {
    await cache.run(job(1));
    expect(cache.stats.hits).toBe(0);
    await proxy.setMode('blackhole');
    // The GET is held: it times out, the run goes on uncached (one store error, one miss).
    const result = await cache.run(job(1));
    expect(result.fromCache).toBe(false);
    expect(cache.stats).toMatchObject({ storeErrors: 1, hits: 0, misses: 2, rejected: 0 });
    // The held bytes reach Redis now, and its reply to that GET arrives after the timeout.
    await heal();
    expect(cache.stats).toMatchObject({ storeErrors: 1, hits: 0, misses: 2, rejected: 0 });
    expect(inner.calls).toBe(2);
    // The store works again: a hit, counted once.
    expect((await cache.run(job(1))).fromCache).toBe(true);
    expect(cache.stats).toMatchObject({ storeErrors: 1, hits: 1 });
  });

  it('stopped while a run executes: the run succeeds uncached; the cache recovers after', async () => {
    await cache.run(job(1));
    expect((await cache.run(job(1))).fromCache).toBe(true);

    const gate = deferred();
    const started = deferred();
    inner.behaviour = async (j) => {
      started.resolve();
      await gate.promise;
      return { viewer: j.perms.endUserEmail, q: j.args['q'] };
    };
    const running = cache.run(job(2));
    await started.promise; // its GET went through: a miss
    const closed = once(client, 'close');
    await proxy.setMode('refuse');
    await closed;
    gate.resolve();
    const result = await running;
    expect(result).toMatchObject({ fromCache: false, value: { viewer: alice, q: 2 } });
    expect(cache.stats.storeErrors).toBe(1);
    expect(cache.stats.notStored).toBe(1);

    // while it is down, every run still succeeds, uncached
    for (const q of [1, 2, 3]) expect((await cache.run(job(q))).fromCache).toBe(false);
    clock.advance(REST_MS + 1);
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect(cache.stats.storeErrors).toBe(2);
    expect(warnings()).toHaveLength(1);

    await heal();
    expect((await cache.run(job(1))).fromCache).toBe(true); // written before the outage
    expect((await cache.run(job(2))).fromCache).toBe(false); // never stored: executes again
    expect((await cache.run(job(2))).fromCache).toBe(true);
    expect(inner.calls).toBe(1 + 1 + 3 + 1 + 1);
  });

  it('unreachable from the start: runs succeed uncached, the cache works once it is up', async () => {
    client.disconnect();
    await proxy.setMode('refuse');
    client = proxiedClient();
    cache = withResultCache(inner, {
      store: new RedisCacheStore({ redis: client, prefix, commandTimeout: 100 }),
      seal: false,
      now: clock.now,
      storeRestAfterFailure: REST_MS,
    });
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect(cache.stats.storeErrors).toBe(1);
    await heal();
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect((await cache.run(job(1))).fromCache).toBe(true);
  });

  it('live connections dropped: the next run succeeds uncached, then the cache reconnects', async () => {
    await cache.run(job(1));
    const closed = once(client, 'close');
    proxy.dropConnections();
    await closed;
    expect((await cache.run(job(1))).fromCache).toBe(false);
    expect(cache.stats.storeErrors).toBe(1);
    await ready(client);
    clock.advance(REST_MS + 1);
    expect((await cache.run(job(1))).fromCache).toBe(true);
  });

  it('blackholed: commands time out (commandTimeout), runs succeed uncached, and recover', async () => {
    await cache.run(job(1));
    await proxy.setMode('blackhole');
    const result = await cache.run(job(1));
    expect(result.fromCache).toBe(false);
    expect(cache.stats.storeErrors).toBe(1);
    const errorsSeen: string[] = [];
    cache.events.on('store:error', (e) => errorsSeen.push(e.message));

    // a write that hangs: the result still comes back, not stored
    clock.advance(REST_MS + 1);
    const gate = deferred();
    const started = deferred();
    await proxy.setMode('forward');
    await client.ping();
    inner.behaviour = async (j) => {
      started.resolve();
      await gate.promise;
      return { viewer: j.perms.endUserEmail, q: j.args['q'] };
    };
    const running = cache.run(job(2));
    await started.promise;
    await proxy.setMode('blackhole');
    gate.resolve();
    expect(await running).toMatchObject({ fromCache: false, value: { q: 2 } });
    expect(cache.stats.storeErrors).toBe(2);
    expect(errorsSeen).toEqual([expect.stringContaining('timed out')]);

    await heal();
    expect((await cache.run(job(1))).fromCache).toBe(true);
    // two bursts (the GET's, then the SET's after a successful GET in between): two warnings
    expect(warnings()).toHaveLength(2);
  });
});
