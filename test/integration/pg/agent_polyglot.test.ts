import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createExecutor } from '../../../src/index.js';
import { silentLogger } from '../../../src/logger.js';
import { startAgentWorker } from '../../../src/server/agents/agent_worker.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { clinicsWorld } from '../../../src/server/demo/demo_clinics.js';
import { DEMO_PUBLISHER } from '../../../src/server/demo/demo_users.js';
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

/**
 * The agent's interpreter (VIEWER_CACHE_PYTHON): keeps what each job was handed and, for a job
 * whose args name a `probe`, swaps the runnable's code for {@link HOSTILE_PY} — which then runs
 * exactly as a runnable's code runs on the agent: same runner, environment, socket and token.
 */
const swapPy = (payloads: string, hostile: string) =>
  [
    'import json, subprocess, sys',
    'line = sys.stdin.readline()',
    `with open(${JSON.stringify(payloads)}, 'a') as f:`,
    "    f.write(line.rstrip('\\n') + '\\n')",
    'payload = json.loads(line)',
    "if 'probe' in (payload.get('args') or {}):",
    `    with open(${JSON.stringify(hostile)}) as f:`,
    "        payload['code'] = f.read()",
    "data = (json.dumps(payload) + '\\n').encode()",
    "sys.exit(subprocess.run(['python3'] + sys.argv[1:], input=data).returncode)",
    '',
  ].join('\n');

/** Python that tries to read as someone else, from inside a job on the agent. */
const HOSTILE_PY = String.raw`import json, os, socket, time
import viewer_cache
from viewer_cache import datatable

PATIENTS = 'select patient_id from clinics.patients order by patient_id'


def ask(path, token, sql=PATIENTS):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    try:
        s.connect(path)
    except OSError as err:
        return type(err).__name__
    f = s.makefile('rwb')
    f.write(json.dumps({'id': 1, 'protocol': 1, 'jobToken': token,
                        'reference': {'datatable': 'clinics', 'role': '@viewer'},
                        'sql': sql, 'params': []}).encode() + b'\n')
    f.flush()
    line = f.readline()
    s.close()
    if not line:
        return 'closed'
    answer = json.loads(line)
    return [r['patient_id'] for r in answer['rows']] if answer.get('ok') else answer.get('code')


def wait_for(path):
    deadline = time.time() + 30
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)


def main(probe, to=None, left=None, done=None, roles=None, admin=None):
    own = viewer_cache._job
    if probe == 'env':
        return dict(os.environ)
    if probe == 'forged':
        return {'forged': ask(own['socket'], 'A' * 43), 'empty': ask(own['socket'], ''),
                'own': ask(own['socket'], own['token'])}
    if probe in ('leaves', 'holds'):
        with open(to + '.tmp', 'w') as f:
            json.dump({'socket': own['socket'], 'token': own['token']}, f)
        os.rename(to + '.tmp', to)
        if probe == 'holds':
            wait_for(done)
        return ask(own['socket'], own['token'])
    if probe == 'reuses':
        with open(left) as f:
            theirs = json.load(f)
        return {'their_socket': ask(theirs['socket'], theirs['token']),
                'their_token_here': ask(own['socket'], theirs['token'])}
    if probe == 'intrudes':
        wait_for(left)
        with open(left) as f:
            theirs = json.load(f)
        try:
            return ask(theirs['socket'], own['token'])
        finally:
            open(done, 'w').close()
    if probe == 'widens':
        db = datatable('clinics', as_viewer=True, roles=roles)
        out = {}
        for name, sql in [
            ('set_role', 'set role ' + admin),
            ('reset_role', 'reset role'),
            ('session', 'set session authorization default'),
            ('two_statements', 'select 1; reset role'),
            ('set_config', "select set_config('role', '" + admin + "', false)"),
        ]:
            try:
                db.query(sql)
                out[name] = 'ok'
            except viewer_cache.ViewerCacheError as err:
                out[name] = getattr(err, 'sqlstate', None) or err.code
        out['after'] = [r['patient_id'] for r in db.query(PATIENTS)]
        out['same_user'] = db.fetch_one('select current_user = session_user as s')['s']
        out['viewer'] = db.fetch_one('select viewer_cache.viewer_email() as v')['v']
        return out
    raise ValueError(probe)
`;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'vc-agent-polyglot-'));
  const python = join(dir, 'python3');
  await writeFile(
    python,
    `#!/bin/sh\necho x >> '${join(dir, 'spawns')}'\nexec python3 -I '${join(dir, 'swap.py')}' "$@"\n`,
    { mode: 0o755 },
  );
  await writeFile(join(dir, 'swap.py'), swapPy(join(dir, 'payloads'), join(dir, 'hostile.py')));
  await writeFile(join(dir, 'hostile.py'), HOSTILE_PY);
  e2e = new E2eServer({
    prefix,
    secretKey: SECRET_KEY,
    redisUrl: inject('redisUrl'),
    redisPrefix: `vc-agent-py:${prefix}`,
    execution: 'agent',
    agentEnv: { VIEWER_CACHE_PYTHON: python },
    // Two jobs at once: a Python job tries the socket of another one while it runs.
    agentArgs: ['--concurrency', '2'],
    // No body limit set: the bound test's result (10 502 rows, far over the 64 KiB request
    // limit) comes back from the agent in one finish request, under the agents' own limit.
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

/** A hostile Python job on the agent (see swapPy): its value, or its failure's code. */
const probe = async (email: string, args: Record<string, unknown>) =>
  outcomeOf(
    asRun(
      await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
        token: token(email),
        body: { path: 'f/clinics/patients_py', args },
      }),
    ),
  );

