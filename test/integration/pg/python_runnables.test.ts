import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Executor } from '../../../src/index.js';
import { appOrigin, type ClinicsDb, clinicsDb, outcome } from '../../helpers/clinics_db.js';

// Python runnables (issue 21): `main(**args)` in `python3 -I` with a scrubbed environment; the
// `viewer_cache` module reaches the data tables only through the job's own socket with the
// job's token. Code that tries to read as anyone else — a forged token, a token after its job
// ended, the socket of another job, os.environ, SET ROLE / RESET ROLE through the proxy — gets
// nothing.

const NORA = 'nora@example.com';
const ADA = 'ada@example.com';
let fx: ClinicsDb;
let executor: Executor;
let shared: string;

/** Python that reads Nora's patients through the narrowed reference, as patients_py does. */
const PATIENTS_SQL = 'select patient_id from clinics.patients order by patient_id';
const py = (...lines: string[]) => lines.join('\n');

beforeAll(async () => {
  fx = await clinicsDb();
  shared = await mkdtemp(join(tmpdir(), 'vc-test-py-shared-'));
  const provider = JSON.stringify([fx.roles.provider]);
  const systemAdmin = fx.roles.systemAdmin;
  const patients = `datatable('clinics', as_viewer=True, roles=${provider})`;
  executor = fx.executorWith(
    {
      env: {
        kind: 'python',
        code: py('import os', 'def main():', '    return dict(os.environ)'),
      },
      flags: {
        kind: 'python',
        code: py(
          'import sys',
          'def main():',
          '    return {"isolated": sys.flags.isolated, "path": [p for p in sys.path if "vc-py-" in p]}',
        ),
      },
      forged: {
        kind: 'python',
        code: py(
          'import viewer_cache',
          'from viewer_cache import datatable',
          'def main():',
          "    viewer_cache._job['token'] = 'A' * 43",
          '    try:',
          `        return ${patients}.query(${JSON.stringify(PATIENTS_SQL)})`,
          '    except viewer_cache.JobTokenInvalidError as err:',
          '        return {"refused": err.code}',
        ),
      },
      // Leaves its socket and token behind for a later job.
      leaves: {
        kind: 'python',
        code: py(
          'import json, viewer_cache',
          'from viewer_cache import datatable',
          'def main(to):',
          `    rows = ${patients}.query(${JSON.stringify(PATIENTS_SQL)})`,
          '    with open(to, "w") as f:',
          '        json.dump(viewer_cache._job, f)',
          '    return rows',
        ),
      },
      // Tries what an earlier job left: its socket, and its token on this job's own socket.
      reuses: {
        kind: 'python',
        code: py(
          'import json, viewer_cache',
          'from viewer_cache import datatable',
          'def attempt():',
          `    return ${patients}.query(${JSON.stringify(PATIENTS_SQL)})`,
          'def main(left):',
          '    with open(left) as f:',
          '        old = json.load(f)',
          '    mine = dict(viewer_cache._job)',
          '    out = {}',
          '    viewer_cache._job.update(old)',
          '    try:',
          '        out["their_socket"] = attempt()',
          '    except Exception as err:',
          '        out["their_socket"] = type(err).__name__',
          "    viewer_cache._conn['sock'] = None",
          "    viewer_cache._job['socket'] = mine['socket']",
          '    try:',
          '        out["their_token"] = attempt()',
          '    except viewer_cache.ViewerCacheError as err:',
          '        out["their_token"] = err.code',
          '    return out',
        ),
      },
      // Waits (holding its socket open) until the other job has tried it.
      holds: {
        kind: 'python',
        code: py(
          'import json, os, stat, time, viewer_cache',
          'def main(to, done):',
          '    s = viewer_cache._job["socket"]',
          '    modes = [oct(stat.S_IMODE(os.stat(os.path.dirname(s)).st_mode)), oct(stat.S_IMODE(os.stat(s).st_mode))]',
          '    with open(to + ".tmp", "w") as f:',
          '        json.dump(viewer_cache._job, f)',
          '    os.rename(to + ".tmp", to)',
          '    for _ in range(2000):',
          '        if os.path.exists(done):',
          '            return modes',
          '        time.sleep(0.005)',
          '    return "never tried"',
        ),
      },
      // Uses the other (running) job's socket with its own token.
      intrudes: {
        kind: 'python',
        code: py(
          'import json, os, time, viewer_cache',
          'from viewer_cache import datatable',
          'def main(left, done):',
          '    for _ in range(2000):',
          '        if os.path.exists(left):',
          '            break',
          '        time.sleep(0.005)',
          '    with open(left) as f:',
          '        theirs = json.load(f)',
          "    viewer_cache._job['socket'] = theirs['socket']",
          '    try:',
          `        got = ${patients}.query(${JSON.stringify(PATIENTS_SQL)})`,
          '    except viewer_cache.ViewerCacheError as err:',
          '        got = err.code',
          '    open(done, "w").close()',
          '    return got',
        ),
      },
      // Every way back to a wider connection, through the proxy.
      widens: {
        kind: 'python',
        code: py(
          'import viewer_cache',
          'from viewer_cache import datatable',
          'ATTEMPTS = [',
          `    ("set_role", "set role ${systemAdmin}"),`,
          '    ("set_admin", "set role admin"),',
          '    ("reset_role", "reset role"),',
          '    ("session", "set session authorization default"),',
          '    ("two_statements", "select 1; reset role"),',
          `    ("set_config", "select set_config('role', '${systemAdmin}', false)"),`,
          ']',
          'def main():',
          `    db = ${patients}`,
          '    out = {}',
          '    for name, sql in ATTEMPTS:',
          '        try:',
          '            db.query(sql)',
          '            out[name] = "ok"',
          '        except viewer_cache.ViewerCacheError as err:',
          "            out[name] = getattr(err, 'sqlstate', None) or err.code",
          `    out["after"] = [r["patient_id"] for r in db.query(${JSON.stringify(PATIENTS_SQL)})]`,
          '    out["same_user"] = db.fetch_one("select current_user = session_user as s")["s"]',
          '    out["viewer"] = db.fetch_one("select viewer_cache.viewer_email() as v")["v"]',
          '    return out',
        ),
      },
      loops: { kind: 'python', code: py('def main():', '    while True:', '        pass') },
      big: { kind: 'python', code: py('def main():', '    return "x" * 200000') },
      prints: {
        kind: 'python',
        code: py(
          'import os',
          'def main(n):',
          '    print("noise")',
          '    os.write(1, b"more")',
          '    return n + 1',
        ),
      },
      raises: { kind: 'python', code: py('def main():', '    raise ValueError("nope")') },
      noMain: { kind: 'python', code: 'x = 1' },
      leavesChild: {
        kind: 'python',
        code: py(
          'import subprocess',
          'def main():',
          "    return subprocess.Popen(['sleep', '60'], start_new_session=False).pid",
        ),
      },
    },
    { timeout: '3s', python: { maxOutput: 100_000 } },
  );
}, 60_000);

