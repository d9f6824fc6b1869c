import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { CLINIC_USERS } from '../../../src/server/demo/demo_clinics.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import {
  expectNoSecrets as expectNoSecretsIn,
  expectOk,
  expectRefused as expectRefusedWith,
  type Secrets,
} from '../../helpers/server_expect.js';
import {
  type Answer,
  asRun,
  type CliResult,
  httpRequest,
  isRecord,
  parseJson,
  pollUntil,
  runCli,
  sample,
} from '../../helpers/server_process.js';

// The reference server end to end, started the way a user starts it: `viewer-cache --json serve`
// as a child process on a free port, on this file's own database and the suite's Redis, with
// tokens made by the CLI. One server serves every check; the tests run in order and share it.

const WS = 'demo';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const CAROL = 'carol@example.com';
const DAVE = 'dave@example.com';

const prefix = uniquePrefix();
const EMEA_ROLE = `${prefix}sales_emea`;
const AMER_ROLE = `${prefix}sales_amer`;
// Both pg projects (and other suites) share one Redis: this server's keys live under its own prefix.
const REDIS_PREFIX = `vc-e2e:${prefix}`;
const SECRET_KEY = randomBytes(32).toString('hex');
/** The demo's derived tokens: seeded, but never printed when stdout is not a terminal. */
const DEMO_EMAILS = [
  ALICE,
  BOB,
  CAROL,
  DAVE,
  'publisher@example.com',
  // The clinics demo app's users (server_acceptance_table.test.ts).
  ...Object.keys(CLINIC_USERS),
];
const DEMO_TOKENS = DEMO_EMAILS.map((email) => demoToken(SECRET_KEY, email));

interface Order {
  id: number;
  region: string;
  customer: string;
  amount: number;
}
const ORDERS: Order[] = [
  { id: 1, region: 'emea', customer: 'Acme GmbH', amount: 1200 },
  { id: 2, region: 'amer', customer: 'Globex Inc', amount: 800 },
  { id: 3, region: 'emea', customer: 'Initech SA', amount: 430 },
  { id: 4, region: 'amer', customer: 'Umbrella LLC', amount: 2100 },
];
const rowsOf = (...regions: string[]) => ORDERS.filter((row) => regions.includes(row.region));
const EMEA_ROWS = rowsOf('emea');
const AMER_ROWS = rowsOf('amer');
const BOTH_ROWS = rowsOf('emea', 'amer');

const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: REDIS_PREFIX,
});
const { request, cli, cliJson } = e2e;
/** Tokens made with `token create`, by email. */
const tokens: Record<string, string> = {};
/** Alice's token in workspace `other`. */
let otherWorkspaceToken: string;

const secrets: Secrets = {
  secretKey: SECRET_KEY,
  tokens: () =>
    [...Object.values(tokens), ...DEMO_TOKENS, otherWorkspaceToken].filter(
      (token): token is string => typeof token === 'string' && token.length > 0,
    ),
};
const expectNoSecrets = (text: string, what?: string) => expectNoSecretsIn(secrets, text, what);
const expectRefused = (answer: Answer, status: number, code: string) =>
  expectRefusedWith(secrets, answer, status, code);

/** An app request (`orders-dashboard`) by the token's user. */
async function appRun(token: string, path: string, args?: Record<string, unknown>) {
  return asRun(
    await request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
      token,
      body: args === undefined ? { path } : { path, args },
    }),
  );
}

async function scrapeMetrics(): Promise<string> {
  const answer = await request('GET', '/metrics');
  expect(answer.status).toBe(200);
  return answer.text;
}

beforeAll(async () => {
  // The catalog is migrated in the template, so the CLI and the server can start together.
  await e2e.start();
  const made = await Promise.all([
    ...[ALICE, BOB, CAROL, DAVE].map((email) =>
      cliJson<{ token: string; workspace: string }>(['token', 'create', '--user', email]),
    ),
    cliJson<{ token: string; workspace: string }>([
      '-w',
      'other',
      'token',
      'create',
      '--user',
      ALICE,
    ]),
  ]);
  [ALICE, BOB, CAROL, DAVE].forEach((email, i) => {
    tokens[email] = made[i]!.token;
    expect(made[i]!.workspace).toBe(WS);
  });
  otherWorkspaceToken = made[4]!.token;
  expect(made[4]!.workspace).toBe('other');

  const ready = await e2e.ready();
  expect(ready.url).toBe(`http://127.0.0.1:${e2e.port}`);
  // stdout is a pipe, not a terminal: the ready line names no token.
  expect(ready).toEqual({ url: ready.url });
  // The CLI's tokens are new ones, not the demo's derived tokens.
  for (const email of [ALICE, BOB, CAROL, DAVE]) {
    expect(tokens[email]).toMatch(/^vct_/);
    expect(DEMO_TOKENS).not.toContain(tokens[email]);
  }
});

