import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { errorClassOf, errors, NoViewerError } from '../../src/index.js';

// Each error class is a value and a type of the same name, so `catch (e) { if (e instanceof
// X) … }` and `let e: X` both work for a user of the package.
const source = readFileSync(new URL('../../src/errors.ts', import.meta.url), 'utf8');
const index = readFileSync(new URL('../../src/index.ts', import.meta.url), 'utf8');

describe('the error classes', () => {
  const classes = [...source.matchAll(/^export const (\w+Error) = defineError\(/gm)].map(
    (m) => m[1]!,
  );

  it('each has a type of its name beside its value', () => {
    const types = new Set(
      [...source.matchAll(/^export type (\w+Error) = InstanceType</gm)].map((m) => m[1]!),
    );
    expect(classes.length).toBeGreaterThan(40);
    expect(classes.filter((name) => !types.has(name))).toEqual([]);
  });

  it('each is exported from the package entry', () => {
    expect(classes.filter((name) => !new RegExp(`\\b${name}\\b`).test(index))).toEqual([]);
  });
});

describe('errorClassOf', () => {
  it('is the class of one of our codes, and nothing for any other value', () => {
    expect(errorClassOf('E_NO_VIEWER')).toBe(NoViewerError);
    expect(Object.keys(errors).every((code) => errorClassOf(code)?.code === code)).toBe(true);
    // A reported code is data: an inherited key or a stranger is no error class.
    for (const code of ['constructor', 'toString', '__proto__', 'E_MADE_UP', 22, null])
      expect(errorClassOf(code)).toBeUndefined();
  });
});
