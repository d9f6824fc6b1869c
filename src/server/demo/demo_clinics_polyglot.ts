import type { RunnableDefinition } from '../../index.js';

// The clinics app's Python and DuckDB twins: each asks for exactly what its SQL twin
// asks for (the same reference, narrowed the same way) and returns the same rows, for every
// viewer. Kept in a file of its own so the demo worlds can move without touching it.

/** `f/clinics/patients_py`, `…/counts_py`, `…/patients_duckdb`, `…/counts_duckdb`. */
export function clinicsPolyglotRunnables(
  datatable: string,
  roles: { provider: string; systemAdmin: string; embed: string },
): Record<string, RunnableDefinition> {
  const patientRoles = [roles.provider];
  const countRoles = [roles.provider, roles.systemAdmin, roles.embed].sort();
  const ref = (names: string[]) => `datatable://${datatable}?as=viewer&roles=${names.join(',')}`;
  const python = (names: string[], sql: string) =>
    [
      'from viewer_cache import datatable',
      '',
      'def main():',
      `    db = datatable(${JSON.stringify(datatable)}, as_viewer=True, roles=${JSON.stringify(names)})`,
      `    return db.query(${JSON.stringify(sql)})`,
      '',
    ].join('\n');
  return {
    'f/clinics/patients_py': {
      kind: 'python',
      code: python(
        patientRoles,
        'select patient_id, name, clinic from clinics.patients order by patient_id',
      ),
      cacheTtlS: 60,
    },
    'f/clinics/counts_py': {
      kind: 'python',
      code: python(
        countRoles,
        'select clinic, patients from clinics.patient_counts order by clinic',
      ),
      cacheTtlS: 60,
    },
    'f/clinics/patients_duckdb': {
      kind: 'duckdb',
      sql: `ATTACH '${ref(patientRoles)}' AS dt;
            SELECT patient_id, name, clinic FROM dt.clinics.patients ORDER BY patient_id`,
      cacheTtlS: 60,
    },
    'f/clinics/counts_duckdb': {
      kind: 'duckdb',
      sql: `ATTACH '${ref(countRoles)}' AS dt;
            SELECT clinic, patients FROM dt.clinics.patient_counts ORDER BY clinic`,
      cacheTtlS: 60,
    },
  };
}
