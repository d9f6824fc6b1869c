import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lintDatatables, type PolicyFinding } from '../../../src/index.js';
import { type ClinicsDb, clinicsDb, WS } from '../../helpers/clinics_db.js';

// Each lint, read from the catalog and the data table's own database (no runs): planted in the
// clinics demo's database, found naming the object and the fix, gone once fixed. The demo as
// seeded has two findings, both marked intended: the clinic directory everyone may read, and
// the counts view whose WHERE is the rule.

let c: ClinicsDb;
const INTENDED = {
  'clinics.clinics': 'the clinic directory: every role may read every clinic',
  'clinics.patient_counts': "an aggregate view whose WHERE is the rule (the guide's counts)",
};

beforeAll(async () => {
  c = await clinicsDb();
}, 120_000);
afterAll(async () => {
  await c?.close();
});

async function lint(
  intended: Record<string, string> = INTENDED,
): Promise<readonly PolicyFinding[]> {
  const { findings } = await lintDatatables({
    catalog: c.datatables.admin,
    workspace: WS,
    connection: c.db.url,
    intended,
  });
  return findings;
}
const failing = async () => (await lint()).filter((f) => f.status === 'fail');

describe('policy lints', () => {
  it('finds the demo clean but for its two marked exceptions, and reads that it reads the viewer', async () => {
    const found = await lintDatatables({
      catalog: c.datatables.admin,
      workspace: WS,
      connection: c.db.url,
      intended: INTENDED,
    });
    expect(found.findings.map((f) => [f.lint, f.object, f.status]).sort()).toEqual([
      ['rls-off', 'clinics.clinics', 'intended'],
      ['view-owner-rights', 'clinics.patient_counts', 'intended'],
    ]);
    expect(found.readIdentity).toEqual(['clinics']);
    // Unmarked, they fail.
    expect((await lint({})).filter((f) => f.status === 'fail')).toHaveLength(2);
  });

  it('a table granted to a data-table role with row security off', async () => {
    await c.sql.query('alter table clinics.patients disable row level security');
    try {
      const [finding] = await failing();
      expect(finding).toMatchObject({
        lint: 'rls-off',
        object: 'clinics.patients',
        roles: [c.roles.provider],
      });
      expect(finding!.fix).toContain('ENABLE ROW LEVEL SECURITY');
    } finally {
      await c.sql.query('alter table clinics.patients enable row level security');
    }
    expect(await failing()).toEqual([]);
  });

  it('permissive policies of two roles on one table, with both remedies', async () => {
    await c.sql.query(
      `create policy patients_admin on clinics.patients for select to "${c.roles.systemAdmin}"
         using (health_system = 'north')`,
    );
    try {
      const [finding] = await failing();
      expect(finding).toMatchObject({
        lint: 'permissive-policies-add-up',
        object: 'clinics.patients',
        roles: [c.roles.provider, c.roles.systemAdmin].sort(),
      });
      expect(finding!.message).toContain('patients_admin, patients_provider');
      expect(finding!.fix).toContain('roles=');
      expect(finding!.fix).toContain('AS RESTRICTIVE');
      // The second remedy: the same test, restrictive, no longer adds up.
      await c.sql.query('drop policy patients_admin on clinics.patients');
      await c.sql.query(
        `create policy patients_admin on clinics.patients as restrictive for select
           to "${c.roles.systemAdmin}" using (health_system = 'north')`,
      );
      expect(await failing()).toEqual([]);
    } finally {
      await c.sql.query('drop policy if exists patients_admin on clinics.patients');
    }
  });

  it('a policy that tests neither a role nor the viewer', async () => {
    await c.sql.query(
      `create policy everyone on clinics.entitlements for select using (health_system = 'north')`,
    );
    try {
      const [finding] = await failing();
      expect(finding).toMatchObject({
        lint: 'policy-tests-nobody',
        object: 'clinics.entitlements/everyone',
      });
      await c.sql.query(`alter policy everyone on clinics.entitlements to "${c.roles.provider}"`);
      expect(await failing()).toEqual([]);
    } finally {
      await c.sql.query('drop policy if exists everyone on clinics.entitlements');
    }
  });

  it("a view that reads with its owner's rights, unless security_invoker", async () => {
    await c.sql.query('create view clinics.all_patients as select * from clinics.patients');
    await c.sql.query(`grant select on clinics.all_patients to "${c.roles.provider}"`);
    try {
      const [finding] = await failing();
      expect(finding).toMatchObject({ lint: 'view-owner-rights', object: 'clinics.all_patients' });
      expect(finding!.fix).toContain('security_invoker = true');
      await c.sql.query('alter view clinics.all_patients set (security_invoker = true)');
      expect(await failing()).toEqual([]);
    } finally {
      await c.sql.query('drop view if exists clinics.all_patients');
    }
  });

  it('a SECURITY DEFINER function a data-table role may execute', async () => {
    await c.sql.query(
      `create function clinics.patient_total() returns bigint security definer language sql
         as 'select count(*) from clinics.patients'`,
    );
    try {
      const [finding] = await failing();
      expect(finding).toMatchObject({
        lint: 'security-definer-function',
        object: 'clinics.patient_total()',
      });
      expect(finding!.roles).toContain(c.roles.systemAdmin);
      await c.sql.query('revoke execute on function clinics.patient_total() from public');
      expect(await failing()).toEqual([]);
    } finally {
      await c.sql.query('drop function if exists clinics.patient_total()');
    }
  });
});
