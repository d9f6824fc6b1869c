import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedLeaky } from '../../../examples/leaky-apps.js';
import { createDatatables } from '../../../src/index.js';
import type { AuditReport } from '../../../src/server/audit/audit_report.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { type CliResult, runCli, serverEnv } from '../../helpers/server_process.js';

// The audit bites: examples/leaky-apps.ts plants one runnable per leak class and one object per
// policy lint, and `viewer-cache audit --apps examples/leaky-apps.ts` exits 1 naming each — none
// missed. Its HTML report, opened in Debian's chromium, shows the matrix and why a cell fails.

const SECRET = 'leaky-audit-secret-0123456789abcdef-0123456789';
let db: TestDatabase;
let report: AuditReport;
let run: CliResult;
let dir: string;

beforeAll(async () => {
  const prefix = uniquePrefix();
  db = await createTestDatabase(prefix);
  const datatables = await createDatatables({ connection: db.url, secretKey: SECRET });
  try {
    await seedLeaky({ datatables, databaseUrl: db.url, rolePrefix: prefix });
  } finally {
    await datatables.close();
  }
  dir = await mkdtemp(join(tmpdir(), 'vc-audit-'));
  run = await runCli(serverEnv({ DATABASE_URL: db.url, VIEWER_CACHE_SECRET_KEY: SECRET }), [
    '--json',
    'audit',
    '--apps',
    'examples/leaky-apps.ts',
    '--junit',
    join(dir, 'audit.xml'),
    '--html',
    join(dir, 'audit.html'),
  ]);
  report = JSON.parse(run.stdout) as AuditReport;
}, 300_000);
afterAll(async () => {
  await db?.drop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const failed = (runnable: string, check: string) =>
  report.findings.filter(
    (f) => f.runnable === runnable && f.check === check && f.status === 'fail',
  );

describe('the audit of the leaky example', () => {
  it('fails: exit 1, and the JUnit report has a failure per failing cell', async () => {
    expect(report.status).toBe('fail');
    expect(run.code).toBe(1);
    const junit = await readFile(join(dir, 'audit.xml'), 'utf8');
    expect(junit).toContain('<testsuite name="f/leaky/memoised"');
    expect(junit).toMatch(/<failure message="[^"]*own fresh run/);
    expect(junit).toContain('name="view-owner-rights leaky.all_notes"');
  });

  it('a runnable that memoises a result in module state: differential isolation', () => {
    expect(failed('f/leaky/memoised', 'differential-isolation')).not.toEqual([]);
  });

  it('a cache of its own keyed without the viewer: differential isolation', () => {
    expect(failed('f/leaky/own_cache', 'differential-isolation')).not.toEqual([]);
  });

  it('a private app reading with the default role: varies by viewer', () => {
    expect(failed('f/leaky/default_role', 'varies-by-viewer')[0]?.message).toContain(
      'not as the viewer',
    );
  });

  it('falling back to the default role without a viewer: no viewer, no rows', () => {
    const found = failed('f/leaky/no_viewer_fallback', 'no-viewer-no-rows').map((f) => f.message);
    for (const nobody of ['(anonymous)', '(schedule)', '(hook)'])
      expect(found.some((m) => m.startsWith(nobody))).toBe(true);
    expect(failed('f/leaky/no_viewer_fallback', 'expectation')[0]?.message).toContain(
      'no-roles@audit.invalid',
    );
  });

  it('coalescing concurrent runs without the viewer: a per-recipient batch', () => {
    const found = failed('f/leaky/coalesced', 'per-recipient').map((f) => f.message);
    // dual@ runs first and sees both notes; the others in its batch are handed those rows.
    expect(found.length).toBeGreaterThan(0);
    expect(found.join(' ')).toMatch(/delivered .* by a per-recipient batch/);
  });

  it('an aggregate-only runnable returning a detail column: the declared expectation', () => {
    expect(failed('f/leaky/aggregate', 'expectation')[0]?.message).toContain('body');
  });

  it('every policy lint, on the object it is about', () => {
    const lints = report.lints
      .filter((l) => l.status === 'fail')
      .map((l) => `${l.lint} ${l.object}`)
      .sort();
    expect(lints).toEqual([
      'permissive-policies-add-up leaky.notes',
      'policy-tests-nobody leaky.tagged/everyone',
      'rls-off leaky.directory',
      'security-definer-function leaky.note_count()',
      'view-owner-rights leaky.all_notes',
    ]);
  });

  it('the failing cell says why', () => {
    const cell = report.cells.find((c) => c.runnable === 'f/leaky/memoised' && c.status === 'fail');
    expect(cell?.reasons.join(' ')).toMatch(/own fresh run/);
  });
});

describe('the HTML report, in a real browser', () => {
  it('renders the matrix, and a failing cell shows its reason', async () => {
    // Debian's chromium, driven headless; nothing is downloaded. A missing browser fails here.
    // A fresh profile of its own (playwright takes it as userDataDir, not as an argument).
    const browser = await chromium.launchPersistentContext(join(dir, 'profile'), {
      executablePath: '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    try {
      const page = await browser.newPage();
      await page.goto(`file://${join(dir, 'audit.html')}`);
      expect(await page.locator('#verdict').getAttribute('data-status')).toBe('fail');
      // A column per runnable, a row per viewer.
      expect(await page.locator('#matrix thead th').count()).toBe(report.runnables.length + 1);
      expect(await page.locator('#matrix tbody tr').count()).toBe(report.viewers.length);
      const failing = page.locator('td[data-runnable="f/leaky/memoised"][data-status="fail"]');
      expect(await failing.count()).toBeGreaterThan(0);
      const cell = failing.first();
      expect(await cell.isVisible()).toBe(true);
      // biome-ignore lint/performance/useDomNodeTextContent: the rendered text is what a person reads
      expect(await cell.locator('.reason').innerText()).toMatch(/own fresh run/);
      // The lints render with their fix.
      const lint = page.locator('#lints tr[data-lint="view-owner-rights"]');
      // biome-ignore lint/performance/useDomNodeTextContent: the rendered text is what a person reads
      expect(await lint.innerText()).toContain('security_invoker');
    } finally {
      await browser.close();
    }
  });
});
