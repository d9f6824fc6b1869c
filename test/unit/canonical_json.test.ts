import fc from 'fast-check';
import stableStringify from 'fast-json-stable-stringify';
import { describe, expect, it } from 'vitest';
import { canonicalArgs, jsonString } from '../../src/cache/canonical_json.js';
import { cachedResultPath } from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

const SECRET = 'hunter2-secret-value';

class Point {
  constructor(
    readonly x = SECRET,
    readonly y = 2,
  ) {}
}

function deep(levels: number): Record<string, unknown> {
  let value: Record<string, unknown> = { leaf: SECRET };
  for (let i = 0; i < levels; i++) value = { n: value };
  return value;
}

const cyclic: Record<string, unknown> = { secret: SECRET };
cyclic['self'] = cyclic;
const arrayCycle: unknown[] = [SECRET];
arrayCycle.push(arrayCycle);
const indirectCycle: Record<string, unknown> = { list: [{ secret: SECRET }] };
(indirectCycle['list'] as Array<Record<string, unknown>>)[0]!['back'] = indirectCycle;
// biome-ignore lint/suspicious/noSparseArray: the point of the test
const sparse = [SECRET, , SECRET];
const symbolKeyed = { a: SECRET, [Symbol(SECRET)]: SECRET };

const notJson: Array<[string, Record<string, unknown>]> = [
  ['BigInt', { n: 12345678901234567890n }],
  ['function', { f: () => SECRET }],
  ['symbol', { s: Symbol(SECRET) }],
  ['undefined', { u: undefined }],
  ['undefined in an array', { u: [SECRET, undefined] }],
  ['NaN', { n: Number.NaN }],
  ['Infinity', { n: Number.POSITIVE_INFINITY }],
  ['-Infinity', { n: [Number.NEGATIVE_INFINITY] }],
  ['an object cycle', cyclic],
  ['an array cycle', { a: arrayCycle }],
  ['an indirect cycle through an array', indirectCycle],
  ['a sparse array', { s: sparse }],
  ['a Date', { d: new Date(1_234_567_890_123) }],
  ['a Map', { m: new Map([[SECRET, SECRET]]) }],
  ['a Set', { m: new Set([SECRET]) }],
  ['a class instance', { p: new Point() }],
  ['a boxed string', { s: new String(SECRET) }],
  ['a typed array', { b: new Uint8Array([1, 2, 3]) }],
  ['an array subclass', { a: new (class extends Array {})() }],
  ['symbol keys', { o: symbolKeyed }],
  ['nesting deeper than 64', deep(100)],
  ['an object with a toJSON method', { o: { toJSON: () => SECRET } }],
];