afterAll(() => e2e.stop());

// ---------------------------------------------------------------------------------------------

describe('each viewer gets their own rows and their own cache entries', () => {
  it('alice sees only EMEA rows; her second call is a hit with the same bytes', async () => {
    const miss = await appRun(tokens[ALICE]!, 'f/orders/list');
    expectOk(miss, false);
    expect(miss.result).toEqual(EMEA_ROWS);

    const hit = await appRun(tokens[ALICE]!, 'f/orders/list');
    expectOk(hit, true);
    expect(hit.resultBytes).toBe(miss.resultBytes);
    expect(hit.result).toEqual(EMEA_ROWS);
    // A new job each time, even when the answer comes from the cache.
    expect((hit.json as { jobId: string }).jobId).not.toBe((miss.json as { jobId: string }).jobId);
  });

  it("bob's first call after alice's hit is a miss and shows only AMER rows", async () => {
    const first = await appRun(tokens[BOB]!, 'f/orders/list');
    expectOk(first, false);
    expect(first.result).toEqual(AMER_ROWS);
    const again = await appRun(tokens[BOB]!, 'f/orders/list');
    expectOk(again, true);
    expect(again.result).toEqual(AMER_ROWS);
  });

  it('carol sees both regions, through the TS and the SQL runnable', async () => {
    const first = await appRun(tokens[CAROL]!, 'f/orders/list');
    expectOk(first, false);
    expect(first.result).toEqual(BOTH_ROWS);
    expectOk(await appRun(tokens[CAROL]!, 'f/orders/list'), true);

    const sql = await appRun(tokens[CAROL]!, 'f/orders/list_sql');
    expectOk(sql, false);
    expect(sql.result).toEqual(BOTH_ROWS);
    // She connects through a set login holding both roles.
    const whoami = await appRun(tokens[CAROL]!, 'f/orders/whoami');
    expect(whoami.status, whoami.text).toBe(200);
    expect(whoami.result).toEqual({ login: expect.stringMatching(/^wm_set_[0-9a-f]{32}$/) });
  });

  it('dave (no roles) is refused with E_NO_ROLES, and the refusal is not cached', async () => {
    for (let i = 0; i < 2; i++) {
      expectRefused(await appRun(tokens[DAVE]!, 'f/orders/list'), 403, 'E_NO_ROLES');
    }
  });

  it('concurrent identical runs by three viewers each get their own rows', async () => {
    const args = { region: 'emea' };
    const [alice, bob, carol] = await Promise.all(
      [ALICE, BOB, CAROL].map((email) => appRun(tokens[email]!, 'f/orders/by_region', args)),
    );
    for (const answer of [alice!, bob!, carol!]) expectOk(answer, false);
    expect(alice!.result).toEqual(EMEA_ROWS);
    expect(bob!.result).toEqual([]);
    expect(carol!.result).toEqual(EMEA_ROWS);
  });

  it('a direct run is as the caller; a preview is never cached', async () => {
    const run = asRun(
      await request('POST', `/api/w/${WS}/jobs/run`, {
        token: tokens[BOB]!,
        body: { path: 'f/orders/list' },
      }),
    );
    expect(run.status, run.text).toBe(200);
    expect(run.result).toEqual(AMER_ROWS);
    for (let i = 0; i < 2; i++) {
      const preview = asRun(
        await request('POST', `/api/w/${WS}/jobs/preview`, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list' },
        }),
      );
      expectOk(preview, false);
      expect(preview.result).toEqual(EMEA_ROWS);
    }
  });

  it('keeps the cache entries under its own Redis prefix, without identities or tokens', async () => {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, found] = await e2e.redis.scan(cursor, 'MATCH', `${REDIS_PREFIX}*`, 'COUNT', 500);
      keys.push(...found);
      cursor = next;
    } while (cursor !== '0');
    // Beside the entries: the invalidation epochs (workspace and runnable path, no identity).
    const entries = keys.filter((key) => key !== `${REDIS_PREFIX}epochs`);
    expect(entries.length).toBeGreaterThanOrEqual(3);
    for (const key of entries) {
      expect(key).toMatch(new RegExp(`^${REDIS_PREFIX}${WS}/cache/[0-9a-f]{64}$`));
      const value = await e2e.redis.getBuffer(key);
      expectNoSecrets(value?.toString('latin1') ?? '', `the entry ${key}`);
    }
  });
});

