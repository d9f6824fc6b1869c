import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { asRun, pollUntil, type RunAnswer } from '../../helpers/server_process.js';

// Issue 21 on agent workers: a real `--execution agent` server and a real agent worker process
// (`worker --agent --demo`, no database credential). The clinics app's Python and DuckDB twins
// run on the agent — Python's statements go to the agent's per-job socket and on, with the
// server's job token, to the query proxy; DuckDB's copies are read through the same proxy —
// and each returns exactly what its SQL twin returns, for every viewer, cached per viewer on
// the server (a hit reaches no agent and starts no python3). A Python job's token and socket
// are dead once its job ended.

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
let dir = '';
let e2e: E2eServer;
const made: Record<string, string> = {};
const token = (email: string) => made[email] ?? demoToken(SECRET_KEY, email);

/** The agent's python3: counts its starts and keeps what each was handed on stdin. */
const spawns = async () =>
  (await readFile(join(dir, 'spawns'), 'utf8').catch(() => '')).split('\n').filter(Boolean).length;
const payloads = async () =>
  (await readFile(join(dir, 'payloads'), 'utf8').catch(() => ''))
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { socket: string; token: string; path: string });

type Viewer = { label: string; run: (path: string) => Promise<RunAnswer> };
/** Run requests the test sent (one at a time). */
let sent = 0;
const appRun = (email: string) => async (path: string) => {
  const answer = await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
    token: token(email),
    body: { path },
  });
  sent++;
  return asRun(answer);
};
const VIEWERS: Viewer[] = [
  { label: 'nora (provider, North)', run: appRun(NORA) },
  { label: 'sam (provider, South)', run: appRun(SAM) },
  { label: 'ada (system administrator)', run: appRun(ADA) },
  { label: 'dana (provider and system administrator)', run: appRun(DANA) },
  { label: 'rita (provider, no entitlement)', run: appRun(RITA) },
  { label: 'nobody (no roles)', run: appRun(NOBODY) },
  {
    label: 'an anonymous visitor',
    run: async (path) => {
      const answer = await e2e.request('POST', `/api/w/${WS}/public/apps/clinics-public/run`, {
        body: { path },
      });
      sent++;
      return asRun(answer);
    },
  },
];

/** The server's access lines of run requests, in the order it answered them. */
const RUN_LINE = /"route":"[^"]*\/run"/;
const runLines = () => e2e.server.lines.filter((line) => RUN_LINE.test(line)).length;
/**
 * Requests the server's query proxy answered between its `n`-th run answer and the next (runs
 * are sent one at a time: these are the statements of the job of run `n + 1`).
 */
const proxiedDuringRun = (n: number) => {
  let runs = 0;
  let queries = 0;
  for (const line of e2e.server.lines) {
    if (RUN_LINE.test(line) && ++runs > n) break;
    if (runs === n && line.includes('"route":"/api/agent/query"')) queries++;
  }
  return queries;
};

/** Misses of each twin that ran on the agent, counted by the table. */
const misses = new Map<string, number>();

const outcomeOf = (answer: RunAnswer) =>
  answer.status === 200
    ? { status: 200, result: answer.result }
    : {
        status: answer.status,
        code: (answer.json as { error?: { code?: string } } | undefined)?.error?.code,
      };

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'vc-agent-polyglot-'));
  const python = join(dir, 'python3');
  await writeFile(
    python,
    `#!/bin/sh\necho x >> '${join(dir, 'spawns')}'\ntee -a '${join(dir, 'payloads')}' | python3 "$@"\n`,
    { mode: 0o755 },
  );
  e2e = new E2eServer({
    prefix,
    secretKey: SECRET_KEY,
    redisUrl: inject('redisUrl'),
    redisPrefix: `vc-agent-py:${prefix}`,
    execution: 'agent',
    agentEnv: { VIEWER_CACHE_PYTHON: python },
  });
  await e2e.start();
  made[NOBODY] = (
    await e2e.cliJson<{ token: string }>(['token', 'create', '--user', NOBODY])
  ).token;
  await e2e.ready();
  // The demo's schedules run once at start, on the agent: the digest, the orders list, and the
  // clinics patients of each of the five providers. Let them finish before counting requests.
  await pollUntil(async () => {
    const done = e2e.agent!.finished().map((f) => f.path);
    return (
      done.includes('f/clinics/digest') &&
      done.includes('f/orders/list') &&
      done.filter((p) => p === 'f/clinics/patients').length >= 5
    );
  }, 60_000);
}, 180_000);

