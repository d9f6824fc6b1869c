import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { expectOk, expectRefused as expectRefusedWith } from '../../helpers/server_expect.js';
import { asRun, pollUntil } from '../../helpers/server_process.js';

// Scoped API keys through the reference server (issue 9 §4): `token create --roles` with the
// CLI, runs with the key over HTTP (app run, direct run, children in process and over HTTP with
// the job token), hits on the key's own entries, and the owner's runs never meeting them.

const WS = 'demo';
const ALICE = 'alice@example.com';
const CAROL = 'carol@example.com'; // groups emea + amer in the demo
const prefix = uniquePrefix();
const EMEA_ROLE = `${prefix}sales_emea`;
const AMER_ROLE = `${prefix}sales_amer`;
const REDIS_PREFIX = `vc-scoped:${prefix}`;
const SECRET_KEY = randomBytes(32).toString('hex');

const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: REDIS_PREFIX,
});
const { request, cli, cliJson } = e2e;
const tokens: Record<string, string> = {};
const expectRefused = (
  answer: Parameters<typeof expectRefusedWith>[1],
  status: number,
  code: string,
) =>
  expectRefusedWith(
    { secretKey: SECRET_KEY, tokens: () => Object.values(tokens) },
    answer,
    status,
    code,
  );

const regionsOf = (result: unknown) =>
  [...new Set((result as { region: string }[]).map((row) => row.region))].sort();

async function appRun(token: string, path: string) {
  return asRun(
    await request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, { token, body: { path } }),
  );
}

beforeAll(async () => {
  await e2e.start();
  const create = (user: string, roles?: string) =>
    cliJson<{ token: string; workspace: string; roles?: string[] }>([
      'token',
      'create',
      '--user',
      user,
      ...(roles === undefined ? [] : ['--roles', roles, '--label', `scoped ${roles}`]),
    ]);
  // Scoped tokens name the demo's roles, which the server seeds as it starts.
  await e2e.ready();
  const [full, emea, both, aliceAmer] = await Promise.all([
    create(CAROL),
    create(CAROL, EMEA_ROLE),
    create(CAROL, ` ${AMER_ROLE},${EMEA_ROLE},${AMER_ROLE}`),
    create(ALICE, AMER_ROLE),
  ]);
  expect(full.roles).toBeUndefined();
  expect(emea.roles).toEqual([EMEA_ROLE]);
  expect(both.roles).toEqual([AMER_ROLE, EMEA_ROLE]);
  tokens['carol'] = full.token;
  tokens['carol:emea'] = emea.token;
  tokens['carol:both'] = both.token;
  tokens['alice:amer'] = aliceAmer.token;
});

afterAll(() => e2e.stop());

describe('token create --roles and token list', () => {
  it('token list shows each scope by role name; unscoped tokens as all roles', async () => {
    const rows = await cliJson<
      { email: string; label: string | null; roles: string[] | null; roleScope: number[] | null }[]
    >(['token', 'list']);
    const byLabel = (label: string) => rows.find((row) => row.label === label);
    expect(byLabel(`scoped ${EMEA_ROLE}`)).toMatchObject({ email: CAROL, roles: [EMEA_ROLE] });
    expect(byLabel(`scoped ${EMEA_ROLE}`)?.roleScope).toEqual([expect.any(Number)]);
    const unscoped = rows.filter((row) => row.label === null && row.email === CAROL);
    expect(unscoped).toEqual([expect.objectContaining({ roles: null, roleScope: null })]);
    const text = await cli(['token', 'list']);
    expect(text.stdout).toMatch(new RegExp(`\\t${EMEA_ROLE}\\n|\\t${EMEA_ROLE}$`, 'm'));
    expect(text.stdout).toContain('\tall roles');
  });

  it('refuses unknown, invalid and empty role lists with a code, and stores nothing', async () => {
    const before = (await cliJson<unknown[]>(['token', 'list'])).length;
    const cases: Array<[string, string]> = [
      [`${EMEA_ROLE},${prefix}nosuch`, 'E_UNKNOWN_ROLE'],
      ['admin', 'E_INVALID_ROLE_NAME'],
      ['Not-A-Role', 'E_INVALID_ROLE_NAME'],
      ['', 'E_BAD_REQUEST'],
      [`${EMEA_ROLE},`, 'E_BAD_REQUEST'],
    ];
    // One CLI process per case, all at once: seven processes in a row overran the test's
    // timeout on a loaded 2-core machine, and the cases are independent.
    const results = await Promise.all(
      cases.map(([roles]) => cli(['--json', 'token', 'create', '--user', CAROL, '--roles', roles])),
    );
    cases.forEach(([roles, code], i) => {
      const result = results[i]!;
      expect(result.code, `${roles}: ${result.stderr}`).toBe(1);
      expect(result.stdout).not.toMatch(/vct_/);
      expect(JSON.parse(result.stdout)).toEqual({ error: { code, message: expect.any(String) } });
    });
    expect((await cliJson<unknown[]>(['token', 'list'])).length).toBe(before);
  }, 90_000);

  it('the table refuses an empty scope even when written around the CLI', async () => {
    const pool = new pg.Pool({ connectionString: e2e.env['DATABASE_URL'], max: 1 });
    pool.on('error', () => {});
    try {
      await expect(
        pool.query(
          `insert into viewer_cache_server.api_token (token_hash, workspace, email, role_scope)
           values ('\\x00', 'demo', 'x@example.com', '{}')`,
        ),
      ).rejects.toMatchObject({ code: '23514' });
    } finally {
      await pool.end();
    }
  });
});

