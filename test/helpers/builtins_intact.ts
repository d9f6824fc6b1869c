import { afterAll } from 'vitest';

/**
 * Files share their worker's globals (vitest `isolate: false`): a file that leaves a builtin
 * changed breaks whichever file that worker loads next, far from the cause — as a property
 * test that redefined `Object.prototype.__proto__` once made 47 unit files fail to load. This
 * fails the file that did it instead.
 */
interface Builtins {
  readonly proto: PropertyDescriptor | undefined;
  readonly iterator: unknown;
}

const KEPT = Symbol.for('viewer-cache.test.builtins');

/** Call from a setup file: checks, after each file's tests, what the first file found. */
export function failWhenBuiltinsChange(): void {
  const holder = globalThis as { [KEPT]?: Builtins };
  // The first file's view, kept for the process: a later file must not compare with a changed one.
  holder[KEPT] ??= {
    proto: Object.getOwnPropertyDescriptor(Object.prototype, '__proto__'),
    iterator: Array.prototype[Symbol.iterator],
  };
  const kept = holder[KEPT];
  afterAll(() => {
    const proto = Object.getOwnPropertyDescriptor(Object.prototype, '__proto__');
    const changed: string[] = [];
    if (proto?.get !== kept.proto?.get || proto?.set !== kept.proto?.set)
      changed.push('Object.prototype.__proto__');
    if (Array.prototype[Symbol.iterator] !== kept.iterator)
      changed.push('Array.prototype[Symbol.iterator]');
    for (const [name, target] of [
      ['Object.prototype', Object.prototype],
      ['Array.prototype', Array.prototype],
    ] as const) {
      for (const key in target) changed.push(`${name}.${key} (enumerable, added)`);
    }
    if (changed.length > 0) {
      throw new Error(
        `this file left builtins changed for the files after it: ${changed.join(', ')}`,
      );
    }
  });
}