describe('runs with no viewer are refused a viewer connection', () => {
  it('the public app route (anonymous visitor): 403 E_NO_VIEWER', async () => {
    const answer = await request('POST', `/api/w/${WS}/public/apps/orders-public/run`, {
      body: { path: 'f/orders/list' },
    });
    expectRefused(answer, 403, 'E_NO_VIEWER');
    // A signed-in user's cached rows are not an anonymous visitor's.
    expectRefused(
      await request('POST', `/api/w/${WS}/public/apps/orders-public/run`, {
        body: { path: 'f/orders/list' },
      }),
      403,
      'E_NO_VIEWER',
    );
  });

  it("a child job's refusal keeps its code: the public app's remote child is 403 E_NO_VIEWER", async () => {
    // The parent has no viewer, so its child (started over HTTP with the job token) has none
    // either and is refused; the parent's caller gets that refusal, not a runnable failure.
    const answer = await request('POST', `/api/w/${WS}/public/apps/orders-public/run`, {
      body: { path: 'f/orders/remote_child' },
    });
    expectRefused(answer, 403, 'E_NO_VIEWER');
  });

  it('the webhook, even with a signed-in token: 403 E_NO_VIEWER', async () => {
    const answer = await request('POST', `/api/w/${WS}/hooks/orders-refresh`, {
      token: tokens[ALICE]!,
      body: { any: 'payload' },
    });
    expectRefused(answer, 403, 'E_NO_VIEWER');
  });

  it('the scheduled run: its last outcome is E_NO_VIEWER', async () => {
    const answer = await request('GET', `/api/w/${WS}/schedules`, { token: tokens[ALICE]! });
    expect(answer.status).toBe(200);
    expect(answer.json).toEqual({
      schedules: [
        {
          name: 'orders-digest',
          path: 'f/orders/list',
          runs: 1,
          lastRunAt: expect.any(String),
          lastOutcome: 'E_NO_VIEWER',
        },
        // The clinics app's schedule (server_acceptance_table.test.ts): identity reads refused.
        {
          name: 'clinics-digest',
          path: 'f/clinics/digest',
          runs: 1,
          lastRunAt: expect.any(String),
          lastOutcome: 'E_NO_VIEWER',
        },
        // …and its schedule that runs once per provider, each delivered to their outbox.
        {
          name: 'clinics-per-provider',
          path: 'f/clinics/patients',
          runs: 1,
          lastRunAt: expect.any(String),
          lastOutcome: 'ok',
          lastBatch: expect.objectContaining({ recipients: 5, delivered: 5 }),
        },
      ],
    });
  });
});

describe("a child run keeps the parent's viewer", () => {
  const summaryOf = (rows: Order[]) => {
    const totals: Record<string, number> = {};
    for (const row of rows) totals[row.region] = (totals[row.region] ?? 0) + row.amount;
    return { orders: rows.length, totals };
  };

  it('in process (f/orders/summary)', async () => {
    const carol = await appRun(tokens[CAROL]!, 'f/orders/summary');
    expectOk(carol, false);
    expect(carol.result).toEqual(summaryOf(BOTH_ROWS));
    const alice = await appRun(tokens[ALICE]!, 'f/orders/summary');
    expectOk(alice, false);
    expect(alice.result).toEqual(summaryOf(EMEA_ROWS));
  });

  it("over HTTP with the parent's job token (f/orders/remote_child)", async () => {
    for (const [email, rows] of [
      [CAROL, BOTH_ROWS],
      [ALICE, EMEA_ROWS],
      [BOB, AMER_ROWS],
    ] as const) {
      const answer = await appRun(tokens[email]!, 'f/orders/remote_child');
      expect(answer.status, answer.text).toBe(200);
      expect(answer.result).toEqual(rows);
    }
  });

  it('the job-token route refuses a made-up, a missing or a personal token (401)', async () => {
    const child = (token?: string) =>
      request('POST', `/api/w/${WS}/jobs/run_child`, {
        ...(token === undefined ? {} : { token }),
        body: { path: 'f/orders/list' },
      });
    expectRefused(
      await child(`vcj_${randomBytes(32).toString('base64url')}`),
      401,
      'E_UNAUTHENTICATED',
    );
    expectRefused(await child(), 401, 'E_UNAUTHENTICATED');
    expectRefused(await child(tokens[CAROL]!), 401, 'E_UNAUTHENTICATED');
  });
});

