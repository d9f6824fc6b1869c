import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  importDuckdb,
  loadDuckdb,
  runDuckdbScript,
} from '../../../src/executor/duckdb/duckdb_run.js';
import type { DuckdbScript } from '../../../src/executor/duckdb/duckdb_script.js';
import type { Executor } from '../../../src/index.js';
import { appOrigin, type ClinicsDb, clinicsDb, outcome } from '../../helpers/clinics_db.js';

// DuckDB runnables (issue 21): each table the script names is read through the viewer's
// connection into an in-memory DuckDB, which then runs the script with no file, network or
// extension access and its configuration locked. A script reaching for a file, a setting or an
// extension is refused (E_DUCKDB_REFUSED); the copy is bounded (E_RESULT_TOO_LARGE).

const NORA = 'nora@example.com';
const ADA = 'ada@example.com';
let fx: ClinicsDb;
let executor: Executor;
let bounded: Executor;
let attach: string;

beforeAll(async () => {
  fx = await clinicsDb();
  attach = `ATTACH 'datatable://clinics?as=viewer&roles=${fx.roles.provider}' AS dt`;
  const admin = `ATTACH 'datatable://clinics?as=viewer&roles=${fx.roles.systemAdmin}' AS dt`;
  const runnables = {
    passwd: { kind: 'duckdb', sql: `${attach}; SELECT * FROM read_csv('/etc/passwd')` },
    text: { kind: 'duckdb', sql: `${attach}; SELECT * FROM read_text('/etc/hostname')` },
    glob: { kind: 'duckdb', sql: `${attach}; SELECT * FROM glob('/etc/*')` },
    inCte: {
      kind: 'duckdb',
      sql: `${attach}; WITH x AS (SELECT * FROM read_csv_auto('/etc/passwd')) SELECT * FROM x`,
    },
    bareFile: { kind: 'duckdb', sql: `${attach}; SELECT * FROM '/etc/passwd'` },
    // Every patient row Nora's connection can see, and a join with a second table.
    all: {
      kind: 'duckdb',
      sql: `${attach};
            SELECT p.patient_id, c.name AS clinic_name, p.health_system
              FROM dt.clinics.patients p JOIN dt.clinics.clinics c ON c.id = p.clinic
             ORDER BY p.patient_id`,
    },
    // What a system administrator's connection may read of patient rows: nothing.
    adminPatients: { kind: 'duckdb', sql: `${admin}; SELECT * FROM dt.clinics.patients` },
    types: {
      kind: 'duckdb',
      sql: `${attach}; SELECT count(*) AS n, sum(patient_id) AS s, max(name) AS m FROM dt.clinics.patients`,
    },
  } as const;
  executor = fx.executorWith(runnables);
  bounded = fx.executorWith(runnables, { duckdb: { maxRows: 1 } });
}, 60_000);

afterAll(async () => {
  await fx?.close();
});

const run = (path: string, viewer: string | null = NORA, through = executor) =>
  outcome(through, through, path, appOrigin(viewer));

describe('a DuckDB script reads exactly what the viewer connection sees', () => {
  it('joined tables hold only the rows RLS lets the viewer see', async () => {
    expect((await run('all')).value).toEqual([
      { patient_id: 1, clinic_name: 'North Main', health_system: 'north' },
      { patient_id: 2, clinic_name: 'North Lakeside', health_system: 'north' },
    ]);
    expect((await run('all', 'sam@example.com')).value).toEqual([
      { patient_id: 5, clinic_name: 'South Central', health_system: 'south' },
      { patient_id: 6, clinic_name: 'South Central', health_system: 'south' },
    ]);
  });

  it('a table the connection may not read is refused by Postgres, not copied', async () => {
    const adminRun = await run('adminPatients', ADA);
    expect(adminRun.value).toBeUndefined();
    expect(adminRun.code).toBeDefined();
  });

  it('typed columns: integers stay numbers, text stays text', async () => {
    expect((await run('types')).value).toEqual([{ n: 2, s: 3, m: 'P. Brook' }]);
  });
});

describe('escapes are refused', () => {
  it.each(['passwd', 'text', 'glob', 'inCte'])('%s: E_DUCKDB_REFUSED', async (path) => {
    expect(await run(path)).toEqual({ code: 'E_DUCKDB_REFUSED' });
  });

  it('a file named as a table is no table', async () => {
    const { code } = await run('bareFile');
    expect(code).toMatch(/^E_(EXECUTOR_FAILED|DUCKDB_REFUSED)$/);
  });

  // The second wall, without the registration check: statements the parser would have refused,
  // run as they are, meet DuckDB's own locks.
  it.each([
    ['SET enable_external_access = true'],
    ['RESET enable_external_access'],
    ['SET lock_configuration = false'],
    ['INSTALL httpfs'],
    ['LOAD httpfs'],
    ["ATTACH '/tmp/vc-escape.db' AS x"],
    ["COPY (SELECT 1) TO '/tmp/vc-escape.csv'"],
  ])('past the parser, DuckDB itself refuses %s', async (statement) => {
    const script: DuckdbScript = {
      attachments: new Map([['dt', { name: 'clinics', access: { kind: 'default' } }]]),
      tables: [],
      statements: [statement],
    };
    const connect = async () => ({
      client: { query: async () => ({ rows: [], rowCount: 0 }) },
      query: async () => ({ rows: [], rowCount: 0 }),
      release: async () => {},
    });
    await expect(
      runDuckdbScript(script, connect as never, {
        maxRows: 10,
        maxBytes: 1000,
        memoryLimit: '64MB',
        load: loadDuckdb,
      }),
    ).rejects.toMatchObject({ code: 'E_DUCKDB_REFUSED' });
  });
});

describe('the copy is bounded', () => {
  it('more rows than duckdb.maxRows: E_RESULT_TOO_LARGE', async () => {
    expect(await run('all', NORA, bounded)).toEqual({ code: 'E_RESULT_TOO_LARGE' });
  });

  it('more bytes than duckdb.maxBytes: E_RESULT_TOO_LARGE', async () => {
    const tiny = fx.executorWith({}, { duckdb: { maxBytes: 20 } });
    expect(await run('f/clinics/patients_duckdb', NORA, tiny)).toEqual({
      code: 'E_RESULT_TOO_LARGE',
    });
  });

  it('@duckdb/node-api missing: E_DUCKDB_UNAVAILABLE', async () => {
    const missing = fx.executorWith(
      {},
      { duckdb: { load: () => importDuckdb('@duckdb/node-api-not-installed') } },
    );
    expect(await run('f/clinics/counts_duckdb', NORA, missing)).toEqual({
      code: 'E_DUCKDB_UNAVAILABLE',
    });
  });
});
