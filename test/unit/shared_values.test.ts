import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createViewerCache, MemoryCacheStore, withResultCache } from '../../src/index.js';
import { ClonedStoredResult, deepFreeze } from '../../src/job_result.js';
import { CountingExecutor } from '../helpers/counting_executor.js';
import { makeJob } from '../helpers/jobs.js';

// `values: 'shared'` hands every hit of one entry the same deep-frozen parsed value (no parse
// per hit); `'cloned'` a deep copy of that value per hit; `'fresh'` (the default) parses per
// hit. In every mode, nothing a caller does to what it got changes what another hit returns,
// and no value is ever shared between two keys.

const alice = 'alice@example.com';
const bob = 'bob@example.com';
const rows = () => ({ rows: [{ id: 1, tags: ['a'] }], total: 1 });

function cacheWith(values: 'fresh' | 'shared' | 'cloned' | undefined) {
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

  it.each(['shared', 'cloned'] as const)(
    '%s: a new result under the same key is a new value, not the one parsed before',
    async (values) => {
      let run = 0;
      const inner = new CountingExecutor(() => ({ run: ++run }));
      const store = new MemoryCacheStore();
      const cache = withResultCache(inner, { store, values });
      const job = makeJob({ viewer: alice });
      await cache.run(job);
      expect((await cache.run(job)).value).toEqual({ run: 1 });
      await store.close(); // drops every entry: the next run computes and stores anew
      await cache.run(job);
      expect((await cache.run(job)).value).toEqual({ run: 2 });
    },
  );

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

  it('anything but fresh, shared or cloned is refused, naming the option', () => {
    expect(() =>
      withResultCache(new CountingExecutor(), {
        store: new MemoryCacheStore(),
        values: 'frozen' as never,
      }),
    ).toThrow(/values must be 'fresh', 'shared' or 'cloned'/);
  });
});

/** Every object and array reachable from `value`. */
function objectsIn(value: unknown): Set<object> {
  const found = new Set<object>();
  const todo = [value];
  while (todo.length > 0) {
    const next = todo.pop();
    if (typeof next !== 'object' || next === null || found.has(next)) continue;
    found.add(next);
    for (const item of Object.values(next)) todo.push(item);
  }
  return found;
}