describe('the CLI', () => {
  // Independent commands: run them side by side (each is a cold `node` start).
  let help: CliResult;
  let unknown: CliResult;
  let disableJson: CliResult;
  let disableText: CliResult;
  let logins: CliResult;
  let stats: CliResult;
  beforeAll(async () => {
    [help, unknown, disableJson, disableText, logins, stats] = await Promise.all([
      cli(['--help']),
      cli(['no-such-command']),
      cli(['--json', 'roles', 'disable', 'nosuch']),
      cli(['roles', 'disable', 'nosuch']),
      cli(['--json', 'logins', 'list']),
      cli(['--json', 'cache', 'stats', '--url', e2e.url]),
    ]);
  });

  it('--help exits 0; an unknown command exits 2', () => {
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: viewer-cache');
    expect(help.stdout).toContain('token');
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain("unknown command 'no-such-command'");
  });

  it('roles disable of an unknown role exits 1 with E_UNKNOWN_ROLE', () => {
    expect(disableJson.code).toBe(1);
    expect(JSON.parse(disableJson.stdout)).toEqual({
      error: { code: 'E_UNKNOWN_ROLE', message: expect.any(String) },
    });
    expect(disableText.code).toBe(1);
    expect(disableText.stderr).toContain('E_UNKNOWN_ROLE');
  });

  it("--json logins list shows carol's set login holding both roles", () => {
    expect(logins.code, logins.stderr).toBe(0);
    const list = JSON.parse(logins.stdout) as {
      login: string;
      roles: string[];
      hasRow: boolean;
      canLogin: boolean;
    }[];
    expect(Array.isArray(list)).toBe(true);
    // Set logins are cluster-wide: keep the ones holding this server's orders roles (the
    // clinics demo has one of its own: Dana's, prepared ahead).
    const ours = list.filter((row) =>
      row.roles.some((role) => role === EMEA_ROLE || role === AMER_ROLE),
    );
    expect(ours).toEqual([
      {
        login: expect.stringMatching(/^wm_set_[0-9a-f]{32}$/),
        roles: expect.arrayContaining([EMEA_ROLE, AMER_ROLE]),
        hasRow: true,
        // Not asserted: `logins gc` of any other catalog on the same cluster (another test file)
        // retires this catalog's set logins too, leaving the row on a NOLOGIN login.
        canLogin: expect.any(Boolean),
      },
    ]);
    expect(ours[0]!.roles).toHaveLength(2);
  });

  it('cache stats --url reads the running server', async () => {
    expect(stats.code, stats.stderr).toBe(0);
    const counters = JSON.parse(stats.stdout) as Record<string, unknown>;
    // Nothing ran since: the server's own answer is the same.
    expect(counters).toEqual((await request('GET', '/api/cache/stats')).json);
    expect(counters).toMatchObject({
      hits: expect.any(Number),
      misses: expect.any(Number),
      coalesced: expect.any(Number),
      bypasses: expect.any(Number),
      storeErrors: 0,
      catalogListener: true,
    });
    expect(counters['hits']).toBeGreaterThanOrEqual(4);
    expect(counters['misses']).toBeGreaterThanOrEqual(4);
  });
});

describe('cache invalidate (two tiers: memory in front of the shared Redis)', () => {
  it('the CLI, another process, invalidates a runnable in the running server: its next run misses', async () => {
    // (f/orders/list stays cached: later tests count on it.) Entries live 60 s (the demo's
    // cacheTtlS): on a loaded machine the first test's may be gone by now, so each is run first.
    await appRun(tokens[ALICE]!, 'f/orders/list_sql');
    expectOk(await appRun(tokens[ALICE]!, 'f/orders/list_sql'), true);
    await appRun(tokens[ALICE]!, 'f/orders/list');
    expectOk(await appRun(tokens[ALICE]!, 'f/orders/list'), true);
    const done = await cliJson<{ invalidated: unknown }>([
      '-w',
      WS,
      'cache',
      'invalidate',
      '--path',
      'f/orders/list_sql',
    ]);
    expect(done.invalidated).toEqual({ workspace: WS, path: 'f/orders/list_sql' });
    // The server hears it on its bus (sub-millisecond here); until then, hits of the old epoch.
    await pollUntil(
      async () => (await appRun(tokens[ALICE]!, 'f/orders/list_sql')).fromCache === false,
      2000,
    );
    const again = await appRun(tokens[ALICE]!, 'f/orders/list_sql');
    expectOk(again, true);
    expect(again.result).toEqual(EMEA_ROWS);
    // Another runnable of the workspace was not touched.
    expectOk(await appRun(tokens[ALICE]!, 'f/orders/list'), true);
  });

  it('refuses a workspace that is not an id, and a run without REDIS_URL', async () => {
    const bad = await cli(['-w', '../x', 'cache', 'invalidate']);
    expect(bad.code).toBe(2);
    const noRedis = await runCli({ ...e2e.env, REDIS_URL: '' }, ['-w', WS, 'cache', 'invalidate']);
    expect(noRedis.code).toBe(1);
    expect(noRedis.stderr).toContain('E_INVALIDATION_UNSUPPORTED');
  });
});

