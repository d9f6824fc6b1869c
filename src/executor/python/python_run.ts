import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DatatableConnector } from '../../connector/datatable_connector.js';
import {
  DatatableUnavailableError,
  ExecutorFailedError,
  ExecutorTimeoutError,
  errorClassOf,
  PythonUnavailableError,
  ResultTooLargeError,
} from '../../errors.js';
import type { Job } from '../../job.js';
import type { RawQueryProxyLimits } from '../../proxy/query_proxy.js';
import { openJobSocket } from './job_socket.js';
import { PYTHON_BOOT, VIEWER_CACHE_PY } from './viewer_cache_py.js';

/** How Python runnables are started, resolved by the executor. */
export interface PythonLimits {
  /** The interpreter, e.g. `python3` (found on the executor's PATH) or an absolute path. */
  readonly command: string;
  /** Bytes the result (stdout) may take. */
  readonly maxOutputBytes: number;
  /** Bounds of each proxied statement (rows, bytes, time); the proxy's defaults when absent. */
  readonly queryLimits: RawQueryProxyLimits | undefined;
}

/** Nothing of the executor's environment: no DATABASE_URL, no secret, no token. */
function scrubbedEnv(dir: string): NodeJS.ProcessEnv {
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    LANG: 'C.UTF-8',
    LC_ALL: 'C.UTF-8',
    HOME: dir,
    TMPDIR: dir,
    PYTHONIOENCODING: 'utf-8',
    PYTHONDONTWRITEBYTECODE: '1',
  };
}

const STDERR_KEPT = 64 * 1024;

/**
 * Runs `main(**args)` of `code` in `python3 -I` (isolated: no PYTHONPATH, no user site, no
 * script directory on the path) with a scrubbed environment, in a private 0700 directory that
 * holds the `viewer_cache` module and the job's 0600 socket. The socket accepts only this run's
 * token and closes when the run ends, however it ends; the process is killed on abort.
 */
export async function runPython(
  code: string,
  path: string,
  job: Job,
  args: Record<string, unknown>,
  connector: DatatableConnector | undefined,
  signal: AbortSignal,
  limits: PythonLimits,
): Promise<unknown> {
  // Without data tables the process could still run, but every query would be refused: say so.
  if (connector === undefined) throw new DatatableUnavailableError();
  const dir = await mkdtemp(join(tmpdir(), 'vc-py-')); // mode 0700
  try {
    await writeFile(join(dir, 'viewer_cache.py'), VIEWER_CACHE_PY, { mode: 0o600 });
    const socket = await openJobSocket(join(dir, 'q.sock'), job, connector, limits.queryLimits);
    try {
      const payload = { dir, socket: socket.path, token: socket.token, code, path, args };
      return await spawnPython(JSON.stringify(payload), dir, signal, limits);
    } finally {
      await socket.close();
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function spawnPython(
  payload: string,
  dir: string,
  signal: AbortSignal,
  limits: PythonLimits,
): Promise<unknown> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new ExecutorTimeoutError());
    const child = spawn(limits.command, ['-I', '-c', PYTHON_BOOT], {
      cwd: dir,
      env: scrubbedEnv(dir),
      stdio: ['pipe', 'pipe', 'pipe'],
      // A process group of its own, so that whatever it started ends with it (killGroup).
      detached: true,
    });
    const killGroup = () => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // ESRCH: the group is already gone.
      }
    };
    let failure: Error | undefined;
    const stop = (err: Error) => {
      failure ??= err;
      killGroup();
    };
    const onAbort = () => stop(new ExecutorTimeoutError());
    signal.addEventListener('abort', onAbort, { once: true });
    const out: Buffer[] = [];
    let outBytes = 0;
    let errTail = '';
    child.stdout.on('data', (chunk: Buffer) => {
      outBytes += chunk.length;
      if (outBytes > limits.maxOutputBytes)
        stop(
          new ResultTooLargeError('the Python runnable returned more than python.maxOutputBytes'),
        );
      else out.push(chunk);
    });
    child.stderr.on('data', (chunk: Buffer) => {
      errTail = (errTail + chunk.toString('utf8')).slice(-STDERR_KEPT);
    });
    child.stdin.on('error', () => {}); // a process that exits before reading its stdin
    child.on('error', (err: NodeJS.ErrnoException) => {
      signal.removeEventListener('abort', onAbort);
      reject(
        err.code === 'ENOENT' || err.code === 'EACCES'
          ? new PythonUnavailableError(undefined, { cause: err })
          : new ExecutorFailedError(`python could not start: ${err.message}`, { cause: err }),
      );
    });
    // Its own exit ends its group: a subprocess holding our pipes would otherwise keep 'close'
    // (and the job) waiting until the timeout.
    child.on('exit', killGroup);
    child.on('close', (exitCode) => {
      signal.removeEventListener('abort', onAbort);
      // Nothing the runnable started outlives its job (a subprocess it left running).
      killGroup();
      if (failure !== undefined) return reject(failure);
      const text = Buffer.concat(out).toString('utf8');
      let answer: {
        ok: boolean;
        value?: unknown;
        code?: string | null;
        type?: string;
        message?: string;
      };
      try {
        answer = JSON.parse(text);
      } catch {
        const last = errTail.trim().split('\n').pop() ?? '';
        return reject(
          new ExecutorFailedError(
            `the Python runnable exited (${exitCode}) without a result: ${last}`,
          ),
        );
      }
      if (answer.ok) return resolve(answer.value ?? null);
      const Coded = errorClassOf(answer.code);
      reject(
        Coded !== undefined
          ? new Coded(answer.message)
          : new ExecutorFailedError(`python raised ${answer.type}: ${answer.message}`),
      );
    });
    child.stdin.end(`${payload}\n`);
  });
}
