import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { cruise, type ICruiseResult, type IViolation } from 'dependency-cruiser';
import extractDepcruiseOptions from 'dependency-cruiser/config-utl/extract-depcruise-options';
import extractTSConfig from 'dependency-cruiser/config-utl/extract-ts-config';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The house's walls are rules in .dependency-cruiser.mjs, checked by dependency-cruiser over
// src/, test/ and bench/ (`npm run deps` prints the same report). The second test plants one
// violation of every rule in a scratch tree and expects each to be reported, and nothing else:
// a rule that no longer bites fails here.

const ROOT = resolve(import.meta.dirname, '../..');
const CONFIG = join(ROOT, '.dependency-cruiser.mjs');

const show = (v: IViolation) => `${v.rule.name}: ${v.from} → ${v.to}`;

async function cruiseTree(baseDir: string, tsConfig?: string): Promise<ICruiseResult> {
  const options = await extractDepcruiseOptions(CONFIG);
  const { output } = await cruise(
    ['src', 'test', 'bench'],
    {
      ...options,
      baseDir,
      ...(tsConfig === undefined ? { tsConfig: undefined } : {}),
    },
    {},
    tsConfig === undefined ? {} : { tsConfig: extractTSConfig(tsConfig) },
  );
  if (typeof output === 'string') throw new Error('expected a cruise result, not a report');
  return output;
}

