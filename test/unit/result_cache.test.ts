import { afterEach, describe, expect, it, vi } from 'vitest';
import { encodeEntry } from '../../src/cache/cache_entry.js';
import { canonicalKeyInput, keyDigest } from '../../src/cache/cache_key.js';
import type {
  CachedExecutor,
  CacheStore,
  JobResult,
  RawResultCacheOptions,
  ResultCacheEvents,
} from '../../src/index.js';
import { cachedResultPath, errors, MemoryCacheStore, withResultCache } from '../../src/index.js';
import { ManualClock } from '../helpers/clock.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { countdown, deferred } from '../helpers/deferred.js';
import { makeJob } from '../helpers/jobs.js';
import { captureLogger } from '../helpers/log_capture.js';

const alice = 'alice@example.com';
const bob = 'bob@example.com';
const args = { region: 'eu', limit: 10 };

type Viewed = { viewer: string | null; run: number };
const viewerOf = (result: JobResult) => (result.value as Viewed).viewer;

const open: CachedExecutor[] = [];

afterEach(() => {
  // Leak check: every flight ends, however its run ended.
  for (const cache of open.splice(0)) expect(cache.inFlight).toBe(0);
});

function setup(
  options: Partial<RawResultCacheOptions> = {},
  inner: CountingExecutor = new CountingExecutor(),
) {
  const clock = new ManualClock();
  const store = new MemoryCacheStore({ now: clock.now });
  const cache = withResultCache(inner, { store, now: clock.now, ...options });
  open.push(cache);
  return { clock, store, cache, inner };
}

const job = (viewer: string | null, extra: Partial<Parameters<typeof makeJob>[0]> = {}) =>
  makeJob({ viewer, args, cacheTtlS: 60, ...extra });