describe('hostile Python on the agent gets nothing', { timeout: 60_000 }, () => {
  it("os.environ holds the scrubbed set: no credential, no agent token, no server's address", async () => {
    const { status, result } = await probe(NORA, { probe: 'env' });
    expect(status).toBe(200);
    // PWD (and SHLVL, `_`) come from the test's wrapper, a shell script.
    const keys = Object.keys(result as object).filter((k) => !['PWD', 'SHLVL', '_'].includes(k));
    expect(keys.sort()).toEqual([
      'HOME',
      'LANG',
      'LC_ALL',
      'PATH',
      'PYTHONDONTWRITEBYTECODE',
      'PYTHONIOENCODING',
      'TMPDIR',
    ]);
    const text = JSON.stringify(result);
    for (const needle of ['vca_', 'vcj_', SECRET_KEY, e2e.url, 'VIEWER_CACHE', 'DATABASE_URL'])
      expect(text).not.toContain(needle);
  });

  it("a forged or empty token on the job's own socket is refused; its own token reads its rows", async () => {
    expect(await probe(NORA, { probe: 'forged' })).toEqual({
      status: 200,
      result: { forged: 'E_JOB_TOKEN_INVALID', empty: 'E_JOB_TOKEN_INVALID', own: [1, 2] },
    });
  });

  it("a finished job's socket and token read nothing from a later job", async () => {
    const to = join(dir, 'left.json');
    expect(await probe(NORA, { probe: 'leaves', to })).toEqual({ status: 200, result: [1, 2] });
    const { result } = await probe(SAM, { probe: 'reuses', left: to });
    expect(result).toEqual({
      their_socket: expect.stringMatching(/^(FileNotFoundError|ConnectionRefusedError)$/),
      their_token_here: 'E_JOB_TOKEN_INVALID',
    });
  });

  it("another running job's socket refuses this job's token", async () => {
    const left = join(dir, 'running.json');
    const done = join(dir, 'done');
    const [holder, intruder] = await Promise.all([
      probe(NORA, { probe: 'holds', to: left, done }),
      probe(SAM, { probe: 'intrudes', left, done }),
    ]);
    expect(intruder).toEqual({ status: 200, result: 'E_JOB_TOKEN_INVALID' });
    // The holder's socket was alive meanwhile (its own token read its rows after).
    expect(holder).toEqual({ status: 200, result: [1, 2] });
  });

  it('SET ROLE, RESET ROLE, SET SESSION AUTHORIZATION through the proxy widen nothing', async () => {
    expect(
      await probe(NORA, {
        probe: 'widens',
        roles: [`${prefix}provider`],
        admin: `${prefix}system_admin`,
      }),
    ).toEqual({
      status: 200,
      result: {
        set_role: 'E_STATEMENT_REFUSED',
        reset_role: 'E_STATEMENT_REFUSED',
        session: 'E_STATEMENT_REFUSED',
        two_statements: 'E_STATEMENT_REFUSED',
        // set_config can set role: refused by the proxy's allowlist, whatever it would set.
        set_config: 'E_STATEMENT_REFUSED',
        after: [1, 2],
        same_user: true,
        viewer: NORA,
      },
    });
  });
});

