import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { errors } from '../../src/index.js';

// Every code a caller can meet is in the errors reference: each class in `errors`, and every
// code written as a string anywhere under src/ (the server's, the CLI's and the workers' codes,
// which are not classes). A new code without a row in docs/errors.md fails here, naming it.

const ROOT = resolve(import.meta.dirname, '../..');
const GUIDE = 'docs/errors.md';

/** Codes written as string literals (`'E_X'`, `"E_X"`, `` `E_X` ``) in `text`. */
function codeLiterals(text: string): string[] {
  return [...new Set([...text.matchAll(/['"`](E_[A-Z0-9_]+)['"`]/g)].map((m) => m[1]!))];
}

/** The codes the reference documents: the first cell of each table row, backticked. */
function documented(guide: string): Set<string> {
  const names = new Set<string>();
  for (const [, cell] of guide.matchAll(/^\|\s*`(E_[A-Z0-9_]+)`\s*\|/gm)) names.add(cell!);
  return names;
}

/** Each code found under src/, with the first file that writes it. */
function codesInSource(): Map<string, string> {
  const found = new Map<string, string>();
  const files = (readdirSync(join(ROOT, 'src'), { recursive: true }) as string[])
    .filter((name) => name.endsWith('.ts'))
    .sort();
  for (const file of files) {
    for (const code of codeLiterals(readFileSync(join(ROOT, 'src', file), 'utf8')))
      if (!found.has(code)) found.set(code, `src/${file}`);
  }
  return found;
}

describe('the errors reference is complete', () => {
  const table = documented(readFileSync(join(ROOT, GUIDE), 'utf8'));

  it('finds codes in every quoting the code uses, and only whole codes', () => {
    expect(codeLiterals("code: 'E_A', \"E_B_2\", `E_C`; E_D; 'E_' 'XE_F'").sort()).toEqual([
      'E_A',
      'E_B_2',
      'E_C',
    ]);
  });

  it.each(Object.keys(errors))(`${GUIDE} has a row for %s`, (code) => {
    expect(
      table.has(code),
      `${code} (in \`errors\`, src/errors.ts) has no row in ${GUIDE}: add one to "The library's codes"`,
    ).toBe(true);
  });

  it(`${GUIDE} has a row for every code written under src/`, () => {
    const found = codesInSource();
    // The reads this suite knows must be there: a regex that found nothing would pass vacuously.
    expect([...found.keys()]).toEqual(
      expect.arrayContaining(['E_USAGE', 'E_BAD_REQUEST', 'E_NO_VIEWER']),
    );
    const missing = [...found]
      .filter(([code]) => !table.has(code))
      .map(([code, file]) => `${code} (written in ${file}): add a row to ${GUIDE}`);
    expect(missing).toEqual([]);
  });
});