afterAll(async () => {
  await fx?.close();
  if (shared) await rm(shared, { recursive: true, force: true });
});

const run = (path: string, viewer: string | null = NORA, args: Record<string, unknown> = {}) =>
  outcome(executor, executor, path, appOrigin(viewer), args);

describe('a Python runnable holds no credential', () => {
  it('os.environ is the scrubbed set: no connection string, secret or token', async () => {
    const { value } = await run('env');
    // PWD (and SHLVL, `_`) come from the test's counting wrapper, a shell script.
    const keys = Object.keys(value as object).filter((k) => !['PWD', 'SHLVL', '_'].includes(k));
    expect(keys.sort()).toEqual([
      'HOME',
      'LANG',
      'LC_ALL',
      'PATH',
      'PYTHONDONTWRITEBYTECODE',
      'PYTHONIOENCODING',
      'TMPDIR',
    ]);
    const text = JSON.stringify(value);
    for (const secret of [fx.db.url, 'postgres', 'secret', 'DATABASE_URL', 'REDIS'])
      expect(text).not.toContain(secret);
  });

  it('runs isolated (-I), with only its private directory added to the path', async () => {
    const { value } = await run('flags');
    expect(value).toEqual({ isolated: 1, path: [expect.stringMatching(/vc-py-/)] });
  });
});

