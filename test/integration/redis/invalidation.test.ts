import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import type { CachedExecutor, CacheStore, Job } from '../../../src/index.js';
import {
  InvalidationUnsupportedError,
  MemoryCacheStore,
  TwoTierCacheStore,
  withResultCache,
} from '../../../src/index.js';
import { CountingExecutor } from '../../helpers/counting_executor.js';
import { type Deferred, deferred } from '../../helpers/deferred.js';
import { makeJob } from '../../helpers/jobs.js';
import { deleteKeys, rawClient, redisAddress, uniquePrefix } from '../../helpers/redis.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';
import { waitUntil } from '../../helpers/wait.js';

const url = inject('redisUrl');
const prefix = uniquePrefix('invalidation');
const secretKey = 'k'.repeat(64);
const alice = 'alice@example.com';
let raw: Redis;

beforeAll(async () => {
  raw = await rawClient(url);
});

afterAll(async () => {
  await deleteKeys(raw, prefix);
  await raw.quit();
});

/**
 * One "process": its own two-tier store (own Redis connections, own memory tier) and result
 * cache. Its executor answers with a run counter, or waits on `gate` while one is set.
 */
class Process {
  readonly inner: CountingExecutor;
  readonly cache: CachedExecutor;
  /** While set, the next run waits on it (after signalling `started`). */
  gate: { started: Deferred<void>; release: Deferred<void> } | null = null;

  constructor(
    readonly name: string,
    readonly store: TwoTierCacheStore,
    sealed = true,
  ) {
    this.inner = new CountingExecutor(async (job) => {
      const gate = this.gate;
      this.gate = null;
      const run = this.inner.calls;
      if (gate !== null) {
        gate.started.resolve();
        await gate.release.promise;
      }
      return { by: this.name, path: job.runnable.path, run };
    });
    this.cache = withResultCache(this.inner, { store, seal: sealed ? { secretKey } : false });
  }

  /** Makes the next run wait until the returned release is called. */
  holdNextRun() {
    const gate = { started: deferred(), release: deferred() };
    this.gate = gate;
    return gate;
  }
}

const opened: TwoTierCacheStore[] = [];
const proxies: TcpProxy[] = [];

async function processOn(
  name: string,
  redisUrl = url,
  heartbeat = 1000,
  sealed = true,
): Promise<Process> {
  const store = new TwoTierCacheStore({ redis: redisUrl, prefix, heartbeat, commandTimeout: 150 });
  opened.push(store);
  await store.invalidation.whenConfirmed();
  return new Process(name, store, sealed);
}

afterEach(async () => {
  for (const store of opened.splice(0)) await store.close();
  for (const proxy of proxies.splice(0)) await proxy.stop();
  await deleteKeys(raw, prefix);
});

const job = (path = 'f/a', workspace = 'inv'): Job =>
  makeJob({ workspace, path, viewer: alice, cacheTtlS: 3600 });
const runOf = (value: unknown) => (value as { run: number; by: string }).run;
const byOf = (value: unknown) => (value as { run: number; by: string }).by;

/** Waits until `p` has received the invalidation that moved `before` (the bus, not a guess). */
async function seen(p: Process, before: string, workspace = 'inv', path = 'f/a') {
  await waitUntil(`${p.name} sees the invalidation`, () => {
    const tag = p.store.invalidation.tag(workspace, path);
    return typeof tag === 'string' && tag !== before;
  });
}

const tagOf = (p: Process, workspace = 'inv', path = 'f/a') =>
  p.store.invalidation.tag(workspace, path) as string;

