import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { AgentProcess } from '../../helpers/agent_process.js';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  asRun,
  clearRedisPrefix,
  httpRequest,
  pollUntil,
  runCli,
  runCliJson,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// Agents fed from the BullMQ queue (issue 20): two servers in queue mode on one database and
// one Redis, no database worker at all. A miss enqueued by server A is taken by an agent
// connected to server B, verified and claimed as a database worker would, and answered as the
// viewer A recorded. An agent that takes a job and goes silent (played by the test over HTTP:
// it never beats) loses it when the lock lapses: the job runs again from the same record, or,
// lost twice, fails E_QUEUE_WORKER_LOST.

const WS = 'demo';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const PROTOCOL = { 'x-viewer-cache-agent-protocol': '1' };
const QUEUE_PREFIX = `{${prefix}q}`;
const REDIS_PREFIX = `vc-e2e:${prefix}`;

let db: TestDatabase;
let dataDir: string;
let env: NodeJS.ProcessEnv;
const servers: ServerProcess[] = [];
const urls: string[] = [];
const agents: AgentProcess[] = [];
const tokens: Record<string, string> = {};

const appRun = (url: string, viewer: string, path: string, args: Record<string, unknown>) =>
  httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
    token: demoToken(SECRET_KEY, viewer),
    body: { path, args },
  }).then(asRun);

const agentPost = async (
  url: string,
  path: string,
  agentToken: string,
  body: unknown,
  headers: Record<string, string> = {},
) => {
  const response = await fetch(new URL(path, url), {
    method: 'POST',
    headers: {
      ...PROTOCOL,
      ...headers,
      authorization: `Bearer ${agentToken}`,
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, json: text === '' ? undefined : (JSON.parse(text) as unknown) };
};

interface Taken {
  job: { id: string; args: Record<string, unknown>; perms: { endUserEmail: string | null } };
  jobToken: string;
  beatMs?: number;
}

/** Takes jobs on `url` as the test's agent until the one with `args` (others failed back). */
async function takeWith(url: string, args: Record<string, unknown>): Promise<Taken> {
  for (;;) {
    const taken = await agentPost(url, '/api/agent/jobs/take', tokens['silent']!, {
      waitMs: 20_000,
    });
    if (taken.status !== 200) continue;
    const body = taken.json as Taken;
    if (JSON.stringify(body.job.args) === JSON.stringify(args)) return body;
    await agentPost(url, `/api/agent/jobs/${body.job.id}/finish`, tokens['silent']!, {
      ok: false,
      code: 'E_EXECUTOR_FAILED',
      message: 'not this test',
    });
  }
}

/** Finishes the job the test's agent took on `url` with `value`, as that agent. */
async function finishWith(url: string, taken: Taken, value: unknown): Promise<void> {
  const finish = await agentPost(url, `/api/agent/jobs/${taken.job.id}/finish`, tokens['silent']!, {
    ok: true,
    value,
  });
  expect(finish.status).toBe(204);
}

const codeOf = (json: unknown) => (json as { error?: { code?: string } })?.error?.code;

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-queue-agents-'));
  env = serverEnv({
    DATABASE_URL: db.url,
    REDIS_URL: inject('redisUrl'),
    VIEWER_CACHE_REDIS_PREFIX: REDIS_PREFIX,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'queue',
    VIEWER_CACHE_QUEUE_PREFIX: QUEUE_PREFIX,
    // A silent agent loses its job after 2 s (the lock then lapses; checked every second).
    VIEWER_CACHE_WORKER_LOCK_MS: '2000',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'info',
  });
  // One after the other: the second finds the demo seeded.
  for (let i = 0; i < 2; i++) {
    const server = new ServerProcess({ ...env, PORT: String(await freePort()) });
    servers.push(server);
    urls.push((await server.ready).url);
  }
  for (const name of ['silent', 'worker']) {
    tokens[name] = (
      await runCliJson<{ token: string }>(env, [
        '-w',
        WS,
        'agent-token',
        'create',
        '--group',
        'default',
      ])
    ).token;
  }
}, 180_000);