describe("the agent's DuckDB copy is bounded as in process", { timeout: 90_000 }, () => {
  it("past the proxy's 10 000 rows per statement: copied; past duckdb.maxRows (100 000): E_RESULT_TOO_LARGE", async () => {
    const db = new pg.Client({ connectionString: e2e.env['DATABASE_URL'] });
    db.on('error', () => {});
    await db.connect();
    const add = (from: number, count: number) =>
      db.query(
        `insert into clinics.patients
         select g, 'Bulk ' || g, 'n1', c.health_system, $3
           from generate_series($1::int, $1::int + $2::int - 1) g, clinics.clinics c where c.id = 'n1'`,
        [from, count, NORA],
      );
    try {
      // Nora reads her entitled patients (1 and 2), and now 10 500 more in n1.
      await add(100_000, 10_500);
      const within = asRun(
        await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
          token: token(NORA),
          body: { path: 'f/clinics/patients_duckdb', args: { fresh: 'bound-1' } },
        }),
      );
      expect(outcomeOf(within).status, within.text.slice(0, 300)).toBe(200);
      expect((within.result as unknown[]).length).toBe(10_502);
      // The copy is what she reads (RLS applied): 100 001 rows, one past the bound.
      await add(200_000, 100_001 - 10_502);
      const past = asRun(
        await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
          token: token(NORA),
          body: { path: 'f/clinics/patients_duckdb', args: { fresh: 'bound-2' } },
        }),
      );
      expect(outcomeOf(past)).toEqual({ status: 413, code: 'E_RESULT_TOO_LARGE' });
    } finally {
      await db.query('delete from clinics.patients where patient_id >= 100000');
      await db.end();
    }
  });
});

describe('a hostile DuckDB script on an agent is refused', { timeout: 60_000 }, () => {
  it('a second ATTACH, SET and INSTALL at registration; read_csv by the locks at run time', async () => {
    // Last in the file: the agent process stops, and an agent in this process takes the group's
    // jobs with hostile scripts under the server's names and versions (an agent whose apps were
    // tampered with). Its copies still come through the server's proxy as the recorded viewer.
    e2e.agent!.signal('SIGTERM');
    await e2e.agent!.closed;
    const { token: agentToken } = await e2e.cliJson<{ token: string }>([
      'agent-token',
      'create',
      '--group',
      'default',
    ]);
    const PATH = 'f/clinics/patients_duckdb';
    const served = createExecutor({ runnables: clinicsWorld(prefix, DEMO_PUBLISHER).runnables });
    const { hash } = served.createJob({
      workspace: WS,
      path: PATH,
      runAs: DEMO_PUBLISHER,
      origin: { kind: 'schedule' },
    }).runnable;
    const attach = `ATTACH 'datatable://clinics?as=viewer&roles=${prefix}provider' AS dt`;
    const agentWith = (sql: string) =>
      startAgentWorker({
        serverUrl: new URL(e2e.url),
        agentToken,
        runnables: { [PATH]: { kind: 'duckdb', sql, hash } },
        logger: silentLogger,
        waitMs: 2000,
      });
    const refusal = async (sql: string) => {
      let started: ReturnType<typeof agentWith>;
      try {
        started = agentWith(sql);
      } catch (err) {
        return (err as { code?: string }).code;
      }
      await started.stop();
      return 'started';
    };
    for (const statement of [
      "ATTACH '/tmp/vc-escape.db' AS second",
      "ATTACH 'datatable://clinics' AS dt2; ATTACH ':memory:' AS third",
      'SET enable_external_access = true',
      'INSTALL httpfs',
    ])
      expect(await refusal(`${attach}; ${statement}; SELECT 1`), statement).toBe(
        'E_DUCKDB_REFUSED',
      );
    const agent = agentWith(`${attach};
      SELECT d.patient_id, f.* FROM dt.clinics.patients d, read_csv('/etc/passwd') f`);
    try {
      const answer = asRun(
        await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
          token: token(NORA),
          body: { path: PATH, args: { fresh: 'hostile' } },
        }),
      );
      expect(outcomeOf(answer)).toEqual({ status: 400, code: 'E_DUCKDB_REFUSED' });
      expect(answer.text).not.toContain('root:');
    } finally {
      await agent.stop();
    }
  });
});