describe('tokens: checked input, listed, revoked everywhere within a second', () => {
  it('token create refuses an empty user and a workspace that is not an id (exit 2)', async () => {
    const [empty, notEmail, traversal] = await Promise.all([
      cli(['token', 'create', '--user', '']),
      cli(['token', 'create', '--user', 'alice']),
      cli(['-w', '../../x', 'token', 'create', '--user', ALICE]),
    ]);
    for (const result of [empty, notEmail, traversal]) {
      expect(result.code, result.stderr).toBe(2);
      expect(result.stdout).not.toMatch(/vct_/);
    }
    expect(empty.stderr).toContain('email address');
    expect(traversal.stderr).toContain('workspace');
  });

  it('token list shows ids, never tokens; token revoke reaches the running server within 1 s', async () => {
    const made = await cliJson<{ token: string }>([
      'token',
      'create',
      '--user',
      BOB,
      '--label',
      'to-revoke',
    ]);
    tokens['revoked'] = made.token;
    const run = () => request('GET', `/api/w/${WS}/schedules`, { token: made.token });
    // Used once, so the server has it in its token cache.
    expect((await run()).status).toBe(200);

    const listed = await cli(['--json', 'token', 'list']);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).not.toMatch(/vct_/);
    const rows = JSON.parse(listed.stdout) as { id: string; email: string; label: string | null }[];
    const mine = rows.filter((row) => row.label === 'to-revoke');
    expect(mine).toEqual([
      {
        id: expect.stringMatching(/^[0-9a-f]{12}$/),
        email: BOB,
        label: 'to-revoke',
        createdAt: expect.any(String),
        roleScope: null,
        roles: null,
      },
    ]);
    // The other workspace's token is not listed here.
    expect(rows.map((row) => row.email).sort()).toEqual(
      [ALICE, BOB, BOB, CAROL, DAVE, ...DEMO_EMAILS].sort(),
    );

    const revoked = await cli(['--json', 'token', 'revoke', mine[0]!.id]);
    expect(revoked.code, revoked.stderr).toBe(0);
    expect(JSON.parse(revoked.stdout)).toEqual({ revoked: 1 });
    const took = await pollUntil(async () => (await run()).status === 401, 1000);
    expect(took).toBeLessThanOrEqual(1000);
    expectRefused(await run(), 401, 'E_UNAUTHENTICATED');
    // Everyone else's tokens still work.
    expect((await request('GET', `/api/w/${WS}/schedules`, { token: tokens[BOB]! })).status).toBe(
      200,
    );

    const again = await cli(['--json', 'token', 'revoke', mine[0]!.id]);
    expect(again.code).toBe(1);
    expect(JSON.parse(again.stdout)).toEqual({
      error: { code: 'E_UNKNOWN_TOKEN', message: expect.any(String) },
    });
  });
});

describe('a role change applies on the very next run', () => {
  it('removing carol from group amer with the CLI changes her next response', async () => {
    // Her entry, fresh (entries live 60 s; an earlier test's may have expired on a slow machine).
    await appRun(tokens[CAROL]!, 'f/orders/list');
    const before = await appRun(tokens[CAROL]!, 'f/orders/list');
    expectOk(before, true);
    expect(before.result).toEqual(BOTH_ROWS);

    const removed = await cli(['groups', 'remove', CAROL, 'amer']);
    expect(removed.code, removed.stderr).toBe(0);

    const after = await appRun(tokens[CAROL]!, 'f/orders/list');
    expectOk(after, false);
    expect(after.result).toEqual(EMEA_ROWS);
    const again = await appRun(tokens[CAROL]!, 'f/orders/list');
    expectOk(again, true);
    expect(again.result).toEqual(EMEA_ROWS);
    // One role left: she connects with that role's own login now.
    const whoami = await appRun(tokens[CAROL]!, 'f/orders/whoami');
    expect(whoami.result).toEqual({ login: EMEA_ROLE });
    // The in-process child follows too (its own cache entry was computed under two roles).
    const summary = await appRun(tokens[CAROL]!, 'f/orders/summary');
    expect(summary.result).toEqual({ orders: 2, totals: { emea: 1630 } });
  });

  it("alice, now holding exactly carol's roles, still does not get carol's entry", async () => {
    // Same authorization, same runner, same args: only the viewer in the key tells them apart.
    const args = { region: `emea-${prefix}` };
    expectOk(await appRun(tokens[CAROL]!, 'f/orders/by_region', args), false);
    expectOk(await appRun(tokens[CAROL]!, 'f/orders/by_region', args), true);
    expectOk(await appRun(tokens[ALICE]!, 'f/orders/by_region', args), false);
    expectOk(await appRun(tokens[ALICE]!, 'f/orders/by_region', args), true);
  });
});

