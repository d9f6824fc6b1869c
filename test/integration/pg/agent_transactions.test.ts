import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatatables, createExecutor, type Datatables } from '../../../src/index.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { DEMO_PUBLISHER } from '../../../src/server/demo/demo_users.js';
import { txNotes } from '../../fixtures/tx_runnable.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  asRun,
  httpRequest,
  ROOT,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';
import { waitUntil } from '../../helpers/wait.js';

// Issue 33, item 7, end to end: a real `--execution agent` server and a real agent worker
// process (no database credential) running a runnable that uses transactions exactly as it
// does in process (test/fixtures/tx_runnable.ts, run here in process too). Its BEGIN … COMMIT
// goes through the query proxy as one transaction: both writes or none; a failed statement
// aborts it until ROLLBACK; role changes inside are refused before Postgres. An agent
// SIGKILLed in the middle of one leaves nothing behind: the server rolls it back at its idle
// bound and the connection goes back clean. The test also plays an agent over HTTP.

const WS = 'demo';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const PROTOCOL = { 'x-viewer-cache-agent-protocol': '1' };
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const IDLE_MS = 1500;

let db: TestDatabase;
let sql: pg.Pool;
let dataDir: string;
let env: NodeJS.ProcessEnv;
let server: ServerProcess;
let url = '';
const agents: ChildProcess[] = [];
/** A query-proxy answer, as the test reads it. */
interface Answer {
  transaction?: string | null;
  error?: { code?: string };
}
const tokens: Record<string, string> = {};
let local: Datatables | undefined;

/** The fixture agent (test/fixtures/tx_agent.ts) with agent token `token`. */
function startTxAgent(token: string): { child: ChildProcess; closed: Promise<unknown> } {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', join(ROOT, 'test/fixtures/tx_agent.ts')],
    {
      cwd: ROOT,
      env: {
        PATH: process.env['PATH'],
        HOME: process.env['HOME'],
        VIEWER_CACHE_SERVER_URL: url,
        VIEWER_CACHE_AGENT_TOKEN: token,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  agents.push(child);
  return { child, closed: new Promise((resolve) => child.once('close', resolve)) };
}

/** Until `/readyz` counts `n` connected agents of the group (the fixture takes a moment to start). */
const agentsConnected = (n: number) =>
  waitUntil(
    `${n} agent(s) connected`,
    async () => {
      const ready = await httpRequest(url, 'GET', '/readyz');
      const counted = (ready.json as { agents?: Record<string, number> } | undefined)?.agents;
      return (counted?.[`${WS}/default`] ?? 0) === n;
    },
    60_000,
  );

const run = (viewer: string, args: Record<string, unknown>) =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token: demoToken(SECRET_KEY, viewer),
    body: { path: 'f/orders/list', args },
  }).then(asRun);

const notes = async (ids: number[]) =>
  (
    await sql.query<{ id: number; who: string }>(
      'select id, who from demo.tx_notes where id = any($1::int[]) order by id',
      [ids],
    )
  ).rows;
/** Sessions of the server's database that sit in a transaction. */
const inTransaction = async () =>
  Number(
    (
      await sql.query<{ n: string }>(
        "select count(*) as n from pg_stat_activity where datname = current_database() and state like 'idle in transaction%' and pid <> pg_backend_pid()",
      )
    ).rows[0]!.n,
  );

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-agent-tx-'));
  const port = await freePort();
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'agent',
    VIEWER_CACHE_AGENT_GROUP: 'default',
    VIEWER_CACHE_AGENT_START_GRACE_MS: '0',
    VIEWER_CACHE_AGENT_TX_IDLE_MS: String(IDLE_MS),
    HOST: '127.0.0.1',
    PORT: String(port),
    LOG_LEVEL: 'info',
  });
  server = new ServerProcess(env);
  url = (await server.ready).url;
  await sql.query('create table demo.tx_notes (id int primary key, who text)');
  await sql.query(
    `grant select, insert on demo.tx_notes to ${prefix}sales_emea, ${prefix}sales_amer`,
  );
  tokens['fixture'] = (
    await runCliJson<{ token: string }>(env, [
      '-w',
      WS,
      'agent-token',
      'create',
      '--group',
      'default',
    ])
  ).token;
}, 180_000);

