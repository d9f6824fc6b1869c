import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentProcess } from '../../helpers/agent_process.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  type Answer,
  httpRequest,
  pollUntil,
  ROOT,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// Every failed or refused run is readable at the default level (LOG_LEVEL=info): one line at
// `error` (a failure) or `warn` (a refusal) naming the workspace, app, runnable path, outcome
// code, SQLSTATE and the job id the caller was given, with the error's text redacted (never the
// viewer, an arg or a literal of the statement), carrying the request id the caller sent. A
// statement Postgres refuses answers the same code, status and SQLSTATE in process and on an
// agent; a result that is not JSON is a coded error naming the runnable.

const FAILING = join(ROOT, 'test/fixtures/apps/failing_apps.ts');
const ALICE = 'alice@example.com';
// Nine digits: no UUID, pid or timestamp in the lines contains it by chance.
const SECRET_ARG = 738_291_645;
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');

let db: TestDatabase;
let dataDir: string;
let base: NodeJS.ProcessEnv;
const stops: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'vc-run-failures-'));
  base = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'info',
  });
  // The demo seeds the data table `main`, its roles and demo.orders; then it is stopped and the
  // failing module is served on the same database.
  const seeding = new ServerProcess({
    ...base,
    VIEWER_CACHE_DEMO: 'true',
    PORT: String(await freePort()),
  });
  await seeding.ready;
  seeding.signal('SIGTERM');
  await seeding.closed;
}, 180_000);

afterAll(async () => {
  for (const stop of stops.splice(0).reverse()) await stop().catch(() => {});
  await db?.drop();
  if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
});

type Line = Record<string, unknown>;
const parsed = (lines: readonly string[]): Line[] =>
  lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Line);

/** The answers of each mode, compared across modes at the end. */
const seen: Record<
  string,
  Record<string, { status: number; code: unknown; sqlstate: unknown }>
> = {};

describe.each(['in-process', 'agent'] as const)('a failed run, %s', (mode) => {
  let server: ServerProcess;
  let url = '';
  let token = '';

  beforeAll(async () => {
    const env = {
      ...base,
      PORT: String(await freePort()),
      ...(mode === 'agent'
        ? { VIEWER_CACHE_EXECUTION: 'agent', VIEWER_CACHE_AGENT_GROUP: 'default' }
        : {}),
    };
    server = new ServerProcess(env, ['--apps', FAILING]);
    stops.push(async () => {
      server.signal('SIGTERM');
      await server.closed;
    });
    ({ url } = await server.ready);
    ({ token } = await runCliJson<{ token: string }>(base, ['token', 'create', '--user', ALICE]));
    if (mode === 'agent') {
      const { token: agentToken } = await runCliJson<{ token: string }>(base, [
        'agent-token',
        'create',
        '--group',
        'default',
      ]);
      const agent = new AgentProcess(
        { VIEWER_CACHE_SERVER_URL: url, VIEWER_CACHE_AGENT_TOKEN: agentToken, LOG_LEVEL: 'info' },
        prefix,
        ['--apps', FAILING],
      );
      stops.push(async () => {
        agent.signal('SIGTERM');
        await agent.closed;
      });
    }
  }, 180_000);

  const run = (path: string, requestId?: string): Promise<Answer> =>
    httpRequest(url, 'POST', '/api/w/demo/apps/failing/run', {
      token,
      body: { path, args: { id: SECRET_ARG } },
      ...(requestId === undefined ? {} : { headers: { 'x-request-id': requestId } }),
    });

  /** The failure line of the request with this id, once written (lines are batched). */
  const failureLine = async (reqId: string): Promise<Line> => {
    let found: Line | undefined;
    await pollUntil(async () => {
      found = parsed(server.lines).find(
        (l) => l['reqId'] === reqId && (l['msg'] === 'run failed' || l['msg'] === 'run refused'),
      );
      return found !== undefined;
    }, 15_000);
    return found!;
  };

  const CASES = [
    { path: 'f/fail/throws', status: 500, code: 'E_EXECUTOR_FAILED', level: 50 },
    { path: 'f/fail/syntax', status: 500, code: 'E_QUERY_FAILED', sqlstate: '42601', level: 50 },
    { path: 'f/fail/denied', status: 403, code: 'E_QUERY_FAILED', sqlstate: '42501', level: 40 },
    { path: 'f/fail/bigint', status: 500, code: 'E_RESULT_NOT_JSON', level: 50 },
  ] as const;

  it.each(CASES)(
    '$path: $status $code, one line at the default level',
    async (expected) => {
      const reqId = `trace-${mode}-${expected.path.replaceAll('/', '.')}`;
      const answer = await run(expected.path, reqId);
      expect(answer.status, answer.text).toBe(expected.status);
      expect(answer.headers.get('x-request-id')).toBe(reqId);
      const body = answer.json as { jobId: string; error: { code: string; sqlstate?: string } };
      expect(body.error.code).toBe(expected.code);
      expect(body.error.sqlstate).toBe('sqlstate' in expected ? expected.sqlstate : undefined);
      expect(body.jobId).toMatch(/^[0-9a-f-]{36}$/);
      seen[mode] ??= {};
      seen[mode][expected.path] = {
        status: answer.status,
        code: body.error.code,
        sqlstate: body.error.sqlstate,
      };

      const line = await failureLine(reqId);
      expect(line).toMatchObject({
        level: expected.level,
        workspace: 'demo',
        app: 'failing',
        path: expected.path,
        jobId: body.jobId,
        code: expected.code,
        status: expected.status,
        ...('sqlstate' in expected ? { sqlstate: expected.sqlstate } : {}),
      });
      expect(typeof line['err']).toBe('string');
      // What an operator reads at the default level (printed for the record of this test run).
      if (expected.path === 'f/fail/denied') console.info(JSON.stringify(line));
      // Nothing of the viewer, the args or the statement's literals, in any line of the server.
      const all = server.lines.join('\n');
      expect(all).not.toContain(ALICE);
      expect(all).not.toContain(String(SECRET_ARG));
      expect(all).not.toContain('SECRET-LITERAL');
    },
    60_000,
  );

  it('names the runnable whose result is not JSON, in the line', async () => {
    const reqId = `bigint-named-${mode}`;
    await run('f/fail/bigint', reqId);
    expect((await failureLine(reqId))['err']).toContain('f/fail/bigint');
  }, 60_000);

  it('a malformed or over-long x-request-id is replaced, never echoed', async () => {
    for (const bad of ['has space', 'x'.repeat(129), 'quote"d']) {
      const answer = await run('f/fail/throws', bad);
      const returned = answer.headers.get('x-request-id');
      expect(returned).not.toBe(bad);
      expect(returned).toMatch(/^[0-9a-f-]{36}$/);
    }
    const ok = await httpRequest(url, 'GET', '/healthz', { headers: { 'x-request-id': 'lb-7' } });
    expect(ok.headers.get('x-request-id')).toBe('lb-7');
    await pollUntil(
      async () =>
        parsed(server.lines).some((l) => l['msg'] === 'request completed' && l['reqId'] === 'lb-7'),
      15_000,
    );
  }, 60_000);
});

describe('in process and on an agent', () => {
  it('a failed run answers the same code, status and SQLSTATE', () => {
    expect(Object.keys(seen['agent'] ?? {})).toHaveLength(4);
    expect(seen['agent']).toEqual(seen['in-process']);
  });
});
