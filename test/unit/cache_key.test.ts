import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalKeyInput } from '../../src/cache/cache_key.js';
import { canonicalArgs } from '../../src/cache/canonical_json.js';
import type { Job } from '../../src/index.js';
import { cachedResultPath } from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

const alice = 'alice@example.com';
const base = makeJob({ viewer: alice, args: { region: 'eu', limit: 10 } });
const key = (job: Job, fingerprint?: string | null) => cachedResultPath(job, fingerprint);

describe('cachedResultPath: shape', () => {
  it('is <workspace>/cache/<64 hex>', () => {
    expect(key(base)).toMatch(/^ws\/cache\/[0-9a-f]{64}$/);
  });

  it('is deterministic and ignores the job id, runner and TTL', () => {
    expect(key({ ...base, id: 'other' })).toBe(key(base));
    expect(key({ ...base, perms: { ...base.perms, email: 'someone-else@example.com' } })).toBe(
      key(base),
    );
    expect(key({ ...base, cacheTtlS: 1 })).toBe(key(base));
  });
});

describe('cachedResultPath: every key input (SPEC invariant 3)', () => {
  const variants: Array<[string, Job, string | null | undefined]> = [
    ['workspace', { ...base, workspace: 'ws2' }, undefined],
    [
      'runnable path',
      { ...base, runnable: { ...base.runnable, path: 'f/app/report2' } },
      undefined,
    ],
    ['runnable hash', { ...base, runnable: { ...base.runnable, hash: 'h2' } }, undefined],
    ['args (a value)', { ...base, args: { region: 'us', limit: 10 } }, undefined],
    ['args (a type)', { ...base, args: { region: 'eu', limit: '10' } }, undefined],
    ['args (an extra null field)', { ...base, args: { ...base.args, extra: null } }, undefined],
    ['viewer', { ...base, perms: { ...base.perms, endUserEmail: 'bob@example.com' } }, undefined],
    ['viewer (none)', { ...base, perms: { ...base.perms, endUserEmail: null } }, undefined],
    ['fingerprint', base, 'roles:1'],
  ];

  it.each(variants)(
    'two jobs differing only in %s never share a key',
    (_name, job, fingerprint) => {
      expect(key(job, fingerprint)).not.toBe(key(base));
    },
  );

  it('all the variants are pairwise distinct too', () => {
    const keys = variants.map(([, job, fingerprint]) => key(job, fingerprint));
    expect(new Set([...keys, key(base)]).size).toBe(variants.length + 1);
  });

  it('the viewer is in the key: same runnable and args, two viewers, two keys', () => {
    const a = makeJob({ viewer: 'a@x.io', args: { q: 1 } });
    const b = makeJob({ viewer: 'b@x.io', args: { q: 1 } });
    expect(key(a)).not.toBe(key(b));
  });

  it('same-name users are still distinct viewers (case and Unicode form are not folded)', () => {
    const viewers = ['Alice@example.com', 'alice@example.com', 'al\u00e9@x', 'ale\u0301@x'];
    const keys = viewers.map((viewer) => key(makeJob({ viewer })));
    expect(new Set(keys).size).toBe(viewers.length);
  });

  it('permuted arg key order shares a key, at every depth', () => {
    const a = makeJob({ args: { a: 1, b: { x: [1, { p: 1, q: 2 }], y: 2 }, c: 'z' } });
    const b = makeJob({ args: { c: 'z', b: { y: 2, x: [1, { q: 2, p: 1 }] }, a: 1 } });
    expect(key(a)).toBe(key(b));
  });

  it('array order is not permuted away', () => {
    expect(key(makeJob({ args: { l: [1, 2] } }))).not.toBe(key(makeJob({ args: { l: [2, 1] } })));
  });

  it('viewer null, "", "null" and an email are four different entries', () => {
    const keys = [null, '', 'null', 'nobody@example.com'].map((viewer) => key(makeJob({ viewer })));
    expect(new Set(keys).size).toBe(4);
  });

  it('a viewer that is not a string or null is refused (never read as "no viewer")', () => {
    const job = makeJob({ viewer: null });
    for (const viewer of [undefined, 0, false, {}]) {
      const bad = { ...job, perms: { ...job.perms, endUserEmail: viewer as unknown as null } };
      expect(() => key(bad)).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
    }
  });

  it('fingerprint undefined ≡ null; null, "", "null" and "x" differ', () => {
    expect(key(base, undefined)).toBe(key(base, null));
    expect(key(base)).toBe(key(base, null));
    const keys = [null, '', 'null', 'x'].map((fingerprint) => key(base, fingerprint));
    expect(new Set(keys).size).toBe(4);
  });

  it('fingerprint and viewer are different slots: swapping them changes the key', () => {
    const a = makeJob({ viewer: 'x@y' });
    const b = makeJob({ viewer: null });
    expect(key(a, null)).not.toBe(key(b, 'x@y'));
  });

  it.each([
    ['an empty workspace', { ...base, workspace: '' }],
    ['a workspace with a slash', { ...base, workspace: 'a/cache' }],
    ['an empty path', { ...base, runnable: { ...base.runnable, path: '' } }],
    ['an empty hash', { ...base, runnable: { ...base.runnable, hash: '' } }],
  ])('refuses %s with E_INVALID_JOB', (_name, job) => {
    expect(() => key(job)).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
  });
});

