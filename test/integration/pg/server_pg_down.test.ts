import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
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
import { TcpProxy } from '../../helpers/tcp_proxy.js';

// With its PostgreSQL gone, a server says so: a run answers 503 with a code naming the data
// table's unavailability, its background pollers back off instead of warning many times a
// second, and once PostgreSQL is back the same run answers 200. One server process, whose
// PostgreSQL is reached through a proxy that stops it underneath (refuses connections and cuts
// the live ones, as a stopped server does) and brings it back.

const prefix = uniquePrefix();
const WS = 'demo';
const ALICE = 'alice@example.com';
let db: TestDatabase;
let proxy: TcpProxy;
let server: ServerProcess;
let dataDir: string;
let token: string;
let url: string;

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  const target = new URL(db.url);
  proxy = await TcpProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
  const viaProxy = new URL(db.url);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(proxy.port);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-pg-down-'));
  const env = serverEnv({
    DATABASE_URL: viaProxy.toString(),
    VIEWER_CACHE_SECRET_KEY: 'ab'.repeat(32),
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
    PORT: String(await freePort()),
  });
  delete env['REDIS_URL'];
  server = new ServerProcess(env);
  url = (await server.ready).url;
  ({ token } = await runCliJson<{ token: string }>({ ...env, DATABASE_URL: db.url }, [
    'token',
    'create',
    '--user',
    ALICE,
  ]));
}, 120_000);

afterAll(async () => {
  await server?.kill();
  await proxy?.stop();
  await db?.drop();
  if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
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
    await proxy.setMode('refuse');

    const down = await run();
    expect(down.status).toBe(503);
    expect(down.json).toEqual({
      error: { code: 'E_DATATABLE_UNREACHABLE', message: expect.stringContaining('"main"') },
    });
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

    await proxy.setMode('forward');
    await logLine((l) => /^revocation poll answering again; tokens/.test(String(l['msg'])), from);
    expect((await run()).status).toBe(200);
  }, 120_000);
});