afterAll(async () => {
  for (const agent of agents) agent.signal('SIGKILL');
  await Promise.all(agents.map((agent) => agent.closed));
  for (const server of servers) await server.kill();
  const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  await clearRedisPrefix(redis, REDIS_PREFIX);
  await clearRedisPrefix(redis, QUEUE_PREFIX);
  redis.disconnect();
  await db?.drop();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe('agents fed from the queue, two servers, no database worker', { timeout: 90_000 }, () => {
  it('a job lost twice (its agent silent both times) fails E_QUEUE_WORKER_LOST', async () => {
    const args = { lost: 2 };
    const pending = appRun(urls[0]!, BOB, 'f/orders/list', args);
    const first = await takeWith(urls[1]!, args);
    // The server that took it asks for beats (it renews the lock on each one).
    expect(first.beatMs).toBeGreaterThan(0);
    expect(first.job.perms.endUserEmail).toBe(BOB);
    // Silent: no beat. The job comes back (same record, same viewer), and is lost again.
    const second = await takeWith(urls[0]!, args);
    expect(second.job.id).toBe(first.job.id);
    expect(second.job.perms.endUserEmail).toBe(BOB);
    // The first taker's token died with its hold.
    const late = await agentPost(
      urls[1]!,
      `/api/agent/jobs/${first.job.id}/finish`,
      tokens['silent']!,
      {
        ok: true,
        value: ['too late'],
      },
    );
    expect(late.status).toBe(404);
    // Lost twice: the next take fails it for good (BullMQ defers that to the next taker), and
    // hands out nothing of it.
    const next = await agentPost(urls[1]!, '/api/agent/jobs/take', tokens['silent']!, {
      waitMs: 6000,
    });
    if (next.status === 200) expect((next.json as Taken).job.id).not.toBe(first.job.id);
    const answer = await pending;
    expect(codeOf(answer.json)).toBe('E_QUEUE_WORKER_LOST');
  });

  it("a finish after the job's lock went to another holder is refused, and its answer is not the run's", async () => {
    const args = { stolen: randomBytes(4).toString('hex') };
    const pending = appRun(urls[0]!, BOB, 'f/orders/list', args);
    const first = await takeWith(urls[1]!, args);
    // Behind server B's back, well within its 2 s silence bound: the job's lock names another
    // holder, as once it lapsed and another server's agent took the job (the race that made
    // the test above flaky: the lock is set at the take, the bound starts at the hand-off).
    const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
    redis.on('error', () => {});
    try {
      const locks = await redis.keys(`${QUEUE_PREFIX}:*:lock`);
      expect(locks).toHaveLength(1);
      await redis.set(locks[0]!, 'another-holder', 'PX', 1000);
    } finally {
      redis.disconnect();
    }
    const late = await agentPost(
      urls[1]!,
      `/api/agent/jobs/${first.job.id}/finish`,
      tokens['silent']!,
      { ok: true, value: ['stolen'] },
    );
    expect(late.status).toBe(404);
    // The other holder never finishes: its lock lapses, the job comes back once, and the next
    // taker's answer is the run's.
    const second = await takeWith(urls[0]!, args);
    expect(second.job.id).toBe(first.job.id);
    await finishWith(urls[0]!, second, ['second']);
    const answer = await pending;
    expect(answer.status, answer.text).toBe(200);
    expect(answer.result).toEqual(['second']);
  });

  it("an agent that beats keeps its job past the lock; its answer is the run's", async () => {
    const args = { beats: 1 };
    const pending = appRun(urls[0]!, BOB, 'f/orders/list', args);
    const taken = await takeWith(urls[1]!, args);
    // The agent's own cadence (one beat per beatMs), for twice the lock's 2 s.
    const beats = Math.ceil(4000 / taken.beatMs!);
    for (let i = 0; i < beats; i++) {
      await new Promise((resolve) => setTimeout(resolve, taken.beatMs));
      const beat = await agentPost(
        urls[1]!,
        `/api/agent/jobs/${taken.job.id}/beat`,
        tokens['silent']!,
        {},
      );
      expect(beat.status).toBe(204);
    }
    // Its token resolves the viewer server A recorded, on server B's query proxy.
    const who = await agentPost(
      urls[1]!,
      '/api/agent/query',
      tokens['silent']!,
      {
        reference: { datatable: 'main', role: '@viewer' },
        sql: 'select viewer_cache.viewer_email() as e',
      },
      { 'x-viewer-cache-job-token': taken.jobToken },
    );
    expect(who.status).toBe(200);
    expect((who.json as { rows: unknown[] }).rows).toEqual([{ e: BOB }]);
    await finishWith(urls[1]!, taken, ['kept']);
    const answer = await pending;
    expect(answer.status, answer.text).toBe(200);
    expect(answer.result).toEqual(['kept']);
  });

  it("an agent's answer is also replied straight to the server that enqueued it (direct_replies.ts)", async () => {
    const listener = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
    listener.on('error', () => {});
    try {
      const heard: string[] = [];
      listener.on('pmessage', (_pattern, _channel, message) => heard.push(message));
      await listener.psubscribe(`${QUEUE_PREFIX}:jobs:reply:*`);
      const args = { replied: randomBytes(4).toString('hex') };
      const pending = appRun(urls[0]!, BOB, 'f/orders/list', args);
      const taken = await takeWith(urls[1]!, args);
      await finishWith(urls[1]!, taken, ['replied']);
      const answer = await pending;
      expect(answer.status, answer.text).toBe(200);
      expect(answer.result).toEqual(['replied']);
      // Server B sent the reply before completing the job: published before the event that
      // answers server A at the latest, so heard by the time Redis answers a read after it.
      const reader = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
      reader.on('error', () => {});
      try {
        const [stream] = await reader.keys(`${QUEUE_PREFIX}:*:events`);
        const entries = (await reader.xrevrange(stream!, '+', '-', 'COUNT', 50)) as [
          string,
          string[],
        ][];
        const latest = entries.find(([, fields]) => fields[1] === 'completed')!;
        const returned = JSON.parse(String(latest[1][latest[1].indexOf('returnvalue') + 1]));
        expect(heard.map((m) => m.slice(m.indexOf(' ') + 1))).toContain(returned);
      } finally {
        reader.disconnect();
      }
    } finally {
      listener.disconnect();
    }
  });

  it('a large answer from an agent reaches the server that enqueued it, kept under a key of its own', async () => {
    const args = { large: randomBytes(4).toString('hex') };
    const value = Array.from({ length: 1500 }, (_, i) => ({ i, note: `row ${i} of the agent` }));
    const pending = appRun(urls[0]!, BOB, 'f/orders/list', args);
    const taken = await takeWith(urls[1]!, args);
    await finishWith(urls[1]!, taken, value);
    const answer = await pending;
    expect(answer.status, answer.text).toBe(200);
    expect(answer.result).toEqual(value);
    // By reference (answer_refs.ts): the event stream carried `@<once-id>`, not the answer.
    const redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: 1 });
    redis.on('error', () => {});
    try {
      const [stream] = await redis.keys(`${QUEUE_PREFIX}:*:events`);
      const entries = (await redis.xrevrange(stream!, '+', '-', 'COUNT', 500)) as [
        string,
        string[],
      ][];
      const returned = entries.flatMap(([, fields]) =>
        fields[1] === 'completed' ? [String(fields[fields.indexOf('returnvalue') + 1])] : [],
      );
      expect(returned.some((r) => /^"@[A-Za-z0-9_.-]{8,80}"$/.test(r))).toBe(true);
      expect(returned.every((r) => r.length < 16 * 1024)).toBe(true);
    } finally {
      redis.disconnect();
    }
  });

  it('an agent on server B answers, as the viewer, a miss enqueued by server A; and a job whose first agent went silent', async () => {
    // The silent agent takes Alice's job through A and never beats; then a real agent worker
    // starts, on B.
    const args = { once: 1 };
    const pending = appRun(urls[0]!, ALICE, 'f/orders/list', args);
    const taken = await takeWith(urls[0]!, args);
    expect(taken.job.perms.endUserEmail).toBe(ALICE);
    const agent = new AgentProcess(
      { VIEWER_CACHE_SERVER_URL: urls[1]!, VIEWER_CACHE_AGENT_TOKEN: tokens['worker']! },
      prefix,
    );
    agents.push(agent);
    const answer = await pending;
    expect(answer.status, answer.text).toBe(200);
    expect(answer.fromCache).toBe(false);
    const regions = (rows: unknown) => [
      ...new Set((rows as { region: string }[]).map((r) => r.region)),
    ];
    // Retried from the same record: Alice's rows, not the silent agent's (it sent nothing).
    expect(regions(answer.result)).toEqual(['emea']);

    // Bob's miss on A, Alice's on B: the one agent, connected to B, answers both as their viewer.
    const bob = await appRun(urls[0]!, BOB, 'f/orders/list', { two: 1 });
    const alice = await appRun(urls[1]!, ALICE, 'f/orders/list', { two: 1 });
    expect([bob.status, alice.status]).toEqual([200, 200]);
    expect(regions(bob.result)).toEqual(['amer']);
    expect(regions(alice.result)).toEqual(['emea']);
    await pollUntil(
      async () => agent.finished().filter((f) => f.code === 'ok').length >= 3,
      10_000,
    );
    // Stored as a database worker stores it: a hit on either server, no agent involved.
    const before = agent.finished().length;
    const hitA = await appRun(urls[1]!, BOB, 'f/orders/list', { two: 1 });
    const hitB = await appRun(urls[0]!, ALICE, 'f/orders/list', { two: 1 });
    expect([hitA.fromCache, hitB.fromCache]).toEqual([true, true]);
    expect(hitA.result).toEqual(bob.result);
    expect(hitB.result).toEqual(alice.result);
    expect(agent.finished().length).toBe(before);
  });

  it('a role removed applies to a run an agent answered from the queue: the old entry is never served again', async () => {
    // The entry an agent's run stored is keyed on what the run asked (learned through the
    // proxied statements, recorded against the job the server handed out): a change to that
    // authorization must reach it. Keyed on a set that missed `main`, the old rows would be
    // served from the cache for the entry's whole life.
    const carol = 'carol@example.com';
    const args = { revoked: 1 };
    const both = await appRun(urls[0]!, carol, 'f/orders/list', args);
    expect(both.status, both.text).toBe(200);
    const regions = (rows: unknown) =>
      [...new Set((rows as { region: string }[]).map((r) => r.region))].sort();
    expect(regions(both.result)).toEqual(['amer', 'emea']);
    expect((await appRun(urls[1]!, carol, 'f/orders/list', args)).fromCache).toBe(true);
    const removed = await runCli(env, ['-w', WS, 'groups', 'remove', carol, 'amer']);
    expect(removed.code, removed.stderr).toBe(0);
    // Each server hears the change within its freshness bound; until then a run may still hit.
    for (const url of urls) {
      await pollUntil(async () => {
        const answer = await appRun(url, carol, 'f/orders/list', args);
        return answer.status === 200 && regions(answer.result).join() === 'emea';
      }, 10_000);
    }
  });
});
