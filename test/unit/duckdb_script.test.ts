import { describe, expect, it } from 'vitest';
import { parseDuckdbScript } from '../../src/executor/duckdb/duckdb_script.js';
import { createExecutor } from '../../src/index.js';

// A DuckDB runnable's script is read at registration: the data tables it attaches, the
// `alias.schema.table` names it reads, and nothing outside the sandbox (issue 21).

const ATTACH = "ATTACH 'datatable://clinics?as=viewer&roles=provider' AS dt";

describe('parseDuckdbScript', () => {
  it('finds the attachments and every alias.schema.table, ATTACH removed from what runs', () => {
    const script = parseDuckdbScript(`${ATTACH};
      -- dt.not.this (a comment)
      SELECT p.name, 'dt.nor.this' AS s FROM dt.clinics.patients p
        JOIN DT.clinics."Clinics" c ON c.id = p.clinic
       WHERE p.patient_id IN (SELECT patient_id FROM dt.clinics.patients)`);
    expect([...script.attachments]).toEqual([
      ['dt', { name: 'clinics', access: { kind: 'narrowed', roles: ['provider'] } }],
    ]);
    expect(script.tables).toEqual([
      { alias: 'dt', schema: 'clinics', table: 'patients' },
      { alias: 'dt', schema: 'clinics', table: 'Clinics' },
    ]);
    expect(script.statements).toHaveLength(1);
    expect(script.statements[0]).toMatch(/^SELECT p\.name/);
  });

  it.each([
    ['a second, non-datatable ATTACH', `${ATTACH}; ATTACH '/tmp/x.db' AS x; SELECT 1`],
    ['an in-memory ATTACH', `${ATTACH}; ATTACH ':memory:' AS x; SELECT 1`],
    ['the same alias twice', `${ATTACH}; ${ATTACH}; SELECT 1`],
    ['SET enable_external_access', `${ATTACH}; SET enable_external_access = true; SELECT 1`],
    ['RESET', `${ATTACH}; RESET lock_configuration; SELECT 1`],
    ['INSTALL', `${ATTACH}; INSTALL httpfs; SELECT 1`],
    ['LOAD', `${ATTACH}; LOAD postgres; SELECT 1`],
    ['COPY', `${ATTACH}; COPY (SELECT 1) TO '/tmp/out.csv'`],
    ['PRAGMA', `${ATTACH}; PRAGMA enable_profiling`],
    ['DETACH', `${ATTACH}; DETACH dt`],
    ['USE', `${ATTACH}; USE dt; SELECT * FROM clinics.patients`],
    ['a write to the attached table', `${ATTACH}; INSERT INTO dt.clinics.patients VALUES (1)`],
    [
      'a table created in the attached data table',
      `${ATTACH}; CREATE TABLE dt.clinics.x AS SELECT 1`,
    ],
    ['EXPORT DATABASE', `${ATTACH}; EXPORT DATABASE '/tmp/x'`],
    ['no ATTACH at all', 'SELECT 1'],
    ['only an ATTACH', ATTACH],
  ])('refuses %s: E_DUCKDB_REFUSED', (_, sql) => {
    expect(() => parseDuckdbScript(sql)).toThrow(
      expect.objectContaining({ code: 'E_DUCKDB_REFUSED' }),
    );
  });

  it('a malformed reference is the reference grammar refusal', () => {
    expect(() =>
      parseDuckdbScript("ATTACH 'datatable://clinics?as=publisher' AS dt; SELECT 1"),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_DATATABLE_REF' }));
  });

  it('allows its own temporary objects', () => {
    const script = parseDuckdbScript(
      `${ATTACH}; CREATE TEMP TABLE mine AS SELECT * FROM dt.clinics.patients; SELECT count(*) FROM mine`,
    );
    expect(script.statements).toHaveLength(2);
  });

  it('the executor refuses an escaping script at registration, before any run', () => {
    expect(() =>
      createExecutor({
        runnables: { bad: { kind: 'duckdb', sql: `${ATTACH}; INSTALL httpfs; SELECT 1` } },
      }),
    ).toThrow(expect.objectContaining({ code: 'E_DUCKDB_REFUSED' }));
  });
});
