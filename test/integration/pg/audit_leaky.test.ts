import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedLeaky } from '../../../examples/leaky-apps.js';
import { createDatatables } from '../../../src/index.js';
import type { AuditReport } from '../../../src/server/audit/audit_report.js';
import { runAudit } from '../../../src/server/audit/audit_runner.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { ROOT } from '../../helpers/server_process.js';

// The audit bites: examples/leaky-apps.ts plants one runnable per leak class and one object per
// policy lint, and the audit fails naming each — none missed.

const SECRET = 'leaky-audit-secret-0123456789abcdef-0123456789';
let db: TestDatabase;
let report: AuditReport;

beforeAll(async () => {
  const prefix = uniquePrefix();
  db = await createTestDatabase(prefix);
  const datatables = await createDatatables({ connection: db.url, secretKey: SECRET });
  try {
    await seedLeaky({ datatables, databaseUrl: db.url, rolePrefix: prefix });
  } finally {
    await datatables.close();
  }
  report = await runAudit({
    apps: join(ROOT, 'examples/leaky-apps.ts'),
    databaseUrl: db.url,
    secretKey: SECRET,
  });
}, 300_000);
afterAll(async () => {
  await db?.drop();
});

const failed = (runnable: string, check: string) =>
  report.findings.filter((f) => f.runnable === runnable && f.check === check && f.status === 'fail');

describe('the audit of the leaky example', () => {
  it('fails', () => {
    expect(report.status).toBe('fail');
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
    const cell = report.cells.find(
      (c) => c.runnable === 'f/leaky/memoised' && c.status === 'fail',
    );
    expect(cell?.reasons.join(' ')).toMatch(/own fresh run/);
  });
});