afterAll(async () => {
  for (const child of agents) if (child.exitCode === null) child.kill('SIGKILL');
  await local?.close();
  await server?.kill();
  await sql?.end();
  await db?.drop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe('transactions of a runnable on an agent', { timeout: 120_000 }, () => {
  it('runs the same runnable as in process: both writes or none, aborted until ROLLBACK, no role change', async () => {
    const agent = startTxAgent(tokens['fixture']!);
    await agentsConnected(1);
    const cases: [Record<string, unknown>, unknown][] = [
      [
        { mode: 'commit', ids: [1, 2] },
        { inside: 2, after: 2 },
      ],
      [
        { mode: 'rollback', ids: [3, 4] },
        { inside: 2, after: 0 },
      ],
      [
        { mode: 'error', ids: [5] },
        { duplicate: '23505', next: '25P02', after: 0 },
      ],
      [
        { mode: 'with-transaction', ids: [6, 7] },
        { thrown: 'P0001', after: 1 },
      ],
      [
        { mode: 'role', ids: [8] },
        {
          refused: ['E_STATEMENT_REFUSED', 'E_STATEMENT_REFUSED', 'E_STATEMENT_REFUSED'],
          after: 1,
        },
      ],
      [{ mode: 'open', ids: [9, 10] }, { inside: 2 }],
    ];
    for (const [args, expected] of cases) {
      const answer = await run(ALICE, args);
      expect([answer.status, answer.result], JSON.stringify(args)).toEqual([200, expected]);
    }
    expect((await notes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])).map((r) => [r.id, r.who])).toEqual([
      [1, ALICE],
      [2, ALICE],
      [7, ALICE],
      [8, ALICE],
    ]);
    // The transaction left open when the job returned was rolled back, its connection freed.
    await waitUntil(
      'no session is left in a transaction',
      async () => (await inTransaction()) === 0,
    );

    // The very same function in process, on the same data table, as the same viewer (other
    // ids): the same answers. Only the refusals differ in kind — in process Postgres itself
    // runs a role change (the login can only narrow); the proxy refuses it before Postgres.
    local = await createDatatables({ connection: db.url, secretKey: SECRET_KEY });
    const executor = createExecutor({ runnables: { tx: { fn: txNotes } }, datatables: local });
    for (const [args, expected] of cases) {
      if (args['mode'] === 'role') continue;
      const ids = (args['ids'] as number[]).map((id) => id + 100);
      const job = executor.createJob({
        workspace: WS,
        path: 'tx',
        runAs: DEMO_PUBLISHER,
        args: { ...args, ids },
        origin: { kind: 'app', session: { email: ALICE } },
      });
      expect((await executor.run(job)).value, JSON.stringify(args)).toEqual(expected);
    }
    expect((await notes([101, 102, 103, 104, 105, 106, 107, 109, 110])).map((r) => r.id)).toEqual([
      101, 102, 107,
    ]);
    agent.child.kill('SIGTERM');
    await agent.closed;
  });

  it('an agent SIGKILLed mid-transaction: the server rolls it back and frees the connection', async () => {
    const before = await inTransaction();
    expect(before).toBe(0);
    const { child, closed } = startTxAgent(tokens['fixture']!);
    await agentsConnected(1);
    const pending = run(BOB, { mode: 'hang', ids: [20, 21] });
    // Its two inserts are in, uncommitted, on a connection the server holds for it.
    await waitUntil(
      'the agent is in its transaction',
      async () => (await inTransaction()) === 1,
      30_000,
    );
    child.kill('SIGKILL');
    await closed;
    // The agent's statements stopped: the idle bound rolls the transaction back.
    await waitUntil('the server rolled it back', async () => (await inTransaction()) === 0, 10_000);
    expect(await notes([20, 21])).toEqual([]);
    void pending.catch(() => {});
  });

  it("another job's token cannot use a transaction id; the id dies with its job", async () => {
    const post = async (agentToken: string, path: string, body: unknown, jobToken?: string) => {
      const response = await fetch(new URL(path, url), {
        method: 'POST',
        headers: {
          ...PROTOCOL,
          authorization: `Bearer ${agentToken}`,
          'content-type': 'application/json',
          ...(jobToken === undefined ? {} : { 'x-viewer-cache-job-token': jobToken }),
        },
        body: JSON.stringify(body),
      });
      const text = await response.text();
      return {
        status: response.status,
        json: text === '' ? null : (JSON.parse(text) as Answer),
      };
    };
    // Played by the test (no agent process runs now): a job for Alice and one for Bob.
    const pendingA = run(ALICE, { mode: 'played', ids: [30] });
    const pendingB = run(BOB, { mode: 'played', ids: [31] });
    // This server hands jobs to group `default`: take them with the fixture group's token.
    const fixtureToken = tokens['fixture']!;
    const take = async () => {
      const taken = await post(fixtureToken, '/api/agent/jobs/take', { waitMs: 20_000 });
      expect(taken.status).toBe(200);
      return taken.json as {
        job: { id: string; perms: { endUserEmail: string } };
        jobToken: string;
      };
    };
    const first = await take();
    const second = await take();
    const [a, b] = first.job.perms.endUserEmail === ALICE ? [first, second] : [second, first];
    const q = (
      jobToken: string,
      sqlText: string,
      transaction: string | null,
      params: unknown[] = [],
    ) =>
      post(
        fixtureToken,
        '/api/agent/query',
        { reference: { datatable: 'main', role: '@viewer' }, sql: sqlText, params, transaction },
        jobToken,
      );
    const opened = await q(a.jobToken, 'begin', null);
    expect(opened.status).toBe(200);
    const tx = opened.json!.transaction as string;
    expect(tx).toMatch(/^vcx_/);
    expect((await q(a.jobToken, 'insert into demo.tx_notes values (30, null)', tx)).status).toBe(
      200,
    );
    // Bob's job's token with Alice's transaction: nothing.
    const stolen = await q(b.jobToken, 'insert into demo.tx_notes values (31, null)', tx);
    expect([stolen.status, stolen.json?.error?.code]).toEqual([404, 'E_TRANSACTION_UNKNOWN']);
    const stolenCommit = await q(b.jobToken, 'commit', tx);
    expect(stolenCommit.json?.error?.code).toBe('E_TRANSACTION_UNKNOWN');
    // Alice's job finishes without committing: its token dies, the transaction is rolled back.
    expect(
      (await post(fixtureToken, `/api/agent/jobs/${a.job.id}/finish`, { ok: true, value: 'a' }))
        .status,
    ).toBe(204);
    const late = await q(a.jobToken, 'commit', tx);
    expect(late.json?.error?.code).toBe('E_JOB_TOKEN_INVALID');
    await waitUntil(
      'no session is left in a transaction',
      async () => (await inTransaction()) === 0,
    );
    expect(await notes([30, 31])).toEqual([]);
    await post(fixtureToken, `/api/agent/jobs/${b.job.id}/finish`, { ok: true, value: 'b' });
    expect((await pendingA).status).toBe(200);
    expect((await pendingB).status).toBe(200);
  });
});
