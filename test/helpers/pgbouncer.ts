import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from './free_port.js';
import { waitUntil } from './wait.js';

/**
 * A private PgBouncer in transaction mode in front of the cluster under test, on a free port.
 *
 * Data-table logins are created at run time with SCRAM verifiers only the cluster knows, so
 * PgBouncer looks each one up with `auth_query` (as the cluster's superuser, whose password is
 * in the private auth file) and logs in to the cluster with the client's own SCRAM proof.
 * Debian's `pgbouncer` package (installed by .ci/services-up.sh); a missing binary fails loudly.
 */
export interface PgBouncer {
  readonly host: string;
  readonly port: number;
  /** Rows of `SHOW POOLS` (one per database × user) from the admin console. */
  pools(): Promise<{ database: string; user: string; sv_active: number; sv_idle: number }[]>;
  close(): Promise<void>;
}

const BINARY = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer'].find((path) => existsSync(path));

export async function startPgBouncer(
  adminUrl: string,
  /**
   * `resetAlways: false` leaves out `server_reset_query_always`, the setting
   * docs/several-processes.md requires in transaction mode (for the test that shows why).
   */
  options: { poolSize?: number; resetAlways?: boolean } = {},
): Promise<PgBouncer> {
  if (BINARY === undefined) {
    throw new Error(
      'pgbouncer is not installed: run .ci/services-up.sh (apt-get install pgbouncer)',
    );
  }
  const admin = new URL(adminUrl);
  const user = decodeURIComponent(admin.username);
  const password = decodeURIComponent(admin.password);
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'vc-pgbouncer-'));
  const ini = join(dir, 'pgbouncer.ini');
  const users = join(dir, 'userlist.txt');
  const quote = (text: string) => `"${text.replaceAll('"', '""')}"`;
  await writeFile(users, `${quote(user)} ${quote(password)}\n`, { mode: 0o600 });
  await writeFile(
    ini,
    [
      '[databases]',
      `* = host=${admin.hostname} port=${admin.port || 5432}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = scram-sha-256',
      `auth_file = ${users}`,
      `auth_user = ${user}`,
      'auth_query = SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = $1',
      'pool_mode = transaction',
      // Transaction mode hands a backend to another client after every transaction: reset it
      // each time, or a runnable's SET ROLE would stay on it for the next client of the login.
      'server_reset_query = DISCARD ALL',
      `server_reset_query_always = ${options.resetAlways === false ? 0 : 1}`,
      `default_pool_size = ${options.poolSize ?? 5}`,
      'max_client_conn = 1000',
      `admin_users = ${user}`,
      `logfile = ${join(dir, 'pgbouncer.log')}`,
      `pidfile = ${join(dir, 'pgbouncer.pid')}`,
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  // PgBouncer refuses to run as root: it drops to `nobody`, which must read its files.
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    await chmod(dir, 0o700);
    for (const path of [dir, ini, users]) await chown(path, 65534, 65534);
  }
  const child: ChildProcess = spawn(BINARY, [...(asRoot ? ['-u', 'nobody'] : []), ini], {
    stdio: 'ignore',
  });
  child.on('error', () => {});
  let exited = false;
  child.on('exit', () => {
    exited = true;
  });
  const close = async () => {
    if (!exited) {
      const gone = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await gone;
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await waitUntil('pgbouncer listens', () => {
      if (exited) throw new Error('pgbouncer exited at start');
      return accepts(port);
    });
  } catch (err) {
    const log = await readFile(join(dir, 'pgbouncer.log'), 'utf8').catch(() => '');
    await close();
    throw new Error(`${(err as Error).message}\n${log}`);
  }
  return {
    host: '127.0.0.1',
    port,
    async pools() {
      // The admin console speaks the simple protocol only.
      const client = new pg.Client({
        host: '127.0.0.1',
        port,
        user,
        password,
        database: 'pgbouncer',
      });
      client.on('error', () => {});
      await client.connect();
      try {
        const { rows } = await client.query({ text: 'SHOW POOLS', queryMode: 'simple' } as never);
        return rows as never;
      } finally {
        await client.end().catch(() => {});
      }
    },
    close,
  };
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.on('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.on('error', () => resolve(false));
  });
}
