import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { AgentProcess } from '../../helpers/agent_process.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  asRun,
  httpRequest,
  pollUntil,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// Agents outlive their server: an agent worker reconnects with back-off (one warning per step,
// for ever) across server restarts and deploys, `/readyz` tells whether any agent of the
// server's group is connected, a miss with none fails at once with its own code, and a server
// stopping ends its agents' long-polls instead of waiting them out.

const WS = 'demo';
const ALICE = 'alice@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');

let db: TestDatabase;
let dataDir: string;
let env: NodeJS.ProcessEnv;
let server: ServerProcess;
let url = '';
let agent: AgentProcess | undefined;

const appRun = (n: number) =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token: demoToken(SECRET_KEY, ALICE),
    body: { path: 'f/orders/list', args: { n } },
  }).then(asRun);

const readyz = async () => {
  const answer = await httpRequest(url, 'GET', '/readyz');
  return { status: answer.status, body: JSON.parse(answer.text) as Record<string, unknown> };
};

const startServer = async () => {
  server = new ServerProcess(env);
  url = (await server.ready).url;
};

/** Log lines of a process, parsed. */
const logOf = (lines: readonly string[]) =>
  lines.flatMap((line) => {
    try {
      return [JSON.parse(line) as Record<string, unknown>];
    } catch {
      return [];
    }
  });

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-agent-restarts-'));
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'agent',
    VIEWER_CACHE_AGENT_GROUP: 'default',
    // No start-up grace: a miss with no agent waits the 5 s, not the first minute.
    VIEWER_CACHE_AGENT_START_GRACE_MS: '0',
    HOST: '127.0.0.1',
    // One address across restarts, as an agent configured with it would reach it.
    PORT: String(await freePort()),
    LOG_LEVEL: 'info',
  });
  await startServer();
}, 180_000);

afterAll(async () => {
  agent?.signal('SIGKILL');
  await agent?.closed;
  await server?.kill();
  await db?.drop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe('agents that outlive their server', { timeout: 180_000 }, () => {
  it('with no agent connected: /readyz is not ready, and a miss fails at once with E_NO_WORKERS', async () => {
    const before = await readyz();
    expect(before.status).toBe(503);
    expect(before.body['checks']).toMatchObject({ postgres: 'ok', agents: 'none' });
    expect(before.body['agents']).toEqual({});
    const miss = await appRun(0);
    const code = (miss.json as { error?: { code?: string } }).error?.code;
    expect([miss.status, code]).toEqual([503, 'E_NO_WORKERS']);
  });

  it('an agent survives three server restarts, one warning per back-off step', async () => {
    const { token } = await runCliJson<{ token: string }>(env, [
      '-w',
      WS,
      'agent-token',
      'create',
      '--group',
      'default',
    ]);
    agent = new AgentProcess(
      { VIEWER_CACHE_SERVER_URL: url, VIEWER_CACHE_AGENT_TOKEN: token },
      prefix,
    );
    let agentExited = false;
    void agent.closed.then(() => (agentExited = true));

    for (let round = 1; round <= 4; round++) {
      await pollUntil(async () => (await readyz()).status === 200, 30_000);
      expect((await readyz()).body['agents']).toEqual({ [`${WS}/default`]: 1 });
      const answer = await appRun(round);
      expect([answer.status, answer.fromCache]).toEqual([200, false]);
      if (round === 4) break;
      // A restart: the server stops while the agent's long-poll is open, then starts again.
      const stopping = server;
      stopping.signal('SIGTERM');
      expect((await stopping.closed).code).toBe(0);
      // Its open long-poll was ended, not waited for until the shutdown deadline.
      expect(logOf(stopping.lines).map((l) => l['msg'])).not.toContain(
        'shutdown deadline passed: exiting without waiting further',
      );
      // The agent is still there, retrying, while nothing listens.
      await pollUntil(
        async () =>
          logOf(agent!.lines).filter(
            (l) => l['msg'] === 'agent could not reach the server: retrying',
          ).length >= round,
        30_000,
      );
      expect(agentExited).toBe(false);
      await startServer();
    }
    // The agent logs "reached again" before it runs the job, but its log reaches this process
    // through a pipe of its own, which may deliver after the server's answer does.
    const reachedAgain = () =>
      logOf(agent!.lines).filter((l) => l['msg'] === 'agent reached the server again').length;
    await pollUntil(async () => reachedAgain() >= 3, 30_000);
    const lines = logOf(agent.lines);
    // Each outage: warnings counting failures 1, 2, 3, … (one per step, never repeated), then
    // one line when it reached the server again.
    let expected = 1;
    let outages = 0;
    for (const line of lines) {
      if (line['msg'] === 'agent could not reach the server: retrying') {
        expect(line['failures']).toBe(expected);
        expect(line['level']).toBe(40);
        expected++;
      } else if (line['msg'] === 'agent reached the server again') {
        expect(line['failures']).toBe(expected - 1);
        outages++;
        expected = 1;
      }
    }
    expect(outages).toBe(3);
    expect(agentExited).toBe(false);
    // It stops on a signal, cleanly.
    agent.signal('SIGTERM');
    expect(await agent.closed).toBe(0);
  });
});