describe('reading as anyone else gets nothing', () => {
  it('a forged token is refused', async () => {
    expect(await run('forged')).toEqual({
      value: { refused: 'E_JOB_TOKEN_INVALID' },
      fromCache: false,
    });
  });

  it("a job's socket and token are gone once it ends", async () => {
    const left = join(shared, 'left.json');
    const first = await run('leaves', NORA, { to: left });
    expect(first.value).toEqual([{ patient_id: 1 }, { patient_id: 2 }]);
    const { value } = await run('reuses', ADA, { left });
    expect(value).toEqual({
      their_socket: expect.stringMatching(/FileNotFoundError|ConnectionRefusedError/),
      their_token: 'E_JOB_TOKEN_INVALID',
    });
  });

  it("another running job's socket refuses this job's token; sockets are 0600 in 0700 directories", async () => {
    const left = join(shared, 'running.json');
    const done = join(shared, 'done');
    const [holder, intruder] = await Promise.all([
      run('holds', NORA, { to: left, done }),
      run('intrudes', ADA, { left, done }),
    ]);
    expect(intruder.value).toBe('E_JOB_TOKEN_INVALID');
    expect(holder.value).toEqual(['0o700', '0o600']);
  });

  it('SET ROLE, SET SESSION AUTHORIZATION and RESET ROLE through the proxy widen nothing', async () => {
    expect(await run('widens')).toEqual({
      fromCache: false,
      value: {
        // The proxy runs one statement of the allowed kinds, never a role change (set_config
        // included: its first argument may be built from anything).
        set_role: 'E_STATEMENT_REFUSED',
        set_admin: 'E_STATEMENT_REFUSED',
        reset_role: 'E_STATEMENT_REFUSED',
        session: 'E_STATEMENT_REFUSED',
        two_statements: 'E_STATEMENT_REFUSED',
        set_config: 'E_STATEMENT_REFUSED',
        after: [1, 2],
        same_user: true,
        viewer: NORA,
      },
    });
  });
});

describe('the process is bounded and its failures coded', () => {
  it('a job that outruns its timeout is killed: E_EXECUTOR_TIMEOUT', async () => {
    const before = await fx.spawns();
    expect((await run('loops')).code).toBe('E_EXECUTOR_TIMEOUT');
    expect(await fx.spawns()).toBe(before + 1);
  });

  it('a result past python.maxOutput is E_RESULT_TOO_LARGE', async () => {
    expect((await run('big')).code).toBe('E_RESULT_TOO_LARGE');
  });

  it("the runnable's prints do not reach its result; args arrive as main(**args)", async () => {
    expect((await run('prints', NORA, { n: 41 })).value).toBe(42);
  });

  it('an exception fails the run (E_EXECUTOR_FAILED), never cached; no main() too', async () => {
    expect(await run('raises')).toEqual({ code: 'E_EXECUTOR_FAILED' });
    expect(await run('noMain')).toEqual({ code: 'E_EXECUTOR_FAILED' });
  });

  it('a subprocess it leaves running ends with its job', async () => {
    const { value: pid } = await run('leavesChild');
    expect(typeof pid).toBe('number');
    const alive = () => {
      try {
        process.kill(pid as number, 0);
        return !isZombie(pid as number);
      } catch {
        return false;
      }
    };
    // Killed with the job's process group; reaped by init shortly after.
    const deadline = Date.now() + 5000;
    while (alive() && Date.now() < deadline) await new Promise((r) => setImmediate(r));
    expect(alive()).toBe(false);
  });

  it('no python3: a coded refusal, E_PYTHON_UNAVAILABLE', async () => {
    const without = fx.executorWith({}, { python: { command: '/nonexistent/python3' } });
    expect((await outcome(without, without, 'f/clinics/patients_py', appOrigin(NORA))).code).toBe(
      'E_PYTHON_UNAVAILABLE',
    );
  });

  it('file: is read once, at registration', async () => {
    const file = join(shared, 'from_file.py');
    await writeFile(file, py('def main():', '    return "from a file"'));
    const withFile = fx.executorWith({ fromFile: { kind: 'python', file } });
    await writeFile(file, py('def main():', '    return "changed later"'));
    expect((await outcome(withFile, withFile, 'fromFile', appOrigin(NORA))).value).toBe(
      'from a file',
    );
    expect(await readFile(file, 'utf8')).toContain('changed later');
  });
});

/** A killed process not yet reaped by its new parent still answers kill(pid, 0). */
function isZombie(pid: number): boolean {
  try {
    return /\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}
