import { describe, expect, it } from 'vitest';
import {
  type CacheStore,
  cachedResultPath,
  type Job,
  MemoryCacheStore,
  type RunOptions,
  withResultCache,
} from '../../src/index.js';
import { GIVEN_RUN, NAMED_RUN, type NamedRun, namedRunOf } from '../../src/named_run.js';
import { QueueKeys } from '../../src/queue/queue_seal.js';
import { openJobRecord, sealJob } from '../../src/queue/sealed_job.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';

// A queued miss's key is derived once, by the server's cache, and travels sealed in the job's
// record; the worker's cache stores under it only when the fingerprint it computes is the one
// the key was derived with (SPEC 10: a result is never written under a key its authorization
// does not hold). Unsealed entries here, so the key the job's fields give is `cachedResultPath`.

/** A store that records the keys written to it. */
function recordingStore(): { store: CacheStore; written: string[] } {
  const inner = new MemoryCacheStore();
  const written: string[] = [];
  const store: CacheStore = {
    get: (key) => inner.get(key),
    set: (key, value, ttlMs) => {
      written.push(key);
      return inner.set(key, value, ttlMs);
    },
    delete: (key) => inner.delete(key),
    shared: false,
  };
  return { store, written };
}

const job = (n: number): Job =>
  makeJob({ viewer: 'alice@example.com', args: { n }, cacheTtlS: 60 });
const FINGERPRINT = 'roles-v7';
const fingerprint = () => FINGERPRINT;
const given = (over: Partial<NamedRun> = {}): NamedRun => ({
  digest: 'ab'.repeat(32),
  fingerprint: FINGERPRINT,
  ...over,
});

describe('a cache names its run for the executor it wraps', () => {
  it('hands the digest and fingerprint of the key it looked up, and no key it was given', async () => {
    const { store, written } = recordingStore();
    const seen: (RunOptions & { [NAMED_RUN]?: NamedRun; [GIVEN_RUN]?: NamedRun })[] = [];
    const inner = new CountingExecutor((_job, options) => {
      seen.push(options ?? {});
      return 1;
    });
    const cache = withResultCache(inner, { store, fingerprint });
    await cache.run(job(1));
    const named = seen[0]![NAMED_RUN]!;
    expect(named.fingerprint).toBe(FINGERPRINT);
    // The very key the result was stored under, and the flight names the same.
    expect(`ws/cache/${named.digest}`).toBe(cachedResultPath(job(1), FINGERPRINT));
    expect(written).toEqual([cachedResultPath(job(1), FINGERPRINT)]);
    expect(seen[0]!.flight).toBe(written[0]);
    // Given one (a worker's job), it is not passed on: a nested cache derives its own.
    await cache.run(job(2), { [GIVEN_RUN]: given() } as RunOptions);
    expect(seen[1]![GIVEN_RUN]).toBeUndefined();
  });
});

describe("a worker's cache given the key its server named", () => {
  it('stores under it when the fingerprint it computes is the one named', async () => {
    const { store, written } = recordingStore();
    const cache = withResultCache(new CountingExecutor(), { store, fingerprint });
    const options = { knownMiss: true, [GIVEN_RUN]: given() } as RunOptions;
    expect((await cache.run(job(3), options)).fromCache).toBe(false);
    expect(written).toEqual([`ws/cache/${'ab'.repeat(32)}`]);
  });

  it('derives its own when the fingerprint differs, or the cache has none and one was named', async () => {
    const { store, written } = recordingStore();
    const cache = withResultCache(new CountingExecutor(), { store, fingerprint });
    const moved = { knownMiss: true, [GIVEN_RUN]: given({ fingerprint: 'roles-v6' }) };
    await cache.run(job(4), moved as RunOptions);
    expect(written).toEqual([cachedResultPath(job(4), FINGERPRINT)]);

    const plain = recordingStore();
    const unfingerprinted = withResultCache(new CountingExecutor(), { store: plain.store });
    await unfingerprinted.run(job(5), { knownMiss: true, [GIVEN_RUN]: given() } as RunOptions);
    expect(plain.written).toEqual([cachedResultPath(job(5), null)]);
  });

  it('with a fingerprint that is a promise, the same rule', async () => {
    const { store, written } = recordingStore();
    const later = async () => FINGERPRINT;
    const cache = withResultCache(new CountingExecutor(), { store, fingerprint: later });
    await cache.run(job(6), { knownMiss: true, [GIVEN_RUN]: given() } as RunOptions);
    await cache.run(job(7), {
      knownMiss: true,
      [GIVEN_RUN]: given({ fingerprint: null }),
    } as RunOptions);
    expect(written).toEqual([`ws/cache/${'ab'.repeat(32)}`, cachedResultPath(job(7), FINGERPRINT)]);
  });
});

describe('the named run in the sealed record', () => {
  const keys = new QueueKeys('a-deployment-secret-for-named-runs-0001');
  const place = { prefix: 'vc', name: 'jobs/ws/default' };
  const queueId = keys.queueId('flight');
  const deadline = Date.now() + 60_000;
  /** The record's fields, opened as any reader does (the associated data of sealed_job.ts). */
  const fields = (record: string) => {
    const bound = ['job record v1', place.prefix, place.name, 'ws', queueId, deadline];
    return JSON.parse(keys.openRecord(JSON.stringify(bound), record) ?? 'null') as unknown[] | null;
  };

  it('opens with the key beside the origin, and a record without one opens with none', () => {
    const withKey = sealJob(keys, place, job(8), 'app', queueId, deadline, null, null, given());
    expect(openJobRecord(keys, place, withKey)?.named).toEqual(given());
    const without = sealJob(keys, place, job(8), 'app', queueId, deadline);
    expect(openJobRecord(keys, place, without)?.named).toBeNull();
  });

  it('keeps the fields a worker of an earlier version reads: their number, and every slot but the origin', () => {
    const one = job(9);
    const a = sealJob(keys, place, one, 'app', queueId, deadline, null, 'http://s:1', given());
    const b = sealJob(keys, place, one, 'app', queueId, deadline, null, 'http://s:1');
    const withKey = fields(a.record);
    const without = fields(b.record);
    // Such a worker refuses a record of more than 9 fields and skips slot 5 (the origin).
    expect(withKey).not.toBeNull();
    expect(withKey!.length).toBe(without!.length);
    expect(withKey!.length).toBeLessThanOrEqual(9);
    expect(withKey!.filter((_, i) => i !== 5)).toEqual(without!.filter((_, i) => i !== 5));
  });

  it('a malformed one is no key at all: the worker derives its own', () => {
    expect(namedRunOf('app')).toBeNull();
    expect(namedRunOf({ origin: 'app' })).toBeNull();
    expect(namedRunOf({ digest: 'AB'.repeat(32), fingerprint: null })).toBeNull();
    expect(namedRunOf({ digest: 'ab'.repeat(31), fingerprint: null })).toBeNull();
    expect(namedRunOf({ digest: `${'ab'.repeat(32)}/`, fingerprint: null })).toBeNull();
    expect(namedRunOf({ digest: 'ab'.repeat(32), fingerprint: 7 })).toBeNull();
    expect(namedRunOf({ digest: 'ab'.repeat(32) })).toBeNull();
    expect(namedRunOf({ digest: 'ab'.repeat(32), fingerprint: null })).toEqual({
      digest: 'ab'.repeat(32),
      fingerprint: null,
    });
  });
});
