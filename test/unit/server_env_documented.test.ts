import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// Every environment variable the code reads — the reference server's and CLI's under src/server,
// and the library's — is in the configuration reference's tables (docs/configuration.md): an
// operator should never have to read the source to find a setting.

const ROOT = resolve(import.meta.dirname, '../..');
const SRC = join(ROOT, 'src');
const GUIDE = 'docs/configuration.md';

/** Names read as `env['X']`, `env.X`, `process.env['X']` or `process.env.X` in `text`. */
function envReads(text: string): string[] {
  const names = new Set<string>();
  for (const match of text.matchAll(
    /\benv(?:\[\s*['"]([A-Z][A-Z0-9_]*)['"]\s*\]|\.([A-Z][A-Z0-9_]*)\b)/g,
  ))
    names.add((match[1] ?? match[2])!);
  return [...names];
}

/** The variables the guide's tables list (every backticked name in a row's first cell). */
function documented(guide: string): Set<string> {
  const names = new Set<string>();
  for (const [, cell] of guide.matchAll(/^\|([^|\n]*)\|/gm)) {
    for (const m of cell!.matchAll(/`([A-Z][A-Z0-9_]*)`/g)) names.add(m[1]!);
  }
  return names;
}

describe('server environment', () => {
  it('finds reads in every form the code uses', () => {
    expect(
      envReads(
        "env['A_B'] ?? process.env['C'] ?? process.env.D_1 ?? env.E; const x = env[name]; envx['F']",
      ).sort(),
    ).toEqual(['A_B', 'C', 'D_1', 'E']);
  });

  it(`every variable read under src/ (every room, the library too) is in ${GUIDE}`, () => {
    const files = (readdirSync(SRC, { recursive: true }) as string[]).filter((name) =>
      name.endsWith('.ts'),
    );
    const read = new Map<string, string>();
    for (const file of files) {
      for (const name of envReads(readFileSync(join(SRC, file), 'utf8')))
        read.set(name, `src/${file}`);
    }
    // The reads this suite knows must be there: a regex that found nothing would pass vacuously.
    expect([...read.keys()]).toEqual(
      expect.arrayContaining([
        'DATABASE_URL',
        'REDIS_URL',
        'VIEWER_CACHE_DEMO_ROLE_PREFIX',
        'VIEWER_CACHE_LOG_SALT',
      ]),
    );
    const table = documented(readFileSync(join(ROOT, GUIDE), 'utf8'));
    const missing = [...read]
      .filter(([name]) => !table.has(name))
      .map(([n, f]) => `${n} (read in ${f}): add a row to the environment table of ${GUIDE}`);
    expect(missing).toEqual([]);
  });
});