describe("runs with a scoped key: the owner's roles ∩ the key's, in entries of their own", () => {
  it('the key scoped to EMEA sees EMEA rows only; its second run is a hit', async () => {
    const miss = await appRun(tokens['carol:emea']!, 'f/orders/list');
    expectOk(miss, false);
    expect(regionsOf(miss.result)).toEqual(['emea']);
    const hit = await appRun(tokens['carol:emea']!, 'f/orders/list');
    expectOk(hit, true);
    expect(hit.resultBytes).toBe(miss.resultBytes);
  });

  it("the owner's run does not hit the key's entry (and the key never hits hers)", async () => {
    const owner = await appRun(tokens['carol']!, 'f/orders/list');
    expectOk(owner, false);
    expect(regionsOf(owner.result)).toEqual(['amer', 'emea']);
    expectOk(await appRun(tokens['carol']!, 'f/orders/list'), true);
    const key = await appRun(tokens['carol:emea']!, 'f/orders/list');
    expectOk(key, true);
    expect(regionsOf(key.result)).toEqual(['emea']);
    // A key scoped to both of her roles grants what she holds, but is its own entry too.
    const both = await appRun(tokens['carol:both']!, 'f/orders/list');
    expectOk(both, false);
    expect(regionsOf(both.result)).toEqual(['amer', 'emea']);
  });

  it('the login is the key’s: EMEA’s own for one role, a set login for two', async () => {
    const one = await appRun(tokens['carol:emea']!, 'f/orders/whoami');
    expect(one.result).toEqual({ login: EMEA_ROLE });
    const two = await appRun(tokens['carol:both']!, 'f/orders/whoami');
    expect((two.result as { login: string }).login).toMatch(/^wm_set_/);
  });

  it('a direct run and both kinds of child job keep the scope', async () => {
    const direct = asRun(
      await request('POST', `/api/w/${WS}/jobs/run`, {
        token: tokens['carol:emea']!,
        body: { path: 'f/orders/list_sql' },
      }),
    );
    expect(direct.status, direct.text).toBe(200);
    expect(regionsOf(direct.result)).toEqual(['emea']);
    // Over HTTP with the job token: the child inherits the parent's scope.
    const remote = await appRun(tokens['carol:emea']!, 'f/orders/remote_child');
    expect(remote.status, remote.text).toBe(200);
    expect(regionsOf(remote.result)).toEqual(['emea']);
    // In process (ctx.runChild), through the cache.
    const summary = await appRun(tokens['carol:emea']!, 'f/orders/summary');
    expect(summary.status, summary.text).toBe(200);
    expect(Object.keys((summary.result as { totals: object }).totals)).toEqual(['emea']);
  });

  it('a key naming only a role its owner does not hold is refused with E_NO_ROLES', async () => {
    expectRefused(await appRun(tokens['alice:amer']!, 'f/orders/list'), 403, 'E_NO_ROLES');
  });

  it('revoking the scoped key reaches the running server within 1 s', async () => {
    const rows = await cliJson<{ id: string; label: string | null }[]>(['token', 'list']);
    const id = rows.find((row) => row.label === `scoped ${EMEA_ROLE}`)!.id;
    expect((await cli(['token', 'revoke', id])).code).toBe(0);
    await pollUntil(
      async () => (await appRun(tokens['carol:emea']!, 'f/orders/list')).status === 401,
      1000,
    );
    expectOk(await appRun(tokens['carol']!, 'f/orders/list'), true);
  });
});