describe('canonicalArgs refuses what JSON cannot carry faithfully', () => {
  it.each(notJson)('%s → E_ARGS_NOT_JSON without the value in the message', (_name, args) => {
    let thrown: unknown;
    try {
      canonicalArgs(args);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(Error);
    const err = thrown as Error & { code?: unknown; status?: unknown };
    expect(err.code).toBe('E_ARGS_NOT_JSON');
    expect(err.status).toBe(400);
    expect(err.message).not.toContain(SECRET);
    expect(err.message).not.toContain('12345678901234567890');
    expect(err.message).not.toContain('1234567890123');
    expect(String(err.stack)).not.toContain(SECRET);
  });

  it.each(notJson)('%s is refused by cachedResultPath too', (_name, args) => {
    expect(() => cachedResultPath(makeJob({ args }))).toThrow(
      expect.objectContaining({ code: 'E_ARGS_NOT_JSON' }),
    );
  });

  it.each([
    ['null', null],
    ['an array', [1]],
    ['a string', 'x'],
    ['a class instance', new Point()],
  ])('refuses %s as the args object', (_name, args) => {
    expect(() => canonicalArgs(args)).toThrow(expect.objectContaining({ code: 'E_ARGS_NOT_JSON' }));
  });

  it('names the offending path, not the value', () => {
    expect(() => canonicalArgs({ filters: [{ at: new Date() }] })).toThrow(/\$\.filters\[0\]\.at/);
  });

  it('accepts nesting up to the limit, and shared (non-cyclic) references', () => {
    expect(() => canonicalArgs(deep(60))).not.toThrow();
    const shared = { s: 1 };
    expect(canonicalArgs({ a: shared, b: [shared, shared] })).toBe(
      '{"a":{"s":1},"b":[{"s":1},{"s":1}]}',
    );
  });

  it('accepts null-prototype objects as plain data', () => {
    const bare = Object.assign(Object.create(null) as Record<string, unknown>, { b: 1, a: 2 });
    expect(canonicalArgs({ bare })).toBe('{"bare":{"a":2,"b":1}}');
  });
});

describe('canonicalArgs is fast-json-stable-stringify on plain JSON', () => {
  const weirdKeys = fc.oneof(
    fc.string({ unit: 'binary' }),
    fc.constantFrom(
      '__proto__',
      'constructor',
      'toString',
      'hasOwnProperty',
      '',
      '"',
      '\\',
      '\u0000',
      '\u2028',
      '\ud800',
      '😀',
      '10',
      '2',
      '-1',
      '1.5',
      'a"b',
    ),
  );

  it('jsonString is JSON.stringify for any string', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string({ unit: 'binary' }), weirdKeys), (text) => {
        expect(jsonString(text)).toBe(JSON.stringify(text));
      }),
    );
  });

  it('for fc.jsonValue objects with unicode strings', () => {
    fc.assert(
      fc.property(fc.dictionary(weirdKeys, fc.jsonValue({ stringUnit: 'binary' })), (value) => {
        expect(canonicalArgs(value)).toBe(stableStringify(value));
      }),
      { numRuns: 1000 },
    );
  });

  it('for wide objects (more than 16 keys) and unicode grapheme strings', () => {
    fc.assert(
      fc.property(
        fc.dictionary(weirdKeys, fc.jsonValue({ stringUnit: 'grapheme', maxDepth: 3 }), {
          minKeys: 17,
          maxKeys: 40,
        }),
        (value) => {
          expect(canonicalArgs(value)).toBe(stableStringify(value));
        },
      ),
      { numRuns: 200 },
    );
  });

  it('for the corner cases by hand', () => {
    const cases: Array<Record<string, unknown>> = [
      {},
      { a: -0, b: 1e21, c: 1e-7, d: 0.1 + 0.2, e: Number.MAX_SAFE_INTEGER, f: -1.5e-300 },
      { s: 'plain ascii ok:@/+-.', t: 'tab\there', u: '"quoted"', v: '\u2028\u2029', w: '\ud83d' },
      { z: 1, a: 1, Z: 1, _: 1, '10': 1, '9': 1, é: 1, e: 1 },
      { nested: [[], {}, [null, [true, false]], { '': '' }] },
    ];
    for (const value of cases) expect(canonicalArgs(value)).toBe(stableStringify(value));
  });

  // Key orders are remembered per shape (the keys in insertion order): objects whose keys are
  // the same set in another order, a subset, a superset or another key of the same length must
  // each get their own, and so must more shapes than are remembered, cycled through twice.
  it('for objects of many shapes, interleaved', () => {
    const shapes: Array<Record<string, unknown>> = [
      { b: 1, a: 2 },
      { a: 2, b: 1 },
      { a: 2 },
      { a: 2, b: 1, c: 3 },
      { a: 2, c: 1 },
      { '"': 1, a: 2 },
      ...Array.from({ length: 20 }, (_, i) => ({ [`k${20 - i}`]: i, k: i, [`j${i}`]: [i] })),
    ];
    for (let round = 0; round < 2; round++) {
      for (const value of shapes) expect(canonicalArgs(value)).toBe(stableStringify(value));
      for (const value of [...shapes].reverse())
        expect(canonicalArgs({ outer: value, ...value })).toBe(
          stableStringify({ outer: value, ...value }),
        );
    }
  });

  it('for arbitrary objects in a sequence (shapes recurring as they come)', () => {
    const keys = fc.constantFrom('a', 'b', 'c', 'd', '', 'é', '"');
    fc.assert(
      fc.property(
        fc.array(fc.dictionary(keys, fc.integer(), { maxKeys: 5 }), { maxLength: 30 }),
        (values) => {
          for (const value of values) expect(canonicalArgs(value)).toBe(stableStringify(value));
        },
      ),
      { numRuns: 300 },
    );
  });
});