describe('invalidate({ workspace, path? }) across processes', () => {
  it('reaches a second process: its memory tier is dropped and its next run misses', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    await a.cache.run(job());
    expect((await b.cache.run(job())).fromCache).toBe(true); // from Redis, now in B's memory
    expect(b.store.memory.size).toBe(1);
    const before = tagOf(b);
    await a.cache.invalidate({ workspace: 'inv' });
    await seen(b, before);
    expect(b.store.memory.size).toBe(0);
    const after = await b.cache.run(job());
    expect(after.fromCache).toBe(false);
    expect(byOf(after.value)).toBe('B');
    expect((await a.cache.run(job())).fromCache).toBe(true); // B's fresh result, shared again
  });

  it('a path invalidates that runnable only; other runnables and workspaces keep hitting', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    for (const j of [job('f/a'), job('f/b'), job('f/a', 'other')]) await a.cache.run(j);
    const before = tagOf(b);
    await a.cache.invalidate({ workspace: 'inv', path: 'f/a' });
    await seen(b, before);
    expect((await b.cache.run(job('f/a'))).fromCache).toBe(false);
    expect((await b.cache.run(job('f/b'))).fromCache).toBe(true);
    expect((await b.cache.run(job('f/a', 'other'))).fromCache).toBe(true);
  });

  it.each([
    ['sealed (opened tier)', true],
    ['unsealed (two-tier store)', false],
  ])(
    "a path invalidation drops only that runnable's entries from every process's memory, %s",
    async (_, sealed) => {
      const a = await processOn('A', url, 1000, sealed);
      const b = await processOn('B', url, 1000, sealed);
      const jobs = [job('f/a'), job('f/b'), job('f/a', 'other')];
      for (const j of jobs) await a.cache.run(j);
      for (const j of jobs) expect((await b.cache.run(j)).fromCache).toBe(true); // now in B's memory
      // A writer that does not tag (another library, a hand-written entry): its runnable is
      // unknown, so it goes as its workspace would.
      await b.store.memory.set('inv/cache/untagged', new Uint8Array(8), 60_000);
      await b.store.memory.set('other/cache/untagged', new Uint8Array(8), 60_000);
      expect([a.store.memory.size, b.store.memory.size]).toEqual([3, 5]);
      const before = tagOf(b);
      await a.cache.invalidate({ workspace: 'inv', path: 'f/a' });
      await seen(b, before);
      // Both processes keep f/b and the other workspace's f/a; the invalidated path is gone.
      expect(b.store.memory.getNow('inv/cache/untagged')).toBeNull();
      expect(b.store.memory.getNow('other/cache/untagged')).not.toBeNull();
      expect([a.store.memory.size, b.store.memory.size]).toEqual([2, 3]);
      // What stayed is served from memory: Redis no longer holds any entry.
      await deleteKeys(raw, `${prefix}inv/`);
      await deleteKeys(raw, `${prefix}other/`);
      for (const p of [a, b]) {
        expect((await p.cache.run(job('f/b'))).fromCache).toBe(true);
        expect((await p.cache.run(job('f/a', 'other'))).fromCache).toBe(true);
      }
      expect((await b.cache.run(job('f/a'))).fromCache).toBe(false);
      expect(b.inner.calls).toBe(1);
      // A workspace invalidation still drops the whole workspace, tagged or not.
      await b.store.memory.set('inv/cache/untagged', new Uint8Array(8), 60_000);
      const again = tagOf(a);
      await b.cache.invalidate({ workspace: 'inv' });
      await seen(a, again);
      for (const p of [a, b]) expect(p.store.memory.getNow('inv/cache/untagged')).toBeNull();
      expect(a.store.memory.size).toBe(1); // other/…/f/a
    },
  );

  it('the fence, one process: a run started before invalidate and finished after is never served', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    const gate = a.holdNextRun();
    const inFlight = a.cache.run(job());
    await gate.started.promise;
    const before = tagOf(b);
    await a.cache.invalidate({ workspace: 'inv' }); // while the run is under way
    gate.release.resolve();
    const late = await inFlight;
    expect(late.fromCache).toBe(false); // its own caller gets it
    const lateRun = runOf(late.value);
    await seen(b, before);
    for (const p of [a, b, a]) {
      const next = await p.cache.run(job());
      expect(runOf(next.value) === lateRun && byOf(next.value) === 'A').toBe(false);
    }
    expect(a.cache.stats.notStored).toBeGreaterThanOrEqual(1); // it did not even write
  });

  it('the fence, another process: a run held in B across A’s invalidate is never served', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    const gate = b.holdNextRun();
    const inFlight = b.cache.run(job());
    await gate.started.promise;
    const before = tagOf(b);
    await a.cache.invalidate({ workspace: 'inv' });
    await seen(b, before);
    gate.release.resolve();
    const late = await inFlight;
    const lateRun = runOf(late.value);
    for (const p of [b, a, b]) {
      const next = await p.cache.run(job());
      expect(runOf(next.value) === lateRun && byOf(next.value) === 'B').toBe(false);
    }
  });

  it('the fence holds even when the late write lands: it is written under a key nobody reads', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    // A store whose writes wait: the invalidation happens after the cache decided to write
    // (its re-check passed) and before the bytes reach Redis.
    const writing = deferred();
    const writeMayLand = deferred();
    const slow: CacheStore = {
      get: (key) => a.store.get(key),
      delete: (key) => a.store.delete(key),
      invalidation: a.store.invalidation,
      async set(key, value, ttl) {
        writing.resolve();
        await writeMayLand.promise;
        await a.store.set(key, value, ttl);
      },
    };
    const cache = withResultCache(a.inner, { store: slow, seal: { secretKey } });
    const inFlight = cache.run(job());
    await writing.promise;
    const before = tagOf(b);
    await a.cache.invalidate({ workspace: 'inv' });
    await seen(b, before);
    writeMayLand.resolve();
    const lateRun = runOf((await inFlight).value);
    expect(await raw.keys(`${prefix}inv/cache/*`)).toHaveLength(1); // it did land
    for (const p of [b, a, b]) {
      const next = await p.cache.run(job());
      expect(runOf(next.value) === lateRun && byOf(next.value) === 'A').toBe(false);
    }
    expect(b.inner.calls).toBe(1); // B computed afresh once; A then shared B's entry
  });

  it('the bus connection killed: lookups read epochs from Redis (fail closed), then it recovers', async () => {
    const a = await processOn('A');
    const b = await processOn('B');
    await a.cache.run(job());
    expect((await b.cache.run(job())).fromCache).toBe(true);
    // Kill B's subscribed connection only, and invalidate while B cannot hear it.
    const list = (await raw.client('LIST')) as string;
    const line = list
      .split('\n')
      .find((l) => l.includes(`name=${b.store.invalidation.connectionName} `));
    expect(line).toBeDefined();
    const id = /(?:^|\s)id=(\d+)/.exec(line!)![1]!;
    await raw.client('KILL', 'ID', id);
    await waitUntil('B notices', () => !b.store.invalidation.confirmed);
    await a.cache.invalidate({ workspace: 'inv' });
    // No waiting for any message: B confirms epochs with Redis on every lookup meanwhile. (If B
    // reconnected already, it loaded the new epochs before confirming: the same answer.)
    const during = await b.cache.run(job());
    expect(during.fromCache).toBe(false);
    expect(byOf(during.value)).toBe('B');
    await b.store.invalidation.whenConfirmed();
    expect((await b.cache.run(job())).fromCache).toBe(true);
    expect((await a.cache.run(job())).fromCache).toBe(true);
  });

  it('a bus that stops answering (no reset) is noticed by the heartbeat; lookups fail closed', async () => {
    const proxy = await TcpProxy.start(redisAddress(url));
    proxies.push(proxy);
    const a = await processOn('A');
    const b = await processOn('B', redisAddress(url).via(proxy.port), 100);
    await b.cache.run(job());
    await proxy.setMode('blackhole');
    await waitUntil('B unconfirms', () => !b.store.invalidation.confirmed, 5000);
    await a.cache.invalidate({ workspace: 'inv' });
    // B can confirm nothing: its runs go uncached, never from a stale view.
    const calls = b.inner.calls;
    const during = await b.cache.run(job());
    expect(during.fromCache).toBe(false);
    expect(b.inner.calls).toBe(calls + 1);
    await proxy.setMode('forward');
    proxy.dropConnections();
    await b.store.invalidation.whenConfirmed();
    await waitUntil('B caches again', async () => (await b.cache.run(job())).fromCache);
  });

  it('Redis stopped entirely: runs go uncached, nothing crashes, and caching comes back', async () => {
    const proxy = await TcpProxy.start(redisAddress(url));
    proxies.push(proxy);
    const b = await processOn('B', redisAddress(url).via(proxy.port), 100);
    await b.cache.run(job());
    expect((await b.cache.run(job())).fromCache).toBe(true);
    await proxy.setMode('refuse');
    proxy.dropConnections();
    await waitUntil('B unconfirms', () => !b.store.invalidation.confirmed);
    for (let i = 0; i < 5; i++) {
      const r = await b.cache.run(job());
      expect(r.fromCache).toBe(false);
    }
    await expect(b.cache.invalidate({ workspace: 'inv' })).rejects.toMatchObject({
      code: 'E_STORE_UNAVAILABLE',
    });
    await proxy.setMode('forward');
    await b.store.invalidation.whenConfirmed();
    await waitUntil('B caches again', async () => (await b.cache.run(job())).fromCache);
  });

  it('refuses with E_INVALIDATION_UNSUPPORTED on a store that keeps no epochs', async () => {
    const cache = withResultCache(new CountingExecutor(), { store: new MemoryCacheStore() });
    await expect(cache.invalidate({ workspace: 'inv' })).rejects.toBeInstanceOf(
      InvalidationUnsupportedError,
    );
  });

  it('refuses a malformed scope', async () => {
    const a = await processOn('A');
    await expect(a.cache.invalidate({ workspace: '../x' })).rejects.toThrow(/workspace/);
    await expect(a.cache.invalidate({ workspace: 'inv', path: '' })).rejects.toThrow(/path/);
  });
});