describe('bad requests get a clean 4xx and the server keeps serving', () => {
  const run = `/api/w/${WS}/apps/orders-dashboard/run`;
  // Alice's entry, fresh: each case below expects the next ordinary request to be a hit, and an
  // entry lives 60 s (the demo's cacheTtlS), which a loaded machine can outlast.
  beforeAll(async () => {
    await appRun(tokens[ALICE]!, 'f/orders/list');
  });
  const cases: {
    name: string;
    send: () => Promise<Answer>;
    status: number;
    code: string;
  }[] = [
    {
      name: 'malformed JSON',
      send: () => request('POST', run, { token: tokens[ALICE]!, raw: '{"path":"f/orders/list"' }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'an empty JSON body',
      send: () => request('POST', run, { token: tokens[ALICE]!, raw: '' }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a JSON body that is not an object',
      send: () => request('POST', run, { token: tokens[ALICE]!, raw: '["f/orders/list"]' }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a missing path',
      send: () => request('POST', run, { token: tokens[ALICE]!, body: { args: {} } }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'an extra body field',
      send: () =>
        request('POST', run, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list', viewer: CAROL },
        }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'args that are not an object',
      send: () =>
        request('POST', run, { token: tokens[ALICE]!, body: { path: 'f/orders/list', args: [] } }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a path that is an array (no coercion)',
      send: () =>
        request('POST', run, { token: tokens[ALICE]!, body: { path: ['f/orders/list'] } }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a path that is a number (no coercion)',
      send: () => request('POST', run, { token: tokens[ALICE]!, body: { path: 1 } }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a NUL byte in args (a Postgres data exception)',
      send: () =>
        request('POST', run, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/by_region', args: { region: 'em\u0000ea' } },
        }),
      status: 400,
      code: 'E_INVALID_DATA',
    },
    {
      name: 'a workspace that is not an id, on the public route',
      send: () =>
        request('POST', `/api/w/x%2F..%2F..%2Fhealthz%3F/public/apps/orders-public/run`, {
          body: { path: 'f/orders/remote_child' },
        }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a workspace that is not an id, on the job-token route',
      send: () =>
        request('POST', `/api/w/de%20mo/jobs/run_child`, { body: { path: 'f/orders/list' } }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'an app name that is not a name',
      send: () =>
        request('POST', `/api/w/${WS}/apps/Orders%0ADashboard/run`, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list' },
        }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a webhook name that is not a name',
      send: () =>
        request('POST', `/api/w/${WS}/hooks/..%2Forders-refresh`, {
          token: tokens[ALICE]!,
          body: {},
        }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a webhook payload that is not an object',
      send: () =>
        request('POST', `/api/w/${WS}/hooks/orders-refresh`, { token: tokens[ALICE]!, raw: '"x"' }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a schedules request for a workspace that is not an id',
      send: () => request('GET', `/api/w/de%3Fmo/schedules`, { token: tokens[ALICE]! }),
      status: 400,
      code: 'E_BAD_REQUEST',
    },
    {
      name: 'a path segment over 128 characters',
      send: () =>
        request('POST', `/api/w/${'w'.repeat(200)}/jobs/run`, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list' },
        }),
      status: 414,
      code: 'E_URI_TOO_LONG',
    },
    {
      name: 'a URL over 16 KiB',
      send: () => request('GET', `/healthz?q=${'u'.repeat(20_000)}`),
      status: 431,
      code: 'E_HEADERS_TOO_LARGE',
    },
    {
      name: 'an unknown runnable in an app',
      send: () => request('POST', run, { token: tokens[ALICE]!, body: { path: 'f/nope' } }),
      status: 404,
      code: 'E_UNKNOWN_RUNNABLE',
    },
    {
      name: 'an unknown runnable in a direct run',
      send: () =>
        request('POST', `/api/w/${WS}/jobs/run`, {
          token: tokens[ALICE]!,
          body: { path: 'f/nope' },
        }),
      status: 404,
      code: 'E_UNKNOWN_RUNNABLE',
    },
    {
      name: 'an unknown app',
      send: () =>
        request('POST', `/api/w/${WS}/apps/nope/run`, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list' },
        }),
      status: 404,
      code: 'E_UNKNOWN_APP',
    },
    {
      name: 'a private app on the public route',
      send: () =>
        request('POST', `/api/w/${WS}/public/apps/orders-dashboard/run`, {
          body: { path: 'f/orders/list' },
        }),
      status: 404,
      code: 'E_UNKNOWN_APP',
    },
    {
      name: 'an unknown webhook',
      send: () => request('POST', `/api/w/${WS}/hooks/nope`, { token: tokens[ALICE]!, body: {} }),
      status: 404,
      code: 'E_UNKNOWN_HOOK',
    },
    {
      name: 'an unknown route',
      send: () => request('GET', '/api/nope'),
      status: 404,
      code: 'E_NOT_FOUND',
    },
    {
      name: 'no token',
      send: () => request('POST', run, { body: { path: 'f/orders/list' } }),
      status: 401,
      code: 'E_UNAUTHENTICATED',
    },
    {
      name: 'a bad token',
      send: () =>
        request('POST', run, {
          token: `vct_${randomBytes(32).toString('base64url')}`,
          body: { path: 'f/orders/list' },
        }),
      status: 401,
      code: 'E_UNAUTHENTICATED',
    },
    {
      name: "a job token where a person's token is expected",
      send: () =>
        request('POST', run, {
          token: `vcj_${randomBytes(32).toString('base64url')}`,
          body: { path: 'f/orders/list' },
        }),
      status: 401,
      code: 'E_UNAUTHENTICATED',
    },
    {
      name: 'a token of another workspace',
      send: () =>
        request('POST', run, { token: otherWorkspaceToken, body: { path: 'f/orders/list' } }),
      status: 403,
      code: 'E_FORBIDDEN',
    },
    {
      name: "a token used on another workspace's route",
      send: () =>
        request('POST', '/api/w/other/apps/orders-dashboard/run', {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/list' },
        }),
      status: 403,
      code: 'E_FORBIDDEN',
    },
    {
      name: 'args over 64 KiB',
      send: () =>
        request('POST', run, {
          token: tokens[ALICE]!,
          body: { path: 'f/orders/by_region', args: { region: 'x'.repeat(65 * 1024) } },
        }),
      status: 413,
      code: 'E_PAYLOAD_TOO_LARGE',
    },
    {
      name: 'a text/plain body',
      send: () =>
        request('POST', run, {
          token: tokens[ALICE]!,
          raw: JSON.stringify({ path: 'f/orders/list' }),
          contentType: 'text/plain',
        }),
      status: 415,
      code: 'E_UNSUPPORTED_MEDIA_TYPE',
    },
    {
      name: 'an XML body',
      send: () =>
        request('POST', run, {
          token: tokens[ALICE]!,
          raw: '<run path="f/orders/list"/>',
          contentType: 'application/xml',
        }),
      status: 415,
      code: 'E_UNSUPPORTED_MEDIA_TYPE',
    },
  ];

  it.each(cases)('$name → $status $code', async ({ send, status, code }) => {
    const answer = await send();
    expectRefused(answer, status, code);
    // Nothing the client sent comes back (an over-long URL is not echoed).
    expect(answer.text).not.toMatch(/www|uuu|\.\.|healthz/);
    // And the next ordinary request is served (from the cache: alice ran it before).
    const next = await appRun(tokens[ALICE]!, 'f/orders/list');
    expectOk(next, true);
    expect(next.result).toEqual(EMEA_ROWS);
  });
});

describe('metrics and health', () => {
  const COUNTERS = [
    'viewer_cache_hits_total',
    'viewer_cache_misses_total',
    'viewer_cache_coalesced_total',
    'viewer_cache_store_errors_total',
    'viewer_cache_bypasses_total',
  ];

  it('/metrics exposes the counters and histograms, and hits and misses move as expected', async () => {
    const before = await scrapeMetrics();
    for (const name of COUNTERS) expect(sample(before, name), name).toBeGreaterThanOrEqual(0);
    expect(sample(before, 'viewer_cache_store_errors_total')).toBe(0);
    // carol's set login was made by this server or, prepared ahead, by whichever process saw
    // the membership first: the counter exists either way.
    expect(before).toContain('# TYPE viewer_cache_set_logins_total counter');
    // Connections are counted by the process that leases them: with the queue, the worker
    // (whose /metrics this file's worker serves on its port), not the server.
    const leasing = e2e.queued
      ? (await httpRequest((await e2e.workers[0]!.ready).url, 'GET', '/metrics')).text
      : before;
    for (const name of [
      'viewer_cache_datatable_resolve_seconds',
      'viewer_cache_datatable_connect_seconds',
    ]) {
      expect(before).toContain(`# TYPE ${name} histogram`);
      expect(sample(leasing, `${name}_count`, 'access="viewer"')).toBeGreaterThan(0);
    }

    // A new args value: a miss, then a hit of it.
    const args = { region: `nowhere-${prefix}` };
    expectOk(await appRun(tokens[BOB]!, 'f/orders/by_region', args), false);
    const afterMiss = await scrapeMetrics();
    expectOk(await appRun(tokens[BOB]!, 'f/orders/by_region', args), true);
    const afterHit = await scrapeMetrics();

    const delta = (from: string, to: string, name: string) => sample(to, name) - sample(from, name);
    expect(delta(before, afterMiss, 'viewer_cache_misses_total')).toBe(1);
    expect(delta(before, afterMiss, 'viewer_cache_hits_total')).toBe(0);
    expect(delta(afterMiss, afterHit, 'viewer_cache_hits_total')).toBe(1);
    expect(delta(afterMiss, afterHit, 'viewer_cache_misses_total')).toBe(0);
  });

  it('/metrics never carries an email, a token or a per-viewer label', async () => {
    const metrics = await scrapeMetrics();
    expectNoSecrets(metrics, '/metrics');
    expect(metrics).not.toMatch(/viewer="|email="|key="|token="/);
  });

  it('a token in a query string is served but never logged: the log line has the route', async () => {
    const health = await request('GET', `/healthz?access_token=${tokens[ALICE]!}`);
    expect(health.status).toBe(200);
    // The line is written asynchronously: wait (bounded) until it is out.
    await pollUntil(
      async () => e2e.server.lines.some((line) => line.includes('"route":"/healthz"')),
      5000,
    );
    const lines = e2e.server.lines.filter((line) => line.includes('"route":"/healthz"'));
    expect(JSON.parse(lines[0]!)).toMatchObject({
      msg: 'request completed',
      method: 'GET',
      route: '/healthz',
      status: 200,
    });
    for (const line of e2e.server.lines) {
      expect(line).not.toContain('access_token');
      expect(line).not.toContain(tokens[ALICE]!);
    }
  });

  it('/healthz and /readyz answer 200 with Postgres and Redis up', async () => {
    const health = await request('GET', '/healthz');
    expect(health.status).toBe(200);
    const ready = await request('GET', '/readyz');
    expect(ready.status).toBe(200);
    // With two tiers the invalidation bus is reported too (informational); with the queue, the
    // live workers too (a miss waits for one).
    expect(ready.json).toEqual({
      ok: true,
      checks: { postgres: 'ok', redis: 'ok', ...(e2e.queued ? { workers: 'ok' } : {}) },
      invalidations: 'confirmed',
      ...(e2e.queued ? { workers: 1 } : {}),
    });
  });
});

describe('shutdown and logs', () => {
  it('stops cleanly on SIGINT (exit 0)', async () => {
    e2e.server.signal('SIGINT');
    const exit = await e2e.server.closed;
    expect(exit, e2e.server.stderr).toEqual({ code: 0, signal: null });
    const messages = e2e.server.lines.map((line) => (parseJson(line) as { msg?: string })?.msg);
    expect(messages).toContain('shutting down');
  });

  it('wrote JSON lines only, no errors, and never a token, an email or the secret key', () => {
    expect(e2e.server.lines.length).toBeGreaterThan(20);
    const ready = e2e.server.lines.filter((line) => line.startsWith('{"url":'));
    expect(ready).toHaveLength(1);
    for (const line of e2e.server.lines) {
      const entry = parseJson(line);
      expect(isRecord(entry), line).toBe(true);
      expectNoSecrets(line, 'a log line');
      expect((entry as { level?: number }).level ?? 0, line).toBeLessThan(50);
    }
    expectNoSecrets(e2e.server.stderr, 'stderr');
    // The logs did see the requests, the refusals and the schedule.
    const text = e2e.server.lines.join('\n');
    expect(text).toContain('E_NO_VIEWER');
    expect(text).toContain('E_NO_ROLES');
    expect(text).toContain('request completed');
    for (const output of e2e.cliOutputs) expect(output).not.toContain(SECRET_KEY);
  });
});