afterAll(async () => {
  await e2e?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('Python and DuckDB twins on an agent worker', { timeout: 120_000 }, () => {
  it.each(VIEWERS.map((v) => [v.label, v] as const))(
    '%s: each twin answers what its SQL twin answers, cached per viewer',
    async (_, viewer) => {
      for (const [sql, twin] of TWINS) {
        // Every earlier run's access line is in, so the next two are the SQL twin's and this one's.
        await pollUntil(async () => runLines() >= sent, 5000);
        const runsBefore = runLines();
        const expected = outcomeOf(await viewer.run(sql));
        const ranBefore = e2e.agent!.finished().filter((f) => f.path === twin).length;
        const first = await viewer.run(twin);
        expect(outcomeOf(first), twin).toEqual(expected);
        // The miss ran on the agent (a refusal before any code is the server's, e.g. no viewer).
        // Its log line is written after it reported back: wait for it.
        if (expected.status === 200) {
          expect(first.fromCache, twin).toBe(false);
          await pollUntil(
            async () => e2e.agent!.finished().filter((f) => f.path === twin).length > ranBefore,
            10_000,
          );
        }
        if (expected.status === 200) {
          // Python's one statement is one request to the query proxy (the agent's socket adds
          // none); DuckDB's copy of its one table is two (its columns, then its rows).
          const statements = twin.endsWith('_py') ? 1 : 2;
          await pollUntil(async () => runLines() >= runsBefore + 2, 5000);
          expect(proxiedDuringRun(runsBefore + 1), twin).toBe(statements);
        }
        const started = await spawns();
        const finished = e2e.agent!.finished().length;
        const second = await viewer.run(twin);
        expect(outcomeOf(second), twin).toEqual(expected);
        if (expected.status === 200) {
          // A hit, served by the server: no job reached the agent, no python3 started.
          expect(second.fromCache, twin).toBe(true);
          expect(second.resultBytes, twin).toBe(first.resultBytes);
          expect(await spawns(), twin).toBe(started);
          misses.set(twin, (misses.get(twin) ?? 0) + 1);
          expect(e2e.agent!.finished().length, twin).toBe(finished);
        }
      }
    },
  );

  it('the table is not vacuous: rows, counts and refusals, and python3 ran on the agent', async () => {
    // (Hits, after the table above.)
    expect((await appRun(NORA)('f/clinics/patients_py')).result).toEqual([
      { patient_id: 1, name: 'P. Ames', clinic: 'n1' },
      { patient_id: 2, name: 'P. Brook', clinic: 'n2' },
    ]);
    expect((await appRun(ADA)('f/clinics/counts_duckdb')).result).toEqual([
      { clinic: 'n1', patients: 3 },
      { clinic: 'n2', patients: 3 },
    ]);
    expect(outcomeOf(await appRun(ADA)('f/clinics/patients_duckdb'))).toEqual({
      status: 403,
      code: 'E_ROLE_REQUIRED',
    });
    expect(outcomeOf(await VIEWERS.at(-1)!.run('f/clinics/patients_py'))).toEqual({
      status: 403,
      code: 'E_NO_VIEWER',
    });
    // Every twin's job that reached the agent was one of the misses above, and ran there: no
    // hit ever showed up late (lines are written after each job reports back).
    const ran = e2e.agent!.finished();
    for (const [twin, count] of misses)
      expect(ran.filter((f) => f.path === twin && f.code === 'ok').length, twin).toBe(count);
    expect([...misses.keys()].sort()).toEqual(TWINS.map(([, t]) => t).sort());
    // One python3 per Python job that reached the agent (a refusal by the narrowing is the
    // first query's answer, so it starts one too); none for DuckDB, none for a hit.
    await pollUntil(
      async () =>
        (await spawns()) === e2e.agent!.finished().filter((f) => f.path.endsWith('_py')).length,
      10_000,
    );
    expect(await spawns()).toBeGreaterThanOrEqual(
      [...misses].filter(([t]) => t.endsWith('_py')).reduce((n, [, c]) => n + c, 0),
    );
  });

  it("a Python job's token and socket on the agent are dead once its job ended", async () => {
    const before = (await payloads()).length;
    // Args make a new cache key, so python3 starts; main() takes none, so the job fails in
    // Python — what matters is that it ran on the agent and ended.
    const miss = await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
      token: token(NORA),
      body: { path: 'f/clinics/patients_py', args: { fresh: 1 } },
    });
    expect((miss.json as { error?: { code?: string } }).error?.code).toBe('E_EXECUTOR_FAILED');
    const handed = (await payloads()).slice(before);
    expect(handed.length).toBe(1);
    const { socket, token: jobToken } = handed[0]!;
    // What the process was handed is the agent's local token, never the server's job token
    // nor the agent's own token.
    expect(jobToken).not.toMatch(/^vc[aj]_/);
    const after = await new Promise<string>((resolve) => {
      const conn = createConnection(socket);
      conn.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
      conn.on('connect', () => {
        conn.write(
          `${JSON.stringify({
            protocol: 1,
            jobToken,
            reference: { datatable: 'clinics', role: '@viewer' },
            sql: 'select patient_id from clinics.patients',
          })}\n`,
        );
      });
      conn.setEncoding('utf8').on('data', (text: string) => {
        resolve(JSON.parse(text).code);
        conn.destroy();
      });
    });
    expect(['ENOENT', 'ECONNREFUSED', 'E_JOB_TOKEN_INVALID']).toContain(after);
  });
});
