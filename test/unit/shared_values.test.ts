import { describe, expect, it } from 'vitest';
import { createViewerCache, MemoryCacheStore, withResultCache } from '../../src/index.js';
import { deepFreeze } from '../../src/job_result.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';

// `values: 'shared'` hands every hit of one entry the same deep-frozen parsed value (no parse
// per hit); `'fresh'` (the default) parses per hit. Either way, nothing a caller does to what
// it got changes what another hit returns, and no value is ever shared between two keys.

const alice = 'alice@example.com';
const bob = 'bob@example.com';
const rows = () => ({ rows: [{ id: 1, tags: ['a'] }], total: 1 });

function cacheWith(values: 'fresh' | 'shared' | undefined) {
  const inner = new CountingExecutor(() => rows());
  const cache = withResultCache(inner, {
    store: new MemoryCacheStore(),
    ...(values === undefined ? {} : { values }),
  });
  return { cache, inner };
}

type Rows = { rows: { id: number; tags: string[] }[]; total: number };

describe("values: 'shared' — one frozen value per entry, never across keys", () => {
  it('hits of the same key get the same deep-frozen value; a write cannot reach the next hit', async () => {
    const { cache, inner } = cacheWith('shared');
    const job = makeJob({ viewer: alice });
    await cache.run(job); // miss: computed and stored
    const first = await cache.run({ ...job, id: 'h1' });
    const second = await cache.run({ ...job, id: 'h2' });
    expect(first.fromCache && second.fromCache).toBe(true);
    expect(inner.calls).toBe(1);
    const value = first.value as Rows;
    expect(second.value).toBe(value);
    expect(Object.isFrozen(value)).toBe(true);
    expect(Object.isFrozen(value.rows)).toBe(true);
    expect(Object.isFrozen(value.rows[0])).toBe(true);
    expect(Object.isFrozen(value.rows[0]!.tags)).toBe(true);
    // Test files are modules (strict): every kind of write throws, and nothing changed.
    expect(() => {
      value.total = 99;
    }).toThrow(TypeError);
    expect(() => value.rows.push({ id: 2, tags: [] })).toThrow(TypeError);
    expect(() => {
      value.rows[0]!.id = 7;
    }).toThrow(TypeError);
    expect(() => value.rows[0]!.tags.pop()).toThrow(TypeError);
    const third = await cache.run({ ...job, id: 'h3' });
    expect(third.value).toEqual(rows());
    expect(third.jobId).toBe('h3');
  });

  it('two viewers with byte-identical results never share a value object', async () => {
    const { cache } = cacheWith('shared');
    const forAlice = makeJob({ viewer: alice });
    const forBob = makeJob({ viewer: bob });
    const forNobody = makeJob({ viewer: null });
    for (const job of [forAlice, forBob, forNobody]) await cache.run(job);
    const a = (await cache.run(forAlice)).value;
    const b = (await cache.run(forBob)).value;
    const n = (await cache.run(forNobody)).value;
    expect(a).toEqual(b);
    expect(a).not.toBe(b);
    expect(a).not.toBe(n);
    expect(b).not.toBe(n);
    // Nor two args of the same viewer.
    const other = makeJob({ viewer: alice, args: { region: 'amer' } });
    await cache.run(other);
    expect((await cache.run(other)).value).not.toBe(a);
  });

  it('a new result under the same key is a new value, not the one parsed before', async () => {
    let run = 0;
    const inner = new CountingExecutor(() => ({ run: ++run }));
    const store = new MemoryCacheStore();
    const cache = withResultCache(inner, { store, values: 'shared' });
    const job = makeJob({ viewer: alice });
    await cache.run(job);
    expect((await cache.run(job)).value).toEqual({ run: 1 });
    await store.close(); // drops every entry: the next run computes and stores anew
    await cache.run(job);
    expect((await cache.run(job)).value).toEqual({ run: 2 });
  });

  it('the bytes stay the stored JSON; a miss still hands back the computed value as is', async () => {
    const { cache } = cacheWith('shared');
    const job = makeJob({ viewer: alice });
    const miss = await cache.run(job);
    expect(miss.fromCache).toBe(false);
    expect(Object.isFrozen(miss.value)).toBe(false);
    const hit = await cache.run(job);
    expect(Buffer.from(hit.json()).toString()).toBe(JSON.stringify(rows()));
  });
});

describe('deepFreeze', () => {
  it('freezes nesting deeper than the call stack (JSON.parse reads it)', () => {
    const depth = 50_000;
    const value = JSON.parse(`${'['.repeat(depth)}1${']'.repeat(depth)}`) as unknown[];
    deepFreeze(value);
    let inner: unknown = value;
    let frozen = 0;
    for (let i = 0; i < depth; i++) {
      if (Object.isFrozen(inner)) frozen++;
      inner = (inner as unknown[])[0];
    }
    expect(frozen).toBe(depth);
    expect(inner).toBe(1);
  });
});

describe("values: 'fresh' (the default) — a value of its own per hit", () => {
  it('each hit parses anew: a caller may change its value, the next hit does not see it', async () => {
    for (const values of [undefined, 'fresh'] as const) {
      const { cache } = cacheWith(values);
      const job = makeJob({ viewer: alice });
      await cache.run(job);
      const first = (await cache.run(job)).value as Rows;
      expect(Object.isFrozen(first)).toBe(false);
      first.total = 99;
      first.rows[0]!.tags.push('mine');
      const second = (await cache.run(job)).value as Rows;
      expect(second).not.toBe(first);
      expect(second).toEqual(rows());
    }
  });

  it('anything but fresh or shared is refused, naming the option', () => {
    expect(() =>
      withResultCache(new CountingExecutor(), {
        store: new MemoryCacheStore(),
        values: 'frozen' as never,
      }),
    ).toThrow(/values must be 'fresh' or 'shared'/);
  });
});

describe("createViewerCache({ values: 'shared' })", () => {
  it('passes the choice down: same viewer, same frozen value; another viewer, another', async () => {
    const cache = createViewerCache({
      functions: { 'f/rows': () => rows() },
      ttl: '1m',
      values: 'shared',
    });
    const as = (email: string) => ({
      path: 'f/rows',
      origin: { kind: 'app' as const, session: { email } },
    });
    await cache.run(as(alice));
    await cache.run(as(bob));
    const a1 = (await cache.run(as(alice))).value;
    const a2 = (await cache.run(as(alice))).value;
    const b1 = (await cache.run(as(bob))).value;
    expect(a2).toBe(a1);
    expect(Object.isFrozen(a1)).toBe(true);
    expect(b1).not.toBe(a1);
    expect(b1).toEqual(a1);
    await cache.close();
  });

  it('by default a viewer cache hands each hit a value of its own', async () => {
    const cache = createViewerCache({ functions: { 'f/rows': () => rows() }, ttl: '1m' });
    const run = { path: 'f/rows', origin: { kind: 'app' as const, session: { email: alice } } };
    await cache.run(run);
    const a1 = (await cache.run(run)).value;
    const a2 = (await cache.run(run)).value;
    expect(a2).not.toBe(a1);
    expect(Object.isFrozen(a1)).toBe(false);
    await cache.close();
  });
});