describe('module boundaries (dependency-cruiser)', () => {
  it('src/, test/ and bench/ break none of the rules', { timeout: 120_000 }, async () => {
    const result = await cruiseTree(ROOT, join(ROOT, 'tsconfig.json'));
    // The cruise found the tree (an empty one would pass every rule).
    expect(result.summary.totalCruised).toBeGreaterThan(150);
    expect(result.summary.violations.map(show)).toEqual([]);
  });

  describe('every rule reports a violation planted in a scratch tree', () => {
    let scratch: string;
    let result: ICruiseResult;
    let ruleNames: string[];

    /** [the rule, the importing file, the file it imports] — each one breaks only its rule. */
    const planted: ReadonlyArray<readonly [string, string, string]> = [
      // Closed by a type-only import back (see below): a type cycle is still a cycle. A cycle is
      // reported once, at the edge the cruise met first.
      ['no-circular', 'src/util/loop_a.ts', 'src/util/loop_b.ts'],
      ['vocabulary-imports-no-folder', 'src/job.ts', 'src/util/base.ts'],
      ['executor-not-datatable', 'src/executor/run.ts', 'src/datatable/front.ts'],
      ['datatable-not-executor', 'src/datatable/wire.ts', 'src/executor/other.ts'],
      ['seams-import-neither-side', 'src/connector/seam.ts', 'src/cache/entry.ts'],
      ['datatable-not-cache-or-stores', 'src/datatable/door.ts', 'src/stores/base_store.ts'],
      ['stores-not-cache', 'src/stores/tier.ts', 'src/cache/entry.ts'],
      ['library-not-server', 'src/cache/report.ts', 'src/server/http/route.ts'],
      ['server-only-through-index', 'src/server/demo/seed.ts', 'src/job.ts'],
      [
        'datatable-rooms-not-front-door',
        'src/datatable/catalog/reach_up.ts',
        'src/datatable/front.ts',
      ],
      ['pg-floor', 'src/pg/floor.ts', 'src/datatable/catalog/state.ts'],
      [
        'datatable-catalog-layer',
        'src/datatable/catalog/state.ts',
        'src/datatable/access/rules.ts',
      ],
      ['datatable-access-layer', 'src/datatable/access/rules.ts', 'src/datatable/logins/leaser.ts'],
      [
        'datatable-logins-layer',
        'src/datatable/logins/leaser.ts',
        'src/datatable/identity/binding.ts',
      ],
      [
        'datatable-identity-layer',
        'src/datatable/identity/binding.ts',
        'src/datatable/admin/cmd.ts',
      ],
      ['datatable-admin-layer', 'src/datatable/admin/cmd.ts', 'src/datatable/identity/other.ts'],
      ['server-process-room', 'src/server/process/conf.ts', 'src/server/recipients/box.ts'],
      ['server-credentials-room', 'src/server/credentials/key.ts', 'src/server/apps/app.ts'],
      ['server-recipients-room', 'src/server/recipients/box.ts', 'src/server/credentials/tok.ts'],
      ['server-agents-room', 'src/server/agents/dispatch.ts', 'src/server/apps/sched.ts'],
      ['server-apps-room', 'src/server/apps/app.ts', 'src/server/demo/world.ts'],
      ['server-http-room', 'src/server/http/route.ts', 'src/server/demo/other.ts'],
      ['server-demo-room', 'src/server/demo/world.ts', 'src/server/http/schema.ts'],
      ['server-start-room', 'src/server/start/boot.ts', 'src/server/cli/cmd.ts'],
      ['server-cli-room', 'src/server/cli/cmd.ts', 'src/server/tools/odd.ts'],
      ['server-rooms-not-entries', 'src/server/start/up.ts', 'src/server/main.ts'],
      [
        'agent-process-loads-only-the-protocol',
        'src/server/agents/agent_worker.ts',
        'src/server/agents/agent_dispatch.ts',
      ],
      ['queue-own-room', 'src/executor/dispatch.ts', 'src/queue/room.ts'],
      ['queue-imports', 'src/queue/room.ts', 'src/cache/entry.ts'],
      ['audit-own-room', 'src/datatable/admin/lint.ts', 'src/audit/lints.ts'],
      ['audit-imports', 'src/audit/lints.ts', 'src/datatable/access/grants.ts'],
      ['server-audit-room', 'src/server/audit/runner.ts', 'src/server/start/open.ts'],
      ['src-not-tests-or-benches', 'src/util/helped.ts', 'test/helpers/helper.ts'],
      ['tests-not-benches', 'test/helpers/timed.ts', 'bench/scenario.ts'],
    ];

    beforeAll(async () => {
      scratch = mkdtempSync(join(tmpdir(), 'viewer-cache-walls-'));
      const files = new Map<string, string[]>();
      const add = (file: string, line?: string) => {
        const lines = files.get(file) ?? [];
        if (line !== undefined) lines.push(line);
        files.set(file, lines);
      };
      for (const [, from, to] of planted) {
        const specifier = relative(dirname(from), to).replace(/\.ts$/, '');
        add(from, `import '${specifier.startsWith('.') ? specifier : `./${specifier}`}';`);
        add(to);
      }
      add('src/util/loop_b.ts', "import type { A } from './loop_a';\nexport type B = A;");
      // Targets that import nothing would be orphans (a rule of their own): each imports a shared
      // leaf (the server's through index.ts, as it may), which the orphan fixture below does not.
      add('src/index.ts', "import './util/base';");
      for (const [file, lines] of files) {
        if (lines.length === 0 && file !== 'src/util/base.ts') {
          const leaf = file.startsWith('src/server/') ? 'src/index.ts' : 'src/util/base.ts';
          const specifier = relative(dirname(file), leaf).replace(/\.ts$/, '');
          lines.push(`import '${specifier.startsWith('.') ? specifier : `./${specifier}`}';`);
        }
      }
      add('src/util/loop_a.ts', 'export type A = 1;');
      add('src/util/lonely.ts', 'export const lonely = 1;');
      for (const [file, lines] of files) {
        mkdirSync(join(scratch, dirname(file)), { recursive: true });
        writeFileSync(join(scratch, file), `${lines.join('\n')}\nexport const x = 1;\n`);
      }
      result = await cruiseTree(scratch);
      const { default: config } = (await import(CONFIG)) as {
        default: { forbidden: { name: string }[] };
      };
      ruleNames = config.forbidden.map((rule) => rule.name);
    }, 120_000);

    afterAll(() => {
      if (scratch !== undefined) rmSync(scratch, { recursive: true, force: true });
    });

    it('reports exactly the planted violations', () => {
      const expected = [
        ...planted.map(([rule, from, to]) => `${rule}: ${from} → ${to}`),
        'no-orphans: src/util/lonely.ts → src/util/lonely.ts',
      ];
      expect(result.summary.violations.map(show).sort()).toEqual(expected.sort());
    });

    it('leaves no rule of the configuration without a planted violation', () => {
      const bitten = new Set(result.summary.violations.map((v) => v.rule.name));
      expect(ruleNames.filter((name) => !bitten.has(name))).toEqual([]);
    });
  });
});
