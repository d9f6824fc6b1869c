import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditReport } from '../../../src/server/audit/audit_report.js';
import { runAudit } from '../../../src/server/audit/audit_runner.js';
import { type DemoDb, demoDb } from '../../helpers/demo_db.js';

// The audit of the demo (both worlds), as `viewer-cache audit --demo` runs it: it passes, with
// the clinics counts view's exception (and the clinic directory's) marked intended.

let demo: DemoDb;
let report: AuditReport;

beforeAll(async () => {
  demo = await demoDb();
  report = await runAudit({
    apps: 'demo',
    databaseUrl: demo.db.url,
    secretKey: demo.secretKey,
    env: demo.env,
  });
}, 300_000);
afterAll(async () => {
  await demo?.close();
});

describe('the audit of the demo', () => {
  it('passes: no failing cell, finding or lint', () => {
    const failing = [
      ...report.cells.filter((c) => c.status === 'fail'),
      ...report.findings.filter((f) => f.status === 'fail'),
      ...report.lints.filter((l) => l.status === 'fail'),
    ];
    expect(failing).toEqual([]);
    expect(report.status).not.toBe('fail');
  });

  it("marks the clinics view's exception intended", () => {
    expect(
      report.lints.map((l) => [l.lint, l.object.replace(/^t[0-9a-f]{8}_/, ''), l.status]),
    ).toContainEqual(['view-owner-rights', 'clinics.patient_counts', 'intended']);
  });

  it('derives every clinics user, the nobody viewers and an embed viewer', () => {
    const labels = report.viewers.map((v) => v.label);
    for (const email of ['dana@example.com', 'rita@example.com', 'no-roles@audit.invalid'])
      expect(labels).toContain(email);
    expect(labels).toEqual(
      expect.arrayContaining(['(anonymous)', '(schedule)', '(hook)', 'embed:clinics']),
    );
  });

  it('serves patient detail to a provider, refuses it to the nobody viewers, hits on the second request', () => {
    const cell = (viewer: string) =>
      report.cells.find((c) => c.runnable === 'f/clinics/patients' && c.viewer === viewer)!;
    expect(cell('dana@example.com')).toMatchObject({ status: 'pass', rows: 1, cache: 'hit' });
    expect(cell('(anonymous)')).toMatchObject({ status: 'pass', rows: null });
    expect(cell('ada@example.com').code).toBeDefined();
  });
});
