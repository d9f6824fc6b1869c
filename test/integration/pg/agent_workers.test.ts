import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { AgentProcess } from '../../helpers/agent_process.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  type Answer,
  asRun,
  httpRequest,
  pollUntil,
  runCli,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// Agent workers end to end, with real processes: a server with `--execution agent`, agent
// workers (`worker --agent --demo`) that hold no database credential, and agents played by
// the test over the HTTP API where a case needs a job held still. The viewer of every
// statement is the one the server recorded; an agent can only act for a job it holds, while
// it runs, in its own workspace.

const WS = 'demo';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const PROTOCOL = { 'x-viewer-cache-agent-protocol': '1' };

let db: TestDatabase;
let dataDir: string;
let env: NodeJS.ProcessEnv;
let server: ServerProcess;
let url = '';
const agents: AgentProcess[] = [];
const startAgent = (vars: Record<string, string | undefined>) => {
  const started = new AgentProcess(vars, prefix);
  agents.push(started);
  return started;
};

const appRun = (token: string, path: string, args: Record<string, unknown> = {}) =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token,
    body: { path, args },
  }).then(asRun);

async function agentPost(
  path: string,
  agentToken: string | null,
  body: unknown,
  headers: Record<string, string | undefined> = PROTOCOL,
): Promise<Answer> {
  const response = await fetch(new URL(path, url), {
    method: 'POST',
    headers: {
      ...(Object.fromEntries(
        Object.entries(headers).filter((e): e is [string, string] => e[1] !== undefined),
      ) as Record<string, string>),
      ...(agentToken === null ? {} : { authorization: `Bearer ${agentToken}` }),
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: response.status, headers: response.headers, text, json };
}

const query = (
  agentToken: string,
  jobToken: string,
  sql: string,
  role: string | null = '@viewer',
) =>
  agentPost(
    '/api/agent/query',
    agentToken,
    { reference: { datatable: 'main', role }, sql },
    { ...PROTOCOL, 'x-viewer-cache-job-token': jobToken },
  );
const codeOf = (answer: Answer) => (answer.json as { error?: { code?: string } })?.error?.code;
const made = async (group: string, workspace = WS) =>
  (
    await runCliJson<{ token: string }>(env, [
      '-w',
      workspace,
      'agent-token',
      'create',
      '--group',
      group,
    ])
  ).token;

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-agents-'));
  const port = await freePort();
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'agent',
    // The test's own agents take the `default` group's jobs only when asked (see below).
    VIEWER_CACHE_AGENT_GROUP: 'default',
    HOST: '127.0.0.1',
    PORT: String(port),
    LOG_LEVEL: 'info',
  });
  server = new ServerProcess(env);
  url = (await server.ready).url;
  // Every agent token the file uses, made up front (each CLI run is a process of its own).
  const groups: [string, string, string?][] = [
    ['mine', 'default'],
    ['peer', 'default'],
    ['elsewhere', 'default', 'other'],
    ['revoked', 'revoked-group'],
    ['shortLived', 'short-lived'],
    ['idle', 'idle'],
    ['listed', 'listed'],
    ['worker', 'default'],
  ];
  const made_ = await Promise.all(groups.map(([, group, ws]) => made(group, ws)));
  for (const [i, [name]] of groups.entries()) tokens[name] = made_[i]!;
}, 180_000);

const tokens: Record<string, string> = {};
const agentToken = async (name: string) => tokens[name]!;

/**
 * Takes jobs as `token` until one is for `viewer` (others — the demo's scheduled runs — are
 * failed back at once, so nothing is left held).
 */
async function takeFor(token: string, viewer: string) {
  for (;;) {
    const taken = await agentPost('/api/agent/jobs/take', token, { waitMs: 20_000 });
    if (taken.status !== 200) throw new Error(`take answered ${taken.status}`);
    const body = taken.json as {
      job: { id: string; perms: { endUserEmail: string | null } };
      jobToken: string;
    };
    if (body.job.perms.endUserEmail === viewer) return body;
    await agentPost(`/api/agent/jobs/${body.job.id}/finish`, token, {
      ok: false,
      code: 'E_EXECUTOR_FAILED',
      message: 'not this test',
    });
  }
}

