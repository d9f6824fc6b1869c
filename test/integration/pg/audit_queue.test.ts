import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { AuditReport } from '../../../src/server/audit/audit_report.js';
import { runAudit } from '../../../src/server/audit/audit_runner.js';
import { type DemoDb, demoDb } from '../../helpers/demo_db.js';

// The audit of the demo (both worlds) in queue mode, as `viewer-cache audit --demo --execution
// queue` runs it: every cached run is a job on a queue of the audit's own, taken by its worker,
// and the worker path passes as the in-process one does.

let demo: DemoDb;
let report: AuditReport;

beforeAll(async () => {
  demo = await demoDb();
  report = await runAudit({
    apps: 'demo',
    databaseUrl: demo.db.url,
    secretKey: demo.secretKey,
    env: demo.env,
    execution: 'queue',
    redisUrl: inject('redisUrl'),
  });
}, 400_000);
afterAll(async () => {
  await demo?.close();
});

describe('the audit of the demo in queue mode', () => {
  it('ran its misses on the worker', () => {
    expect(report.execution).toBe('queue');
    expect(report.workerJobs).toBeGreaterThan(0);
  });

  it('passes: no failing cell, finding or lint', () => {
    const failing = [
      ...report.cells.filter((c) => c.status === 'fail'),
      ...report.findings.filter((f) => f.status === 'fail'),
      ...report.lints.filter((l) => l.status === 'fail'),
    ];
    expect(failing).toEqual([]);
  });

  it('serves patient detail to a provider through the worker, a hit on the second request', () => {
    const cell = report.cells.find(
      (c) => c.runnable === 'f/clinics/patients' && c.viewer === 'dana@example.com',
    );
    expect(cell).toMatchObject({ status: 'pass', rows: 1, cache: 'hit' });
    expect(cell?.reasons.join(' ')).toContain('as a recipient');
  });
});
