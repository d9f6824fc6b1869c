import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MemoryCacheStore, withResultCache } from '../../../src/index.js';
import {
  appOrigin,
  type ClinicsDb,
  clinicsDb,
  embedOrigin,
  outcome,
} from '../../helpers/clinics_db.js';

// Issue 21: the clinics app's Python and DuckDB twins return exactly what their SQL twins
// return, for every viewer of "what each viewer sees" (embed links and refusals included),
// cached per viewer — and a hit starts no python3 process and no DuckDB instance.

const VIEWERS = {
  'nora (provider, North)': appOrigin('nora@example.com'),
  'nick (provider, North)': appOrigin('nick@example.com'),
  'sam (provider, South)': appOrigin('sam@example.com'),
  'ada (system administrator, North)': appOrigin('ada@example.com'),
  'rita (provider, no entitlement)': appOrigin('rita@example.com'),
  'dana (provider and system administrator)': appOrigin('dana@example.com'),
  'nobody (no roles)': appOrigin('nobody@example.com'),
  'an anonymous visitor': appOrigin(null),
  'an embed link for North': embedOrigin('north'),
  'an embed link for South': embedOrigin('south'),
};
const TWINS = [
  ['f/clinics/patients', 'f/clinics/patients_py'],
  ['f/clinics/patients', 'f/clinics/patients_duckdb'],
  ['f/clinics/counts', 'f/clinics/counts_py'],
  ['f/clinics/counts', 'f/clinics/counts_duckdb'],
] as const;

let fx: ClinicsDb;
beforeAll(async () => {
  fx = await clinicsDb();
}, 60_000);
afterAll(async () => {
  await fx?.close();
});

describe('each twin returns what its SQL runnable returns, for every viewer', () => {
  it.each(Object.entries(VIEWERS))('%s', async (_, origin) => {
    for (const [sql, twin] of TWINS) {
      const expected = await outcome(fx.executor, fx.executor, sql, origin);
      const first = await outcome(fx.executor, fx.cached, twin, origin);
      expect({ value: first.value, code: first.code }, twin).toEqual({
        value: expected.value,
        code: expected.code,
      });
      const spawns = await fx.spawns();
      const instances = fx.instances();
      const second = await outcome(fx.executor, fx.cached, twin, origin);
      expect(second.value, twin).toEqual(expected.value);
      expect(second.code, twin).toEqual(expected.code);
      if (expected.code === undefined) {
        // Cached per viewer: the second run is a hit, and a hit starts nothing.
        expect(second.fromCache, twin).toBe(true);
        expect(await fx.spawns(), twin).toBe(spawns);
        expect(fx.instances(), twin).toBe(instances);
      }
    }
  });

  it('the table is not vacuous: rows for providers, counts for embeds, refusals for the rest', async () => {
    const nora = await outcome(
      fx.executor,
      fx.executor,
      'f/clinics/patients_py',
      VIEWERS['nora (provider, North)'],
    );
    expect(nora.value).toEqual([
      { patient_id: 1, name: 'P. Ames', clinic: 'n1' },
      { patient_id: 2, name: 'P. Brook', clinic: 'n2' },
    ]);
    const south = await outcome(
      fx.executor,
      fx.executor,
      'f/clinics/counts_duckdb',
      VIEWERS['an embed link for South'],
    );
    expect(south.value).toEqual([{ clinic: 's1', patients: 3 }]);
    const anon = await outcome(
      fx.executor,
      fx.executor,
      'f/clinics/patients_duckdb',
      VIEWERS['an anonymous visitor'],
    );
    expect(anon.code).toBe('E_NO_VIEWER');
    const ada = await outcome(
      fx.executor,
      fx.executor,
      'f/clinics/patients_py',
      VIEWERS['ada (system administrator, North)'],
    );
    expect(ada.code).toBe('E_ROLE_REQUIRED');
  });
});

// The leak classes of SPEC ("same runnable, two viewers"), for both new kinds.
describe('leak classes, for Python and DuckDB runnables', () => {
  const KINDS = ['f/clinics/patients_py', 'f/clinics/patients_duckdb'] as const;
  const NICKS = [
    { patient_id: 3, name: 'P. Chen', clinic: 'n1' },
    { patient_id: 4, name: 'P. Diaz', clinic: 'n2' },
  ];

  it.each(KINDS)(
    '%s: concurrent runs of two viewers are never coalesced into one',
    async (path) => {
      // A cache of its own: all four are misses, two pairs of identical runs in flight at once.
      const fresh = withResultCache(fx.executor, {
        store: new MemoryCacheStore(),
        fingerprint: fx.datatables.fingerprint,
      });
      const [nora, nick, nora2, nick2] = await Promise.all(
        ['nora@example.com', 'nick@example.com', 'nora@example.com', 'nick@example.com'].map(
          (email) => outcome(fx.executor, fresh, path, appOrigin(email)),
        ),
      );
      expect([nora, nick, nora2, nick2].map((r) => r!.fromCache)).toEqual([
        false,
        false,
        false,
        false,
      ]);
      expect(nick!.value).toEqual(NICKS);
      expect(nick2!.value).toEqual(NICKS);
      expect(nora!.value).toEqual(nora2!.value);
      expect(nora!.value).not.toEqual(NICKS);
    },
  );

  it('a revoked entitlement applies on the viewer’s next run, cached entries of both kinds included', async () => {
    for (const path of KINDS) {
      await outcome(fx.executor, fx.cached, path, appOrigin('nick@example.com'));
      expect(
        (await outcome(fx.executor, fx.cached, path, appOrigin('nick@example.com'))).fromCache,
      ).toBe(true);
    }
    await fx.sql.query('delete from clinics.entitlements where email = $1', ['nick@example.com']);
    await fx.settled();
    for (const path of KINDS) {
      const after = await outcome(fx.executor, fx.cached, path, appOrigin('nick@example.com'));
      expect(after, path).toEqual({ value: [], fromCache: false });
    }
    // Nobody else's entry moved.
    const nora = await outcome(
      fx.executor,
      fx.cached,
      'f/clinics/patients_py',
      appOrigin('nora@example.com'),
    );
    expect(nora.fromCache).toBe(true);
  });

  it('a role taken away applies on the next run: refused, never the cached rows', async () => {
    const { generation } = await fx.datatables.admin.removeMembership(
      'demo',
      'sam@example.com',
      'group',
      'providers',
    );
    await fx.datatables.waitForGeneration(generation);
    for (const path of KINDS)
      expect(
        (await outcome(fx.executor, fx.cached, path, appOrigin('sam@example.com'))).code,
        path,
      ).toBe('E_ROLE_REQUIRED');
  });
});
