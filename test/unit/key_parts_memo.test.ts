import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { plainEntries } from '../../src/cache/cache_entry.js';
import { canonicalKeyInput, embedViewerJson, keyDigest } from '../../src/cache/cache_key.js';
import { CacheRuns } from '../../src/cache/cache_run.js';
import { KeyPartsMemo } from '../../src/cache/key_parts_memo.js';
import type { Job } from '../../src/index.js';

// Invariant 3 (the key covers every security input) on the hit path: a run's key found from its
// parts, without building its key text, is always the key its text gives — whatever the caller
// did to its args, scope or viewer since, and whatever the encoder would refuse.

const runs = () => new CacheRuns(plainEntries, false);

/** The key `of` must give: the digest of the job's key input, or the encoder's refusal. */
function expected(job: Job, fingerprint: string | null): string {
  try {
    return keyDigest(canonicalKeyInput(job, fingerprint));
  } catch (err) {
    return `refused: ${(err as { code?: string }).code}`;
  }
}

function actual(of: CacheRuns, job: Job, fingerprint: string | null): string {
  try {
    return of.of(job, fingerprint, 60_000, {}).digest;
  } catch (err) {
    return `refused: ${(err as { code?: string }).code}`;
  }
}

const EMBED = Object.freeze({
  app: 'portal',
  attributes: Object.freeze({ tenant: 't1' }),
  email: null,
});

function job(parts: {
  args: Record<string, unknown>;
  viewer?: string | null | undefined;
  embed?: unknown;
  workspace?: string;
  path?: string;
  hash?: string;
  roleScope?: number[];
}): Job {
  return {
    id: 'j',
    workspace: parts.workspace ?? 'ws',
    runnable: { path: parts.path ?? 'f/a', hash: parts.hash ?? 'h1' },
    args: parts.args,
    perms: {
      email: 'publisher@example.com',
      endUserEmail: (parts.viewer === undefined && !('viewer' in parts)
        ? 'alice@example.com'
        : parts.viewer) as string | null,
      ...(parts.embed === undefined ? {} : { embed: parts.embed as never }),
      ...(parts.roleScope === undefined ? {} : { roleScope: parts.roleScope }),
    },
  };
}

