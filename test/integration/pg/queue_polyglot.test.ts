import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { asRun, pollUntil, type RunAnswer } from '../../helpers/server_process.js';

// Issue 21 on database workers: a real server with VIEWER_CACHE_EXECUTION=queue and one
// `viewer-cache worker` process (the demo's apps, python3 and @duckdb/node-api as installed).
// Every miss of the clinics app's Python and DuckDB twins is a job on the queue, run by the
// worker as the viewer the server recorded; each twin returns exactly what its SQL twin
// returns, for every viewer of "what each viewer sees", cached per viewer (a hit is answered by
// the server and never reaches the worker, so it starts no python3 and no DuckDB instance).

const WS = 'demo';
const NORA = 'nora@example.com'; // provider, North
const ADA = 'ada@example.com'; // North system administrator
const DANA = 'dana@example.com'; // provider and North system administrator
const RITA = 'rita@example.com'; // provider, no entitlement row
const SAM = 'sam@example.com'; // provider, South
const NOBODY = 'nobody@example.com'; // no roles at all

const TWINS = [
  ['f/clinics/patients', 'f/clinics/patients_py'],
  ['f/clinics/patients', 'f/clinics/patients_duckdb'],
  ['f/clinics/counts', 'f/clinics/counts_py'],
  ['f/clinics/counts', 'f/clinics/counts_duckdb'],
] as const;

const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-queue-poly:${prefix}`,
  execution: 'queue',
});
const made: Record<string, string> = {};
const token = (email: string) => made[email] ?? demoToken(SECRET_KEY, email);

type Viewer = { label: string; run: (path: string) => Promise<RunAnswer> };
const appRun = (email: string) => async (path: string) =>
  asRun(
    await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
      token: token(email),
      body: { path },
    }),
  );
const VIEWERS: Viewer[] = [
  { label: 'nora (provider, North)', run: appRun(NORA) },
  { label: 'sam (provider, South)', run: appRun(SAM) },
  { label: 'ada (system administrator)', run: appRun(ADA) },
  { label: 'dana (provider and system administrator)', run: appRun(DANA) },
  { label: 'rita (provider, no entitlement)', run: appRun(RITA) },
  { label: 'nobody (no roles)', run: appRun(NOBODY) },
  {
    label: 'an anonymous visitor',
    run: async (path) =>
      asRun(
        await e2e.request('POST', `/api/w/${WS}/public/apps/clinics-public/run`, {
          body: { path },
        }),
      ),
  },
];

/** Jobs the worker finished, by path and code, from its one log line per job. */
const finished = () =>
  e2e.workers[0]!.lines.map(
    (line) => JSON.parse(line) as { msg?: string; path?: string; code?: string },
  )
    .filter((l) => l.msg === 'job finished')
    .map((l) => ({ path: l.path!, code: l.code! }));

const outcomeOf = (answer: RunAnswer) =>
  answer.status === 200
    ? { status: 200, result: answer.result }
    : {
        status: answer.status,
        code: (answer.json as { error?: { code?: string } } | undefined)?.error?.code,
      };

/** Misses of each twin, counted by the table (each must show up once on the worker). */
const misses = new Map<string, number>();

beforeAll(async () => {
  await e2e.start();
  made[NOBODY] = (
    await e2e.cliJson<{ token: string }>(['token', 'create', '--user', NOBODY])
  ).token;
  await e2e.ready();
}, 180_000);

afterAll(async () => {
  await e2e.stop();
});

describe('Python and DuckDB twins on a queue worker', { timeout: 120_000 }, () => {
  it.each(VIEWERS.map((v) => [v.label, v] as const))(
    '%s: each twin answers what its SQL twin answers, cached per viewer',
    async (_, viewer) => {
      for (const [sql, twin] of TWINS) {
        const expected = outcomeOf(await viewer.run(sql));
        const ranBefore = finished().filter((f) => f.path === twin).length;
        const first = await viewer.run(twin);
        expect(outcomeOf(first), twin).toEqual(expected);
        if (expected.status !== 200) continue;
        // The miss was a job on the queue, run by the worker (its line is written in batches).
        expect(first.fromCache, twin).toBe(false);
        await pollUntil(
          async () => finished().filter((f) => f.path === twin).length > ranBefore,
          10_000,
        );
        misses.set(twin, (misses.get(twin) ?? 0) + 1);
        const jobs = finished().length;
        const second = await viewer.run(twin);
        expect(outcomeOf(second), twin).toEqual(expected);
        expect(second.fromCache, twin).toBe(true);
        expect(second.resultBytes, twin).toBe(first.resultBytes);
        // Nothing reached the worker for the hit: no job, so no python3 and no DuckDB instance.
        expect(finished().length, twin).toBe(jobs);
      }
    },
  );

  it('the table is not vacuous: rows, counts and refusals; every twin ran on the worker', async () => {
    expect((await appRun(NORA)('f/clinics/patients_py')).result).toEqual([
      { patient_id: 1, name: 'P. Ames', clinic: 'n1' },
      { patient_id: 2, name: 'P. Brook', clinic: 'n2' },
    ]);
    expect((await appRun(SAM)('f/clinics/patients_duckdb')).result).not.toEqual(
      (await appRun(NORA)('f/clinics/patients_duckdb')).result,
    );
    expect((await appRun(ADA)('f/clinics/counts_duckdb')).result).toEqual([
      { clinic: 'n1', patients: 3 },
      { clinic: 'n2', patients: 3 },
    ]);
    expect(outcomeOf(await appRun(ADA)('f/clinics/patients_py'))).toEqual({
      status: 403,
      code: 'E_ROLE_REQUIRED',
    });
    expect(outcomeOf(await VIEWERS.at(-1)!.run('f/clinics/counts_duckdb'))).toEqual({
      status: 403,
      code: 'E_NO_VIEWER',
    });
    expect([...misses.keys()].sort()).toEqual(TWINS.map(([, t]) => t).sort());
    const ran = finished();
    for (const [twin, count] of misses)
      expect(ran.filter((f) => f.path === twin && f.code === 'ok').length, twin).toBe(count);
  });
});
