import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { errors } from '../../src/index.js';

// Every code in `errors` is documented in the README's error table: a new code without a line
// there fails here.
const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');

describe('error catalogue is documented', () => {
  it.each(Object.keys(errors))('README.md mentions %s', (code) => {
    // whole word: E_CATALOG must not be satisfied by E_CATALOG_SOMETHING
    expect(readme).toMatch(new RegExp(`\\b${code}\\b`));
  });
});
