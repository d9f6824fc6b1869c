import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// The house's walls: the executor and the data-table layer are siblings that meet only through
// the seam beneath them (src/connector), and the reference server uses the public entry only.

const SRC = resolve(import.meta.dirname, '../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') ? [path] : [];
  });
}

/** Every module a file imports, as a path relative to src/ (package imports are left out). */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const specifiers = [...text.matchAll(/(?:import|export)[^'"]*?from\s+'([^']+)'/g)].map(
    (match) => match[1]!,
  );
  return specifiers
    .filter((specifier) => specifier.startsWith('.'))
    .map((specifier) => relative(SRC, resolve(file, '..', specifier)));
}

function importsFrom(folder: string): { file: string; target: string }[] {
  return sourceFiles(join(SRC, folder)).flatMap((file) =>
    importsOf(file).map((target) => ({ file: relative(SRC, file), target })),
  );
}

describe('module boundaries', () => {
  it('finds imports (the scanner itself works)', () => {
    expect(importsFrom('executor').some(({ target }) => target.startsWith('connector/'))).toBe(
      true,
    );
  });

  it('executor/ never imports datatable/, and datatable/ never imports executor/', () => {
    const crossing = [
      ...importsFrom('executor').filter(({ target }) => target.startsWith('datatable/')),
      ...importsFrom('datatable').filter(({ target }) => target.startsWith('executor/')),
    ];
    expect(crossing).toEqual([]);
  });

  it('the seam and the shared utilities import neither side', () => {
    const upward = [...importsFrom('connector'), ...importsFrom('util')].filter(({ target }) =>
      /^(executor|datatable|cache|stores|server)\//.test(target),
    );
    expect(upward).toEqual([]);
  });

  it('datatable/ does not reach into cache/ or stores/', () => {
    const reaching = importsFrom('datatable').filter(({ target }) =>
      /^(cache|stores)\//.test(target),
    );
    expect(reaching).toEqual([]);
  });

  it('the reference server imports the library only through index.ts', () => {
    const library = importsFrom('server').filter(
      ({ target }) => !target.startsWith('server/') && target !== 'index.js',
    );
    expect(library).toEqual([]);
  });
});