describe('a run key found from its parts', () => {
  it('follows args changed in place after a run, at any depth', () => {
    const of = runs();
    const args = { region: 'emea', filter: { status: ['open', 'paid'], limit: 5 } };
    const j = job({ args });
    const first = actual(of, j, null);
    expect(actual(of, j, null)).toBe(first);
    args.filter.status[1] = 'void';
    expect(actual(of, j, null)).toBe(expected(j, null));
    expect(actual(of, j, null)).not.toBe(first);
    args.filter.limit = 6;
    expect(actual(of, j, null)).toBe(expected(j, null));
    (args.filter as Record<string, unknown>)['extra'] = true;
    expect(actual(of, j, null)).toBe(expected(j, null));
    args.filter.status.push('void');
    expect(actual(of, j, null)).toBe(expected(j, null));
    args.filter.status.pop();
    delete (args.filter as Record<string, unknown>)['extra'];
    args.filter.limit = 5;
    args.filter.status[1] = 'paid';
    expect(actual(of, j, null)).toBe(first);
  });

  it('follows a key renamed in place, its value unchanged', () => {
    const of = runs();
    const args: Record<string, unknown> = { a: 1 };
    const j = job({ args });
    const first = actual(of, j, null);
    delete args['a'];
    args['b'] = 1;
    expect(actual(of, j, null)).toBe(expected(j, null));
    expect(actual(of, j, null)).not.toBe(first);
  });

  it('never hands one viewer another viewer’s key: emails, nobody, "null" and embed viewers', () => {
    const of = runs();
    const args = { q: 1 };
    const jobs = [
      job({ args, viewer: 'alice@example.com' }),
      job({ args, viewer: 'bob@example.com' }),
      job({ args, viewer: null }),
      job({ args, viewer: 'null' }),
      job({ args, viewer: null, embed: EMBED }),
      job({ args, viewer: JSON.stringify(EMBED) }),
      // An email that reads as the embed viewer's canonical JSON is still an email.
      job({ args, viewer: embedViewerJson(EMBED) }),
      job({ args, viewer: null, embed: { ...EMBED, attributes: { tenant: 't2' } } }),
    ];
    const keys = jobs.map((j) => actual(of, j, null));
    expect(new Set(keys).size).toBe(jobs.length);
    // Again, each now found from its parts, in another order.
    for (const [i, j] of [...jobs.entries()].reverse()) {
      expect(actual(of, j, null)).toBe(keys[i]);
      expect(actual(of, j, null)).toBe(expected(j, null));
    }
  });

  it('tells apart the workspace, runnable hash, fingerprint and role scope', () => {
    const of = runs();
    const args = { q: 1 };
    const cases: [Job, string | null][] = [
      [job({ args }), null],
      [job({ args, workspace: 'other' }), null],
      [job({ args, hash: 'h2' }), null],
      [job({ args, path: 'f/b' }), null],
      [job({ args }), 'fp1'],
      [job({ args }), 'null'],
      [job({ args, roleScope: [1, 2] }), null],
      [job({ args, roleScope: [1, 3] }), null],
      [job({ args, roleScope: [] }), null],
    ];
    const keys = cases.map(([j, fp]) => actual(of, j, fp));
    expect(new Set(keys).size).toBe(cases.length);
    for (const [i, [j, fp]] of cases.entries()) expect(actual(of, j, fp)).toBe(keys[i]);
  });

  it('follows a role scope array changed in place', () => {
    const of = runs();
    const roleScope = [1, 2];
    const j = job({ args: {}, roleScope });
    const first = actual(of, j, null);
    roleScope[1] = 3;
    expect(actual(of, j, null)).toBe(expected(j, null));
    expect(actual(of, j, null)).not.toBe(first);
  });

  it('refuses, as the encoder does, args that became what JSON cannot carry', () => {
    const holey = [1, 2, 3];
    delete holey[1];
    const mutations: [string, string | symbol, unknown][] = [
      ['a symbol key', Symbol('s'), 1],
      ['undefined', 'q', undefined],
      ['a hole', 'list', holey],
      ['NaN', 'q', Number.NaN],
      ['a Date for an object', 'filter', new Date(0)],
      ['a function', 'q', () => 1],
      ['a BigInt', 'q', 1n],
      ['a class instance', 'filter', new (class Filter {})()],
      ['an array without a prototype for an object', 'filter', Object.setPrototypeOf([], null)],
    ];
    for (const [what, name, value] of mutations) {
      const of = runs();
      const args: Record<string | symbol, unknown> = { q: 1, list: [1, 2, 3], filter: {} };
      const j = job({ args });
      actual(of, j, null);
      args[name] = value;
      expect(actual(of, j, null), what).toBe('refused: E_ARGS_NOT_JSON');
    }
  });

  it('refuses a job whose viewer went missing, as the encoder does', () => {
    const of = runs();
    const j = job({ args: { q: 1 }, viewer: null });
    actual(of, j, null);
    const missing = job({ args: { q: 1 }, viewer: undefined });
    expect(actual(of, missing, null)).toBe('refused: E_INVALID_JOB');
  });

  it('keys 0 and -0 alike, and the same args in another key order alike, as their JSON does', () => {
    const of = runs();
    const a = job({ args: { x: 0, y: 1 } });
    const b = job({ args: { x: -0, y: 1 } });
    const c = job({ args: { y: 1, x: 0 } });
    const key = actual(of, a, null);
    expect(actual(of, b, null)).toBe(key);
    expect(actual(of, c, null)).toBe(key);
    expect(actual(of, c, null)).toBe(expected(c, null));
  });

  it('keeps an own "__proto__" key a key', () => {
    const of = runs();
    const withProto = job({ args: JSON.parse('{"__proto__":{"admin":true},"q":1}') });
    const without = job({ args: { q: 1 } });
    const key = actual(of, withProto, null);
    expect(actual(of, withProto, null)).toBe(key);
    expect(actual(of, without, null)).not.toBe(key);
    expect(actual(of, without, null)).toBe(expected(without, null));
    expect(actual(of, withProto, null)).toBe(expected(withProto, null));
  });

  it('keeps nothing for args whose getters answer differently each time', () => {
    const memo = new KeyPartsMemo<string>(16);
    let reads = 0;
    const args = {
      get q() {
        reads++;
        return reads % 2 === 0 ? 'even' : 'odd';
      },
    };
    const j = job({ args });
    memo.set(j, null, canonicalKeyInput(j, null), 'value', true);
    expect(memo.size).toBe(0);
    // Through CacheRuns: each call's key is the key of what its encoding read.
    const of = runs();
    for (let i = 0; i < 4; i++) {
      const key = actual(of, j, null);
      expect([
        expected(job({ args: { q: 'odd' } }), null),
        expected(job({ args: { q: 'even' } }), null),
      ]).toContain(key);
    }
  });

  it('is bounded: two generations, and a full bucket kept as it is unless told to evict', () => {
    const memo = new KeyPartsMemo<number>(4);
    for (let i = 0; i < 20; i++) {
      const j = job({ args: { i }, viewer: `v${i}@example.com` });
      memo.set(j, null, canonicalKeyInput(j, null), i, true);
      expect(memo.size).toBeLessThanOrEqual(8);
    }
    const bucket = new KeyPartsMemo<number>(100);
    for (let i = 0; i < 12; i++) {
      const j = job({ args: { i } });
      bucket.set(j, null, canonicalKeyInput(j, null), i, false);
    }
    expect(bucket.size).toBe(8);
    const first = job({ args: { i: 0 } });
    expect(bucket.get(first, null)).toBe(0);
    const late = job({ args: { i: 11 } });
    expect(bucket.get(late, null)).toBeUndefined();
    bucket.set(late, null, canonicalKeyInput(late, null), 11, true);
    expect(bucket.get(late, null)).toBe(11);
    expect(bucket.size).toBe(8);
  });

  it('property: through any sequence of runs and in-place changes, the key is the key of the text', () => {
    // Mostly data JSON carries, now and then what the encoder refuses.
    const leaf = fc.oneof(
      {
        arbitrary: fc.constantFrom(
          0,
          -0,
          1,
          2.5,
          -7,
          1e21,
          '',
          'a',
          'b',
          'é',
          '"',
          true,
          false,
          null,
        ),
        weight: 12,
      },
      { arbitrary: fc.constantFrom(undefined, Number.NaN, Number.POSITIVE_INFINITY), weight: 1 },
    );
    const names = fc.constantFrom('a', 'b', 'c', '__proto__', 'constructor', '0');
    const { value } = fc.letrec((tie) => ({
      value: fc.oneof(
        { depthSize: 'small', withCrossShrink: true },
        leaf,
        fc.array(tie('value'), { maxLength: 3 }),
        fc.array(fc.tuple(names, tie('value')), { maxLength: 3 }).map((e) => Object.fromEntries(e)),
      ),
    }));
    const args = fc
      .array(fc.tuple(names, value), { maxLength: 4 })
      .map((e) => Object.fromEntries(e) as Record<string, unknown>);
    const step = fc.record({
      pick: fc.nat(5),
      viewer: fc.constantFrom(
        'alice@example.com',
        'bob@example.com',
        null,
        'null',
        embedViewerJson(EMBED),
      ),
      embed: fc.boolean(),
      fingerprint: fc.constantFrom(null, 'fp1'),
      scope: fc.constantFrom(undefined, [1, 2], [2, 1]),
      // An in-place change of the picked args (or of a value in them) before the run, or none.
      change: fc.option(
        fc.tuple(fc.constantFrom('set', 'push', 'delete'), names, value, fc.boolean()),
        {
          nil: undefined,
        },
      ),
    });
    fc.assert(
      fc.property(
        fc.array(args, { minLength: 1, maxLength: 3 }),
        fc.array(step, { minLength: 10, maxLength: 40 }),
        (pool, steps) => {
          const of = runs();
          for (const s of steps) {
            const a = pool[s.pick % pool.length]!;
            if (s.change !== undefined) {
              const [kind, name, v, nested] = s.change;
              // Only an own value: `a.__proto__` of args without that own key is
              // Object.prototype, and changing it would change every object of the process.
              const target =
                nested && Object.hasOwn(a, name) && typeof a[name] === 'object' && a[name] !== null
                  ? (a[name] as Record<string, unknown>)
                  : a;
              if (kind === 'push' && Array.isArray(target)) target.push(v);
              else if (kind === 'delete') delete target[name];
              else {
                Object.defineProperty(target, name, {
                  value: v,
                  enumerable: true,
                  writable: true,
                  configurable: true,
                });
              }
            }
            const j = job({
              args: a,
              viewer: s.embed ? null : s.viewer,
              ...(s.embed ? { embed: EMBED } : {}),
              ...(s.scope === undefined ? {} : { roleScope: [...s.scope] }),
            });
            expect(actual(of, j, s.fingerprint)).toBe(expected(j, s.fingerprint));
          }
        },
      ),
      { numRuns: 400 },
    );
  });
});