describe('two viewers, same runnable and args (SPEC invariants 3 and 4)', () => {
  it('sequentially: each gets only its own value, each executes once', async () => {
    const { cache, inner } = setup();
    const a1 = await cache.run(job(alice));
    const b1 = await cache.run(job(bob));
    const a2 = await cache.run(job(alice));
    const b2 = await cache.run(job(bob));
    expect([viewerOf(a1), viewerOf(b1), viewerOf(a2), viewerOf(b2)]).toEqual([
      alice,
      bob,
      alice,
      bob,
    ]);
    expect([a1.fromCache, b1.fromCache, a2.fromCache, b2.fromCache]).toEqual([
      false,
      false,
      true,
      true,
    ]);
    expect(inner.callsFor(alice)).toBe(1);
    expect(inner.callsFor(bob)).toBe(1);
    expect(cache.stats).toMatchObject({ hits: 2, misses: 2, coalesced: 0, stored: 2 });
  });

  it('concurrently: never coalesced, each gets only its own value, each executes once', async () => {
    const gate = deferred();
    // every call either starts an execution or joins one: wait for all four, then look
    const settledIn = countdown(4);
    const inner = new CountingExecutor(async (j) => {
      settledIn.arrive();
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache } = setup({}, inner);
    cache.events.on('cache:coalesced', () => settledIn.arrive());
    const runs = [alice, bob, alice, bob].map((viewer) => cache.run(job(viewer)));
    await settledIn.done;
    // Both executions are underway at once: bob did not wait on alice's run or join it.
    expect(inner.calls).toBe(2);
    gate.resolve();
    const results = await Promise.all(runs);
    expect(results.map(viewerOf)).toEqual([alice, bob, alice, bob]);
    expect(inner.callsFor(alice)).toBe(1);
    expect(inner.callsFor(bob)).toBe(1);
    expect(cache.stats.coalesced).toBe(2);
    const again = await Promise.all([cache.run(job(bob)), cache.run(job(alice))]);
    expect(again.map(viewerOf)).toEqual([bob, alice]);
    expect(again.every((r) => r.fromCache)).toBe(true);
    expect(inner.calls).toBe(2);
  });

  it('no viewer, the empty string and "null" are three viewers, none shared with an email', async () => {
    const { cache, inner } = setup();
    const viewers = [null, '', 'null', alice];
    for (const viewer of viewers) expect(viewerOf(await cache.run(job(viewer)))).toBe(viewer);
    for (const viewer of viewers) {
      const result = await cache.run(job(viewer));
      expect(result.fromCache).toBe(true);
      expect(viewerOf(result)).toBe(viewer);
    }
    expect(inner.calls).toBe(4);
  });

  it('runs with no viewer share one entry', async () => {
    const { cache, inner } = setup();
    await cache.run(job(null, { runAs: 'publisher-a@example.com' }));
    const second = await cache.run(job(null, { runAs: 'publisher-b@example.com' }));
    expect(second.fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });
});

describe('coalescing (single flight on the full key)', () => {
  it('50 concurrent calls by one viewer execute once', async () => {
    const gate = deferred();
    const inner = new CountingExecutor(async (j) => {
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache } = setup({}, inner);
    const joined = countdown(49);
    cache.events.on('cache:coalesced', () => joined.arrive());
    const runs = Array.from({ length: 50 }, (_, i) => cache.run({ ...job(alice), id: `j${i}` }));
    await joined.done;
    expect(cache.inFlight).toBe(1);
    gate.resolve();
    const results = await Promise.all(runs);
    expect(inner.calls).toBe(1);
    expect(results.every((r) => viewerOf(r) === alice && !r.fromCache)).toBe(true);
    // each caller gets a result under its own job id, with the same bytes
    expect(results.map((r) => r.jobId)).toEqual(Array.from({ length: 50 }, (_, i) => `j${i}`));
    const bytes = Buffer.from(results[0]!.json()).toString();
    expect(results.every((r) => Buffer.from(r.json()).toString() === bytes)).toBe(true);
    expect(cache.stats).toMatchObject({ misses: 1, coalesced: 49, stored: 1, hits: 0 });
  });

  it('different viewers never coalesce: 10 viewers × 5 concurrent calls → 10 executions', async () => {
    const gate = deferred();
    const inner = new CountingExecutor(async (j) => {
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache } = setup({}, inner);
    const joined = countdown(40);
    cache.events.on('cache:coalesced', () => joined.arrive());
    const viewers = Array.from({ length: 10 }, (_, i) => (i === 0 ? null : `user${i}@example.com`));
    const runs = viewers.flatMap((viewer) =>
      Array.from({ length: 5 }, () => cache.run(job(viewer)).then((r) => [viewer, r] as const)),
    );
    await joined.done;
    expect(inner.calls).toBe(10);
    gate.resolve();
    for (const [viewer, result] of await Promise.all(runs)) expect(viewerOf(result)).toBe(viewer);
    for (const viewer of viewers) expect(inner.callsFor(viewer)).toBe(1);
  });

  it('different fingerprints of one viewer never coalesce', async () => {
    const gate = deferred();
    const settledIn = countdown(2);
    const inner = new CountingExecutor(async (j) => {
      settledIn.arrive();
      await gate.promise;
      return { viewer: j.perms.endUserEmail, fingerprint: j.args['fingerprint'] };
    });
    // the fingerprint comes from outside the job (as a role fingerprint would); args stay equal
    let fingerprint = 'roles-a';
    const { cache } = setup({ fingerprint: () => fingerprint }, inner);
    cache.events.on('cache:coalesced', () => settledIn.arrive());
    const a = cache.run(job(alice));
    await Promise.resolve();
    fingerprint = 'roles-b';
    const b = cache.run(job(alice));
    await settledIn.done;
    expect(inner.calls).toBe(2);
    gate.resolve();
    await Promise.all([a, b]);
    expect(inner.calls).toBe(2);
  });
});

describe('only successes are cached (SPEC invariant 11)', () => {
  it('an error is not cached: the next call executes again', async () => {
    let fail = true;
    const inner = new CountingExecutor((j) => {
      if (fail) throw new errors.E_EXECUTOR_FAILED('boom');
      return { viewer: j.perms.endUserEmail };
    });
    const { cache, store } = setup({}, inner);
    await expect(cache.run(job(alice))).rejects.toMatchObject({ code: 'E_EXECUTOR_FAILED' });
    expect(store.size).toBe(0);
    await expect(cache.run(job(alice))).rejects.toMatchObject({ code: 'E_EXECUTOR_FAILED' });
    expect(inner.calls).toBe(2);
    fail = false;
    const ok = await cache.run(job(alice));
    expect(ok.fromCache).toBe(false);
    expect(inner.calls).toBe(3);
    expect((await cache.run(job(alice))).fromCache).toBe(true);
    expect(cache.stats).toMatchObject({ stored: 1, notStored: 0, misses: 3, hits: 1 });
  });

  it('a refusal (E_NO_VIEWER) is not cached either', async () => {
    const inner = new CountingExecutor(() => {
      throw new errors.E_NO_VIEWER();
    });
    const { cache } = setup({}, inner);
    await expect(cache.run(job(null))).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    await expect(cache.run(job(null))).rejects.toMatchObject({ code: 'E_NO_VIEWER' });
    expect(inner.calls).toBe(2);
    expect(cache.stats.stored).toBe(0);
  });

  it('the error reaches every coalesced caller, and the one after re-executes', async () => {
    const gate = deferred();
    const failure = new errors.E_EXECUTOR_FAILED('boom');
    const inner = new CountingExecutor(async () => {
      await gate.promise;
      throw failure;
    });
    const { cache } = setup({}, inner);
    const joined = countdown(9);
    cache.events.on('cache:coalesced', () => joined.arrive());
    const runs = Array.from({ length: 10 }, () => cache.run(job(alice)));
    await joined.done;
    gate.resolve();
    const settled = await Promise.allSettled(runs);
    expect(settled.every((s) => s.status === 'rejected' && s.reason === failure)).toBe(true);
    expect(inner.calls).toBe(1);
    await expect(cache.run(job(alice))).rejects.toBe(failure);
    expect(inner.calls).toBe(2);
    expect(cache.stats.stored).toBe(0);
  });
});

describe('TTL', () => {
  it('a hit until the TTL passes, then the run executes again', async () => {
    const { cache, clock, inner } = setup();
    await cache.run(job(alice, { cacheTtlS: 60 }));
    clock.advance(59_999);
    expect((await cache.run(job(alice, { cacheTtlS: 60 }))).fromCache).toBe(true);
    clock.advance(2);
    const after = await cache.run(job(alice, { cacheTtlS: 60 }));
    expect(after.fromCache).toBe(false);
    expect(inner.calls).toBe(2);
    expect((await cache.run(job(alice, { cacheTtlS: 60 }))).fromCache).toBe(true);
  });

  it('the envelope expiry holds even if the store keeps the entry longer', async () => {
    const clock = new ManualClock();
    const forever = new Map<string, Uint8Array>();
    const store: CacheStore = {
      get: async (k) => forever.get(k) ?? null,
      set: async (k, v) => void forever.set(k, v),
      delete: async (k) => void forever.delete(k),
      shared: false,
    };
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store, now: clock.now });
    const rejected: string[] = [];
    cache.events.on('cache:rejected', (e) => rejected.push(e.reason));
    await cache.run(job(alice, { cacheTtlS: 1 }));
    clock.advance(1000);
    expect((await cache.run(job(alice, { cacheTtlS: 1 }))).fromCache).toBe(false);
    expect(rejected).toEqual(['expired']);
    expect(cache.stats.rejected).toBe(1);
    expect(inner.calls).toBe(2);
  });

  it('caps cacheTtlS at maxTtl', async () => {
    const { cache, clock, inner } = setup({ maxTtl: '1h' });
    await cache.run(job(alice, { cacheTtlS: 864_000 }));
    clock.advance(3_600_001);
    expect((await cache.run(job(alice, { cacheTtlS: 864_000 }))).fromCache).toBe(false);
    expect(inner.calls).toBe(2);
  });

  it.each([
    ['absent', undefined],
    ['0', 0],
    ['negative', -5],
  ])('cacheTtlS %s bypasses the cache entirely', async (_name, cacheTtlS) => {
    const get = vi.fn(async () => null);
    const set = vi.fn(async () => {});
    const store: CacheStore = { get, set, delete: async () => {}, shared: false };
    const inner = new CountingExecutor();
    const cache = withResultCache(inner, { store });
    const reasons: string[] = [];
    cache.events.on('cache:bypass', (e) => reasons.push(e.reason));
    for (let i = 0; i < 3; i++) {
      const result = await cache.run(job(alice, { cacheTtlS }));
      expect(result.fromCache).toBe(false);
    }
    expect(inner.calls).toBe(3);
    expect(get).not.toHaveBeenCalled();
    expect(set).not.toHaveBeenCalled();
    expect(cache.stats).toMatchObject({ bypasses: 3, misses: 0, hits: 0, stored: 0 });
    expect(reasons).toEqual(['no-ttl', 'no-ttl', 'no-ttl']);
  });

  it('refuses a cacheTtlS that is not a number', async () => {
    const { cache, inner } = setup();
    for (const cacheTtlS of [Number.NaN, '60' as unknown as number]) {
      await expect(cache.run(job(alice, { cacheTtlS }))).rejects.toMatchObject({
        code: 'E_INVALID_JOB',
      });
    }
    expect(inner.calls).toBe(0);
  });
});

describe('a hit', () => {
  it('returns fromCache and exactly the stored bytes, parsing the value only when read', async () => {
    const { cache, store } = setup();
    const first = await cache.run(job(alice));
    const stored = Buffer.from(first.json());
    const j = job(alice);
    const entry = await store.get(cachedResultPath(j));
    expect(entry).not.toBeNull();

    const parse = vi.spyOn(JSON, 'parse');
    try {
      const hit = await cache.run(j);
      expect(hit.fromCache).toBe(true);
      expect(hit.jobId).toBe(j.id);
      const bytes = hit.json();
      expect(Buffer.from(bytes).equals(stored)).toBe(true);
      // the very bytes the store holds: a view into the entry, not a copy or a re-serialisation
      expect(bytes.buffer).toBe(entry!.buffer);
      expect(bytes.byteOffset + bytes.byteLength).toBe(entry!.byteOffset + entry!.byteLength);
      expect(parse).not.toHaveBeenCalled();
      expect(hit.value).toEqual(first.value);
      expect(parse).toHaveBeenCalledTimes(1);
      void hit.value;
      expect(parse).toHaveBeenCalledTimes(1);
    } finally {
      parse.mockRestore();
    }
  });

  it('does not execute and opens nothing', async () => {
    const { cache, inner } = setup();
    await cache.run(job(alice));
    const hit = await cache.run(job(alice));
    expect(hit.fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });
});

describe('the fingerprint option', () => {
  it('different fingerprints never share an entry', async () => {
    let fingerprint = 'roles:1';
    const { cache, inner } = setup({ fingerprint: async () => fingerprint });
    await cache.run(job(alice));
    expect((await cache.run(job(alice))).fromCache).toBe(true);
    fingerprint = 'roles:2';
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    fingerprint = 'roles:1';
    expect((await cache.run(job(alice))).fromCache).toBe(true);
    expect(inner.calls).toBe(2);
  });

  it('a null fingerprint and a string "null" fingerprint are different entries', async () => {
    let fingerprint: string | null = null;
    const { cache, inner } = setup({ fingerprint: () => fingerprint });
    await cache.run(job(alice));
    fingerprint = 'null';
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    expect(inner.calls).toBe(2);
  });

  it('a fingerprint that throws runs uncached and is never served from the cache', async () => {
    let broken = false;
    const { cache, inner, store } = setup({
      fingerprint: () => {
        if (broken) throw new Error('catalog unreachable');
        return 'roles:1';
      },
    });
    await cache.run(job(alice));
    expect(store.size).toBe(1);
    broken = true;
    const reasons: string[] = [];
    cache.events.on('cache:bypass', (e) => reasons.push(e.reason));
    for (let i = 0; i < 3; i++) expect((await cache.run(job(alice))).fromCache).toBe(false);
    expect(inner.calls).toBe(4);
    expect(reasons).toEqual(['fingerprint-failed', 'fingerprint-failed', 'fingerprint-failed']);
    expect(cache.stats).toMatchObject({ stored: 1, bypasses: 3, hits: 0 });
  });

  it('a failing fingerprint is logged once per burst, and its recovery once', async () => {
    let broken = true;
    const { logger, lines } = captureLogger();
    const { cache } = setup({
      logger,
      fingerprint: () => {
        if (broken) throw new Error('catalog unreachable');
        return 'roles:1';
      },
    });
    for (let i = 0; i < 5; i++) await cache.run(job(alice));
    broken = false;
    await cache.run(job(alice));
    broken = true;
    await cache.run(job(alice));
    const messages = lines().map((line) => line['msg']);
    expect(messages.filter((m) => String(m).startsWith('cache fingerprint failed'))).toHaveLength(
      2,
    );
    expect(messages.filter((m) => m === 'cache fingerprint answering again')).toHaveLength(1);
  });

  it('a fingerprint that throws on the first run stores nothing', async () => {
    let broken = true;
    const { cache, inner, store } = setup({
      fingerprint: async () => {
        if (broken) throw new Error('catalog unreachable');
        return 'roles:1';
      },
    });
    await cache.run(job(alice));
    expect(store.size).toBe(0);
    broken = false;
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    expect(inner.calls).toBe(2);
  });

  it('a fingerprint that moves during execution: result returned, not stored, next call re-executes', async () => {
    let fingerprint = 'roles:1';
    const gate = deferred();
    const started = deferred();
    const inner = new CountingExecutor(async (j) => {
      started.resolve();
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache, store } = setup({ fingerprint: () => fingerprint }, inner);
    const notStored: string[] = [];
    cache.events.on('cache:not-stored', (e) => notStored.push(e.reason));
    const run = cache.run(job(alice));
    await started.promise;
    fingerprint = 'roles:2';
    gate.resolve();
    const result = await run;
    expect(viewerOf(result)).toBe(alice);
    expect(result.fromCache).toBe(false);
    expect(notStored).toEqual(['fingerprint-moved']);
    expect(store.size).toBe(0);
    expect(cache.stats).toMatchObject({ stored: 0, notStored: 1 });
    // neither the old nor the new fingerprint holds the result
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    fingerprint = 'roles:1';
    inner.behaviour = (j) => ({ viewer: j.perms.endUserEmail });
    expect((await cache.run(job(alice))).fromCache).toBe(false);
    expect(inner.calls).toBe(3);
  });

  it('a fingerprint that throws while storing counts as moved', async () => {
    let calls = 0;
    const { cache, store } = setup({
      fingerprint: () => {
        if (++calls === 2) throw new Error('catalog unreachable');
        return 'roles:1';
      },
    });
    await cache.run(job(alice));
    expect(store.size).toBe(0);
    expect(cache.stats.notStored).toBe(1);
  });
});

describe('entries that do not verify are misses (SPEC invariant 11)', () => {
  it('a corrupted entry is rejected, re-executed and overwritten', async () => {
    const { cache, store, inner } = setup();
    const j = job(alice);
    const key = cachedResultPath(j);
    await store.set(key, Buffer.from('garbage, not an envelope'), 60_000);
    const reasons: string[] = [];
    cache.events.on('cache:rejected', (e) => reasons.push(e.reason));
    const result = await cache.run(j);
    expect(result.fromCache).toBe(false);
    expect(viewerOf(result)).toBe(alice);
    expect(reasons).toEqual(['corrupt']);
    expect(cache.stats).toMatchObject({ rejected: 1, misses: 1, stored: 1 });
    expect((await cache.run(j)).fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });

  it("another viewer's valid entry copied under this key is rejected as foreign", async () => {
    const { cache, store, inner } = setup();
    await cache.run(job(bob));
    const bobsEntry = await store.get(cachedResultPath(job(bob)));
    const alicesKey = cachedResultPath(job(alice));
    await store.set(alicesKey, bobsEntry!, 60_000);
    const reasons: string[] = [];
    cache.events.on('cache:rejected', (e) => reasons.push(e.reason));
    const result = await cache.run(job(alice));
    expect(viewerOf(result)).toBe(alice);
    expect(result.fromCache).toBe(false);
    expect(reasons).toEqual(['foreign-key']);
    expect(inner.calls).toBe(2);
    const again = await cache.run(job(alice));
    expect(again.fromCache).toBe(true);
    expect(viewerOf(again)).toBe(alice);
  });

  it('an entry with the right key but expired inside is rejected', async () => {
    const { cache, store, clock } = setup();
    const j = job(alice);
    const key = cachedResultPath(j);
    const digest = keyDigest(canonicalKeyInput(j));
    await store.set(key, encodeEntry(digest, clock.now() - 1, Buffer.from('"stale"')), 60_000);
    const result = await cache.run(j);
    expect(result.value).not.toBe('stale');
    expect(cache.stats.rejected).toBe(1);
  });
});

describe('results that are not stored', () => {
  it('a result larger than maxEntryBytes is returned but not stored', async () => {
    const inner = new CountingExecutor(() => 'x'.repeat(100));
    const { cache, store } = setup({ maxEntryBytes: 50 }, inner);
    const reasons: string[] = [];
    cache.events.on('cache:not-stored', (e) => reasons.push(e.reason));
    expect((await cache.run(job(alice))).value).toBe('x'.repeat(100));
    expect(store.size).toBe(0);
    expect(reasons).toEqual(['too-large']);
  });

  it('a result JSON cannot carry is returned but not stored', async () => {
    const inner = new CountingExecutor(() => ({ n: 1n }));
    const { cache, store } = setup({}, inner);
    const result = await cache.run(job(alice));
    expect(result.value).toEqual({ n: 1n });
    expect(store.size).toBe(0);
    expect(cache.stats).toMatchObject({ notStored: 1, stored: 0 });
  });
});

describe('coalesced callers see what the leader sees', () => {
  it('a result JSON cannot carry: every caller gets the value, not only the first', async () => {
    const gate = deferred();
    const inner = new CountingExecutor(async () => {
      await gate.promise;
      return { n: 1n };
    });
    const { cache } = setup({}, inner);
    const joined = countdown(2);
    cache.events.on('cache:coalesced', () => joined.arrive());
    const runs = [cache.run(job(alice)), cache.run(job(alice)), cache.run(job(alice))];
    await joined.done;
    gate.resolve();
    const settled = await Promise.allSettled(runs);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
    for (const s of settled) {
      if (s.status === 'fulfilled') expect(s.value.value).toEqual({ n: 1n });
    }
    expect(inner.calls).toBe(1);
  });
});

describe('args', () => {
  it('args JSON cannot carry are refused before anything executes', async () => {
    const { cache, inner } = setup();
    await expect(cache.run(job(alice, { args: { at: new Date() } }))).rejects.toMatchObject({
      code: 'E_ARGS_NOT_JSON',
    });
    expect(inner.calls).toBe(0);
  });

  it('permuted args share an entry', async () => {
    const { cache, inner } = setup();
    await cache.run(job(alice, { args: { a: 1, b: 2 } }));
    expect((await cache.run(job(alice, { args: { b: 2, a: 1 } }))).fromCache).toBe(true);
    expect(inner.calls).toBe(1);
  });
});

describe('events and stats', () => {
  const allEvents: Array<keyof ResultCacheEvents> = [
    'cache:hit',
    'cache:miss',
    'cache:coalesced',
    'cache:bypass',
    'cache:stored',
    'cache:not-stored',
    'cache:rejected',
    'store:error',
  ];

  function record(cache: CachedExecutor) {
    const seen: Array<[string, unknown]> = [];
    for (const name of allEvents) {
      cache.events.on(name, (payload: unknown) => seen.push([name, payload]));
    }
    return seen;
  }

  it('move as documented over miss, hit, coalesced, bypass and rejected', async () => {
    const gate = deferred();
    const inner = new CountingExecutor(async (j) => {
      await gate.promise;
      return { viewer: j.perms.endUserEmail };
    });
    const { cache, store } = setup({}, inner);
    const seen = record(cache);
    const zero = {
      hits: 0,
      misses: 0,
      coalesced: 0,
      bypasses: 0,
      stored: 0,
      notStored: 0,
      rejected: 0,
      storeErrors: 0,
    };
    expect(cache.stats).toEqual(zero);

    const joined = deferred();
    cache.events.on('cache:coalesced', () => joined.resolve());
    const first = cache.run(job(alice));
    const second = cache.run(job(alice));
    await joined.promise;
    gate.resolve();
    await Promise.all([first, second]);
    expect(cache.stats).toEqual({ ...zero, misses: 1, coalesced: 1, stored: 1 });

    await cache.run(job(alice));
    expect(cache.stats).toEqual({ ...zero, misses: 1, coalesced: 1, stored: 1, hits: 1 });

    await cache.run(job(alice, { cacheTtlS: 0 }));
    expect(cache.stats.bypasses).toBe(1);

    await store.set(cachedResultPath(job(bob)), Buffer.from('junk'), 60_000);
    await cache.run(job(bob));
    expect(cache.stats).toEqual({
      ...zero,
      misses: 2,
      coalesced: 1,
      stored: 2,
      hits: 1,
      bypasses: 1,
      rejected: 1,
    });

    const where = { workspace: 'ws', path: 'f/app/report' };
    expect(seen).toEqual([
      ['cache:miss', where],
      ['cache:coalesced', where],
      ['cache:stored', { ...where, bytes: expect.any(Number) }],
      ['cache:hit', where],
      ['cache:bypass', { ...where, reason: 'no-ttl' }],
      ['cache:rejected', { ...where, reason: 'corrupt' }],
      ['cache:miss', where],
      ['cache:stored', { ...where, bytes: expect.any(Number) }],
    ]);
    // payloads never carry a viewer, args, a key or a value
    const text = JSON.stringify(seen);
    for (const secret of [alice, bob, 'eu', '/cache/']) expect(text).not.toContain(secret);
  });

  it('a listener that throws does not break a run', async () => {
    const { cache, inner } = setup();
    for (const name of allEvents) {
      cache.events.on(name, () => {
        throw new Error('faulty listener');
      });
    }
    const counted: string[] = [];
    cache.events.on('cache:miss', () => counted.push('miss'));
    expect(viewerOf(await cache.run(job(alice)))).toBe(alice);
    expect((await cache.run(job(alice))).fromCache).toBe(true);
    expect(counted).toEqual(['miss']);
    expect(inner.calls).toBe(1);
  });

  it('off() removes a listener', async () => {
    const { cache } = setup();
    const misses: unknown[] = [];
    const listener = (e: unknown) => misses.push(e);
    cache.events.on('cache:miss', listener);
    await cache.run(job(alice));
    cache.events.off('cache:miss', listener);
    await cache.run(job(bob));
    expect(misses).toHaveLength(1);
  });
});

describe('options', () => {
  it('refuse bad input with a TypeError naming the problem', () => {
    const store = new MemoryCacheStore();
    const inner = new CountingExecutor();
    expect(() => withResultCache({} as never, { store })).toThrow(TypeError);
    expect(() => withResultCache(inner, null as never)).toThrow(TypeError);
    expect(() => withResultCache(inner, { store: {} as never })).toThrow(/store/);
    expect(() => withResultCache(inner, { store, fingerprint: 'x' as never })).toThrow(
      /fingerprint/,
    );
    expect(() => withResultCache(inner, { store, maxTtl: -1 })).toThrow(/maxTtl/);
    expect(() => withResultCache(inner, { store, storeRestAfterFailure: 'soon' })).toThrow(
      /storeRestAfterFailure/,
    );
  });
});