describe('cachedResultPath: separator games', () => {
  it('(viewer, path, args) triples cut from the same characters never collide', () => {
    // Every way of cutting these characters into a viewer, a path and a string arg.
    const text = 'a","b/c:{"d":1},null\\"';
    const triples = new Map<string, Job>();
    for (let i = 0; i <= text.length; i++) {
      for (let j = i + 1; j <= text.length; j++) {
        const viewer = text.slice(0, i);
        const path = text.slice(i, j);
        const rest = text.slice(j);
        for (const v of [viewer, null]) {
          for (const args of [{ x: rest }, { [rest]: 1 }, rest === '' ? {} : { x: [rest] }]) {
            const job = makeJob({ viewer: v, path, args });
            triples.set(JSON.stringify([v, path, canonicalArgs(args)]), job);
          }
        }
      }
    }
    const keys = new Set([...triples.values()].map((job) => key(job)));
    expect(triples.size).toBeGreaterThan(500);
    expect(keys.size).toBe(triples.size);
  });

  it('the classic concatenation collisions do not collide', () => {
    const pairs: Array<[Job, Job]> = [
      // viewer `a","b` against a path that absorbs the same characters
      [makeJob({ viewer: 'a","b', path: 'p' }), makeJob({ viewer: 'a', path: 'b","p' })],
      [makeJob({ viewer: 'a', path: 'b/p' }), makeJob({ viewer: 'a/b', path: 'p' })],
      [makeJob({ viewer: 'a:b', path: 'p' }), makeJob({ viewer: 'a', path: 'b:p' })],
      [makeJob({ viewer: null, path: 'p' }), makeJob({ viewer: 'null', path: 'p' })],
      [makeJob({ path: 'p', hash: 'h1,x' }), makeJob({ path: 'p,h1', hash: 'x' })],
      [
        makeJob({ path: 'p', args: { a: '1,"b":2' } }),
        makeJob({ path: 'p', args: { a: 1, b: 2 } }),
      ],
      [
        makeJob({ viewer: 'v', path: 'p', args: {} }),
        makeJob({ viewer: 'v","p', path: '{}', args: {} }),
      ],
    ];
    for (const [a, b] of pairs) expect(key(a)).not.toBe(key(b));
    // and fingerprint cannot stand in for args or viewer
    expect(key(makeJob({ viewer: 'v' }), 'w')).not.toBe(key(makeJob({ viewer: 'v","w' })));
  });
});

describe('cachedResultPath: property', () => {
  const small = (values: string[]) => fc.constantFrom(...values);
  const jobInput = fc.record({
    workspace: small(['ws', 'ws2']),
    path: small(['p', 'p2', 'p","x', 'a/b']),
    hash: small(['h', 'h2']),
    viewer: fc.constantFrom<string | null>(null, '', 'null', 'a@x', 'b@x', 'a@x","p'),
    fingerprint: fc.constantFrom<string | null | undefined>(undefined, null, '', 'null', 's1'),
    args: fc.dictionary(
      small(['a', 'b', 'c', '"', '']),
      fc.oneof(
        fc.constantFrom<unknown>(null, 0, 1, '', '1', true),
        fc.array(fc.constantFrom(1, 'x'), { maxLength: 2 }),
      ),
      { maxKeys: 3 },
    ),
  });
  type Input = typeof jobInput extends fc.Arbitrary<infer T> ? T : never;
  const toJob = (input: Input): Job =>
    makeJob({
      workspace: input.workspace,
      path: input.path,
      hash: input.hash,
      viewer: input.viewer,
      args: input.args as Record<string, unknown>,
    });
  const canonicalTuple = (input: Input) =>
    JSON.stringify([
      input.workspace,
      input.path,
      input.hash,
      input.viewer,
      input.fingerprint ?? null,
      canonicalArgs(input.args),
    ]);

  it('keys are equal exactly when the canonical inputs are equal', () => {
    fc.assert(
      fc.property(jobInput, jobInput, (a, b) => {
        const sameInput = canonicalTuple(a) === canonicalTuple(b);
        const sameKey = key(toJob(a), a.fingerprint) === key(toJob(b), b.fingerprint);
        expect(sameKey).toBe(sameInput);
      }),
      { numRuns: 2000 },
    );
  });

  it('distinct canonical key inputs over arbitrary unicode give distinct keys', () => {
    const text = fc.string({ unit: 'binary', maxLength: 8 });
    fc.assert(
      fc.property(
        fc.tuple(
          text,
          fc.option(text),
          fc.option(text),
          fc.dictionary(text, fc.jsonValue({ maxDepth: 2 })),
        ),
        fc.tuple(
          text,
          fc.option(text),
          fc.option(text),
          fc.dictionary(text, fc.jsonValue({ maxDepth: 2 })),
        ),
        ([pathA, viewerA, fingerprintA, argsA], [pathB, viewerB, fingerprintB, argsB]) => {
          const a = makeJob({ path: `p${pathA}`, viewer: viewerA, args: argsA });
          const b = makeJob({ path: `p${pathB}`, viewer: viewerB, args: argsB });
          const inputA = canonicalKeyInput(a, fingerprintA);
          const inputB = canonicalKeyInput(b, fingerprintB);
          expect(key(a, fingerprintA) === key(b, fingerprintB)).toBe(inputA === inputB);
          // the canonical input parses back to exactly its parts: the encoding is injective
          expect(JSON.parse(inputA)).toEqual([
            1,
            'ws',
            `p${pathA}`,
            'h1',
            viewerA,
            fingerprintA,
            JSON.parse(canonicalArgs(argsA)),
          ]);
        },
      ),
      { numRuns: 500 },
    );
  });
});
