import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { buildCli } from '../../src/server/cli/cli.js';

// Every command of the CLI and every flag it takes is in the configuration reference's CLI table
// (docs/configuration.md), on the row that names the command: an operator should find a flag
// without running --help on every command.

const ROOT = resolve(import.meta.dirname, '../..');
const GUIDE = 'docs/configuration.md';

/** The command paths (`token create`) and the long flags each takes, from the program itself. */
function commands(program: Command): Array<{ path: string; flags: string[] }> {
  const out: Array<{ path: string; flags: string[] }> = [];
  const walk = (command: Command, prefix: string): void => {
    for (const sub of command.commands) {
      if (sub.name() === 'help') continue;
      const path = prefix === '' ? sub.name() : `${prefix} ${sub.name()}`;
      if (sub.commands.length > 0) walk(sub, path);
      else out.push({ path, flags: sub.options.map((o) => o.long!).filter(Boolean) });
    }
  };
  walk(program, '');
  return out;
}

/** The rows of the table (`| first cell | … |`) whose first cell names `path` in backticks. */
function rowsFor(guide: string, path: string): string[] {
  return guide
    .split('\n')
    .filter((line) => line.startsWith('|'))
    .filter((line) => {
      const first = line.split('|')[1] ?? '';
      return [...first.matchAll(/`([^`]+)`/g)].some(
        (m) => m[1] === path || m[1]!.startsWith(`${path} `),
      );
    });
}

describe('the CLI is documented', () => {
  const guide = readFileSync(join(ROOT, GUIDE), 'utf8');
  const program = buildCli();
  const all = commands(program);

  it('walks the whole program (an empty walk would pass vacuously)', () => {
    expect(all.map((c) => c.path)).toEqual(
      expect.arrayContaining(['serve', 'worker', 'token create', 'cache invalidate']),
    );
  });

  it(`every flag of the program itself is on the "every command" row of ${GUIDE}`, () => {
    const row = rowsFor(guide, 'viewer-cache').join('\n');
    const missing = program.options
      .map((o) => o.long!)
      .filter((flag) => !row.includes(`\`${flag}`) && !row.includes(` ${flag}`));
    expect(missing.map((f) => `${f}: add it to the "every command" row of ${GUIDE}`)).toEqual([]);
  });

  it.each(all)(`$path and each of its flags are in ${GUIDE}`, ({ path, flags }) => {
    const rows = rowsFor(guide, path);
    expect(rows, `no row of the CLI table in ${GUIDE} names \`${path}\`: add one`).not.toEqual([]);
    const text = rows.join('\n');
    const missing = flags.filter((flag) => !new RegExp(`[\`\\s]${flag}\\b`).test(text));
    expect(missing.map((f) => `${path} ${f}: add it to the \`${path}\` row of ${GUIDE}`)).toEqual(
      [],
    );
  });
});