describe("values: 'cloned' — a copy of the entry's one parsed value per hit", () => {
  it('each hit gets a value of its own, unfrozen: a change never reaches the next hit', async () => {
    const { cache, inner } = cacheWith('cloned');
    const job = makeJob({ viewer: alice });
    await cache.run(job);
    const first = await cache.run({ ...job, id: 'h1' });
    const second = await cache.run({ ...job, id: 'h2' });
    expect(first.fromCache && second.fromCache).toBe(true);
    expect(inner.calls).toBe(1);
    const a = first.value as Rows;
    const b = second.value as Rows;
    expect(a).toEqual(rows());
    expect(b).toEqual(rows());
    // Nothing shared at any depth, nothing frozen.
    const inA = objectsIn(a);
    for (const object of objectsIn(b)) expect(inA.has(object)).toBe(false);
    for (const object of inA) expect(Object.isFrozen(object)).toBe(false);
    // One result's value is one object, however often it is read.
    expect(first.value).toBe(a);
    a.total = 99;
    a.rows[0]!.tags.push('mine');
    a.rows.push({ id: 2, tags: [] });
    expect(b).toEqual(rows());
    const third = await cache.run({ ...job, id: 'h3' });
    expect(third.value).toEqual(rows());
    expect(third.jobId).toBe('h3');
  });

  it("each viewer's hits copy that viewer's value only", async () => {
    const inner = new CountingExecutor((job) => ({ viewer: job.perms.endUserEmail, rows: [1] }));
    const cache = withResultCache(inner, { store: new MemoryCacheStore(), values: 'cloned' });
    for (const viewer of [alice, bob, null]) await cache.run(makeJob({ viewer }));
    for (let round = 0; round < 2; round++) {
      for (const viewer of [alice, bob, null]) {
        const hit = await cache.run(makeJob({ viewer }));
        expect(hit.fromCache).toBe(true);
        expect(hit.value).toEqual({ viewer, rows: [1] });
      }
    }
    expect(inner.calls).toBe(3);
  });

  it('an own "__proto__" key stays a key: the copy keeps its prototype, nothing is polluted', async () => {
    const text = '{"__proto__":{"polluted":true},"list":[{"__proto__":{"x":1}}]}';
    const inner = new CountingExecutor(() => JSON.parse(text));
    const cache = withResultCache(inner, { store: new MemoryCacheStore(), values: 'cloned' });
    const job = makeJob({ viewer: alice });
    await cache.run(job);
    const value = (await cache.run(job)).value as { list: object[] };
    expect(Object.getPrototypeOf(value)).toBe(Object.prototype);
    expect(Object.getPrototypeOf(value.list[0])).toBe(Object.prototype);
    expect(Object.hasOwn(value, '__proto__')).toBe(true);
    expect((value as { polluted?: unknown }).polluted).toBeUndefined();
    expect(({} as { polluted?: unknown }).polluted).toBeUndefined();
    expect(JSON.stringify(value)).toBe(text);
  });

  it('a key an enumerable Object.prototype property adds (pollution) is not copied in as own', async () => {
    const { cache } = cacheWith('cloned');
    const job = makeJob({ viewer: alice });
    await cache.run(job);
    const hit = await cache.run(job);
    // An array: an inherited object would inherit the key again, and the copy would give up
    // at its depth limit and parse, hiding a missing check.
    Object.defineProperty(Object.prototype, 'injected', {
      value: ['from elsewhere'],
      enumerable: true,
      configurable: true,
      writable: true,
    });
    let value: Rows;
    try {
      value = hit.value as Rows;
    } finally {
      delete (Object.prototype as { injected?: unknown }).injected;
    }
    expect(Object.hasOwn(value, 'injected')).toBe(false);
    expect(Object.hasOwn(value.rows[0]!, 'injected')).toBe(false);
    expect(value).toEqual(rows());
  });

  it('nesting deeper than a copy goes is parsed from the bytes instead', async () => {
    // Deeper than the copy's 1000 levels; far deeper and JSON.stringify cannot store it.
    const depth = 1500;
    const text = `${'['.repeat(depth)}1${']'.repeat(depth)}`;
    const inner = new CountingExecutor(() => JSON.parse(text));
    const cache = withResultCache(inner, { store: new MemoryCacheStore(), values: 'cloned' });
    const job = makeJob({ viewer: alice });
    await cache.run(job);
    const hit = await cache.run(job);
    expect(hit.fromCache).toBe(true);
    const first = hit.value as unknown[];
    const second = (await cache.run(job)).value as unknown[];
    expect(second).not.toBe(first);
    expect(Object.isFrozen(first)).toBe(false);
    first.push('mine');
    expect(JSON.stringify(second)).toBe(text);
  });

  it('a copy is the parse of the stored bytes, for any JSON value (property)', () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const bytes = Buffer.from(JSON.stringify(value));
        const entry = {};
        const values = new WeakMap<object, unknown>();
        const first = new ClonedStoredResult({ id: 'a' }, bytes, entry, values).value;
        const second = new ClonedStoredResult({ id: 'b' }, bytes, entry, values).value;
        const parsed: unknown = JSON.parse(bytes.toString());
        // Same keys in the same order, same prototypes, -0 kept (toStrictEqual tells them apart).
        expect(first).toStrictEqual(parsed);
        expect(JSON.stringify(first)).toBe(bytes.toString());
        const inFirst = objectsIn(first);
        for (const object of objectsIn(second)) expect(inFirst.has(object)).toBe(false);
        // Nor anything of the kept value, which is frozen, while the copies are not.
        for (const object of objectsIn(values.get(entry))) {
          expect(inFirst.has(object)).toBe(false);
          expect(Object.isFrozen(object)).toBe(true);
        }
        for (const object of inFirst) expect(Object.isFrozen(object)).toBe(false);
      }),
      { numRuns: 300 },
    );
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

  it("passes 'cloned' down: each hit a copy of that viewer's value", async () => {
    const cache = createViewerCache({
      functions: { 'f/rows': () => rows() },
      ttl: '1m',
      values: 'cloned',
    });
    const run = { path: 'f/rows', origin: { kind: 'app' as const, session: { email: alice } } };
    await cache.run(run);
    const a1 = (await cache.run(run)).value as Rows;
    const a2 = (await cache.run(run)).value as Rows;
    expect(a2).not.toBe(a1);
    expect(a2.rows).not.toBe(a1.rows);
    expect(Object.isFrozen(a1)).toBe(false);
    a1.rows[0]!.id = 7;
    expect((await cache.run(run)).value).toEqual(rows());
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