afterAll(async () => {
  for (const agent of agents) agent.signal('SIGKILL');
  await Promise.all(agents.map((agent) => agent.closed));
  await server?.kill();
  await db?.drop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe('the agent protocol, played by the test', { timeout: 90_000 }, () => {
  it('an agent acts only for the job it holds, while it runs, as its recorded viewer', async () => {
    const mine = await agentToken('mine');
    const peer = await agentToken('peer');
    const elsewhere = await agentToken('elsewhere');
    const pending = appRun(demoToken(SECRET_KEY, ALICE), 'f/orders/list', { n: 1 });
    const { job, jobToken } = await takeFor(mine, ALICE);

    // Alice's rows: EMEA only, whatever the agent would like.
    const rows = await query(mine, jobToken, 'select id, region from demo.orders order by id');
    expect(rows.status).toBe(200);
    const regions = new Set(
      (rows.json as { rows: { region: string }[] }).rows.map((r) => r.region),
    );
    expect([...regions]).toEqual(['emea']);
    const who = await query(mine, jobToken, 'select viewer_cache.viewer_email() as e');
    expect((who.json as { rows: unknown[] }).rows).toEqual([{ e: ALICE }]);
    // ctx.hasRole over the proxy: the recorded viewer's roles.
    const holds = (role: string) =>
      agentPost(
        '/api/agent/holds',
        mine,
        { datatable: 'main', role },
        { ...PROTOCOL, 'x-viewer-cache-job-token': jobToken },
      );
    expect((await holds(`${prefix}sales_emea`)).json).toEqual({ holds: true });
    expect((await holds(`${prefix}sales_amer`)).json).toEqual({ holds: false });
    expect(
      codeOf(
        await agentPost(
          '/api/agent/holds',
          peer,
          { datatable: 'main', role: `${prefix}sales_emea` },
          { ...PROTOCOL, 'x-viewer-cache-job-token': jobToken },
        ),
      ),
    ).toBe('E_JOB_TOKEN_INVALID');
    // The viewer is not something the agent can say: no field for it.
    const claim = await agentPost(
      '/api/agent/query',
      mine,
      { reference: { datatable: 'main', role: '@viewer' }, sql: 'select 1', viewer: BOB },
      { ...PROTOCOL, 'x-viewer-cache-job-token': jobToken },
    );
    expect(claim.status).toBe(400);

    // Another agent of the same group, or an agent of another workspace, with the same token.
    expect(codeOf(await query(peer, jobToken, 'select 1'))).toBe('E_JOB_TOKEN_INVALID');
    expect(codeOf(await query(elsewhere, jobToken, 'select 1'))).toBe('E_JOB_TOKEN_INVALID');
    // A forged token.
    expect(codeOf(await query(mine, `vcj_${'x'.repeat(43)}`, 'select 1'))).toBe(
      'E_JOB_TOKEN_INVALID',
    );
    // Several statements, and a role change: refused before they reach Postgres.
    const several = await query(mine, jobToken, 'select 1; select 2');
    expect([several.status, codeOf(several)]).toEqual([400, 'E_STATEMENT_REFUSED']);
    expect(codeOf(await query(mine, jobToken, 'reset role'))).toBe('E_STATEMENT_REFUSED');
    // In every spelling Postgres's grammar allows (a quoted name ran, before the allowlist).
    for (const sql of [
      `SET "role" TO 'x'`,
      `RESET "role"`,
      `SET "session_authorization" TO 'postgres'`,
      "select set_config('role', 'x', false)",
      'do $$ begin reset role; end $$',
    ]) {
      const refused = await query(mine, jobToken, sql);
      expect([refused.status, codeOf(refused)], sql).toEqual([400, 'E_STATEMENT_REFUSED']);
    }
    // Only the holder can finish it; the agent's value is the answer.
    expect(
      (await agentPost(`/api/agent/jobs/${job.id}/finish`, peer, { ok: true, value: 1 })).status,
    ).toBe(404);
    const finish = await agentPost(`/api/agent/jobs/${job.id}/finish`, mine, {
      ok: true,
      value: ['from the agent'],
    });
    expect(finish.status).toBe(204);
    const answer = await pending;
    expect(answer.status).toBe(200);
    expect(answer.result).toEqual(['from the agent']);
    // The job ended: its token is dead, for its own agent too.
    const late = await query(mine, jobToken, 'select 1');
    expect([late.status, codeOf(late)]).toEqual([401, 'E_JOB_TOKEN_INVALID']);
  });

  it("an agent of another workspace never takes this workspace's jobs", async () => {
    const elsewhere = await agentToken('elsewhere');
    const mine = await agentToken('mine');
    const pending = appRun(demoToken(SECRET_KEY, BOB), 'f/orders/list', { n: 2 });
    const other = await agentPost('/api/agent/jobs/take', elsewhere, { waitMs: 300 });
    expect(other.status).toBe(204);
    const { job } = await takeFor(mine, BOB);
    // A failure travels as a code; a refusal keeps its status.
    await agentPost(`/api/agent/jobs/${job.id}/finish`, mine, {
      ok: false,
      code: 'E_NO_VIEWER',
      message: 'refused',
    });
    const answer = await pending;
    expect(answer.status).toBe(403);
    expect(codeOf(answer)).toBe('E_NO_VIEWER');
  });

  it('an old agent (no or another protocol version) is refused, never served', async () => {
    const mine = await agentToken('mine');
    for (const headers of [
      {},
      { 'x-viewer-cache-agent-protocol': '0' },
      { 'x-viewer-cache-agent-protocol': '2' },
    ]) {
      const take = await agentPost('/api/agent/jobs/take', mine, {}, headers);
      expect([take.status, codeOf(take)]).toEqual([426, 'E_AGENT_PROTOCOL']);
      const q = await agentPost(
        '/api/agent/query',
        mine,
        { reference: { datatable: 'main', role: null }, sql: 'select 1' },
        { ...headers, 'x-viewer-cache-job-token': 'vcj_x' },
      );
      expect([q.status, codeOf(q)]).toEqual([426, 'E_AGENT_PROTOCOL']);
    }
  });

  it('a finish without a valid token is refused before its body is read (agents may send 16 MiB)', async () => {
    // Headers announce 8 MiB and only 1 KiB follows: a server that read the body before checking
    // the token would wait for the rest (until its request timeout) instead of answering.
    const { port } = new URL(url);
    const socket = connect(Number(port), '127.0.0.1');
    socket.on('error', () => {});
    const head = await new Promise<string>((resolve, reject) => {
      let seen = '';
      socket.on('data', (chunk) => {
        seen += chunk.toString('latin1');
        if (seen.includes('\r\n\r\n')) resolve(seen);
      });
      socket.on('close', () => reject(new Error(`closed before an answer: ${seen}`)));
      socket.write(
        [
          'POST /api/agent/jobs/some-job/finish HTTP/1.1',
          `Host: 127.0.0.1:${port}`,
          'Content-Type: application/json',
          'Authorization: Bearer vca_not-a-token',
          'x-viewer-cache-agent-protocol: 1',
          `Content-Length: ${8 << 20}`,
          '',
          `{"ok":true,"value":"${'x'.repeat(1024)}`,
        ].join('\r\n'),
      );
    });
    socket.destroy();
    expect(head.split('\r\n')[0]).toMatch(/^HTTP\/1\.1 401 /);
  });

  it('a revoked agent token is refused by the server within a second', async () => {
    // Every token of a group made for this case only.
    const lone = await agentToken('revoked');
    expect((await agentPost('/api/agent/jobs/take', lone, {})).status).toBe(204);
    await runCliJson(env, ['agent-token', 'revoke', '--group', 'revoked-group']);
    await pollUntil(
      async () => (await agentPost('/api/agent/jobs/take', lone, {})).status === 401,
      3000,
    );
    expect(codeOf(await agentPost('/api/agent/jobs/take', null, {}))).toBe('E_UNAUTHENTICATED');
    expect(codeOf(await agentPost('/api/agent/jobs/take', 'vct_not-an-agent', {}))).toBe(
      'E_UNAUTHENTICATED',
    );
  });
});

describe('agent worker processes', { timeout: 90_000 }, () => {
  it('refuses to start with a database URL, Redis URL or secret key in its environment', async () => {
    for (const vars of [
      { DATABASE_URL: db.url },
      { REDIS_URL: 'redis://127.0.0.1:6379' },
      { VIEWER_CACHE_SECRET_KEY: SECRET_KEY },
    ]) {
      const agent = startAgent({
        VIEWER_CACHE_SERVER_URL: url,
        VIEWER_CACHE_AGENT_TOKEN: 'vca_x',
        ...vars,
      });
      expect(await agent.closed).toBe(1);
      expect(agent.stderr).toContain('E_AGENT_CREDENTIALS');
    }
  });

  it('runs the demo for each viewer: TS and SQL runnables, their rows, and hits stay on the server', async () => {
    const agent = startAgent({
      VIEWER_CACHE_SERVER_URL: url,
      VIEWER_CACHE_AGENT_TOKEN: await agentToken('worker'),
    });
    // Misses go to an agent once one is connected (before that: E_NO_WORKERS after a short wait).
    await pollUntil(
      async () => (await httpRequest(url, 'GET', '/readyz')).text.includes(`"${WS}/default":`),
      60_000,
    );
    const emea = await appRun(demoToken(SECRET_KEY, ALICE), 'f/orders/list');
    expect(emea.status).toBe(200);
    const regionsOf = (result: unknown) =>
      [...new Set((result as { region: string }[]).map((r) => r.region))].sort();
    expect(regionsOf(emea.result)).toEqual(['emea']);
    const amer = await appRun(demoToken(SECRET_KEY, BOB), 'f/orders/list_sql');
    expect(regionsOf(amer.result)).toEqual(['amer']);
    const both = await appRun(demoToken(SECRET_KEY, CAROL), 'f/orders/list');
    expect(regionsOf(both.result)).toEqual(['amer', 'emea']);
    // The TS and the SQL runnable give a viewer the same rows on an agent.
    const bothSql = await appRun(demoToken(SECRET_KEY, CAROL), 'f/orders/list_sql');
    expect(bothSql.result).toEqual(both.result);
    // A child job on the agent inherits the viewer.
    const summary = await appRun(demoToken(SECRET_KEY, ALICE), 'f/orders/summary');
    expect(summary.status).toBe(200);
    expect(Object.keys((summary.result as { totals: object }).totals)).toEqual(['emea']);
    // A public visitor has no viewer: refused, never the default role.
    const anonymous = await httpRequest(url, 'POST', `/api/w/${WS}/public/apps/orders-public/run`, {
      body: { path: 'f/orders/list' },
    });
    expect(codeOf(anonymous)).toBe('E_NO_VIEWER');
    // The agent's log lines are written asynchronously (buffered): wait until every job run so
    // far is in them, so the count below is not short of lines still in the buffer.
    const paths = () => agent.finished().map((j) => j.path);
    await pollUntil(
      async () =>
        paths().filter((p) => p === 'f/orders/list_sql').length === 2 &&
        paths().includes('f/orders/summary'),
      15_000,
    );
    // A hit is answered by the server: the agent finishes no new job for it.
    const count = agent.finished().length;
    const hit = await appRun(demoToken(SECRET_KEY, ALICE), 'f/orders/list');
    expect(hit.fromCache).toBe(true);
    expect(hit.result).toEqual(emea.result);
    expect(agent.finished().length).toBe(count);
    expect(agent.finished().map((j) => j.path)).toContain('f/orders/list_sql');
    // Its log lines name the runnable and the outcome, never a viewer or a row.
    const log = agent.lines.join('\n');
    for (const secret of [ALICE, BOB, CAROL, 'emea', 'amer']) expect(log).not.toContain(secret);
  });

  it('a revoked agent stops with a coded refusal; SIGTERM or SIGHUP stops one that is idle', async () => {
    const token = await agentToken('shortLived');
    const agent = startAgent({
      VIEWER_CACHE_SERVER_URL: url,
      VIEWER_CACHE_AGENT_TOKEN: token,
    });
    await pollUntil(
      async () => agent.lines.some((l) => l.includes('agent worker started')),
      20_000,
    );
    await runCliJson(env, ['agent-token', 'revoke', '--group', 'short-lived']);
    expect(await agent.closed).toBe(1);
    expect(agent.stderr).toContain('E_UNAUTHENTICATED');

    const idle = startAgent({
      VIEWER_CACHE_SERVER_URL: url,
      VIEWER_CACHE_AGENT_TOKEN: await agentToken('idle'),
    });
    await pollUntil(async () => idle.lines.some((l) => l.includes('agent worker started')), 20_000);
    idle.signal('SIGTERM');
    expect(await idle.closed).toBe(0);

    // SIGHUP (its terminal closed) too, where Node's default would kill it outright.
    const hungUp = startAgent({
      VIEWER_CACHE_SERVER_URL: url,
      VIEWER_CACHE_AGENT_TOKEN: await agentToken('idle'),
    });
    await pollUntil(
      async () => hungUp.lines.some((l) => l.includes('agent worker started')),
      20_000,
    );
    hungUp.signal('SIGHUP');
    expect(await hungUp.closed).toBe(0);
    expect(hungUp.lines.some((l) => l.includes('agent worker stopping'))).toBe(true);
  });
});

describe('the CLI', { timeout: 60_000 }, () => {
  it('agent-token list shows ids and groups, never a token', async () => {
    const token = await agentToken('listed');
    const listed = await runCli(env, ['agent-token', 'list']);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain('listed');
    expect(listed.stdout).not.toContain(token);
    expect(listed.stdout).not.toContain(token.slice(4));
  });
});
