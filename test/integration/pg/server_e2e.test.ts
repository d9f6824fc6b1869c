import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { freePort } from '../../helpers/free_port.js';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';

// The reference server end to end, started the way a user starts it: `viewer-cache --json serve`
// as a child process on a free port, on this file's own database and the suite's Redis, with
// tokens made by the CLI. One server serves every check; the tests run in order and share it.

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const MAIN = join(ROOT, 'src/server/main.ts');
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

// ---------------------------------------------------------------------------------------------
// Processes

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** `viewer-cache --json serve` in a child process, its output kept in memory line by line. */
class ServerProcess {
  readonly lines: string[] = [];
  stderr = '';
  readonly closed: Promise<Exit>;
  readonly ready: Promise<{ url: string; tokens: Record<string, string> }>;
  readonly #child: ChildProcess;

  constructor(env: NodeJS.ProcessEnv) {
    this.#child = spawn(process.execPath, ['--import', 'tsx', MAIN, '--json', 'serve'], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.#child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    // 'close' comes after both output streams ended, so every line has been read by then.
    this.closed = new Promise((resolve) =>
      this.#child.once('close', (code, signal) => resolve({ code, signal })),
    );
    this.ready = new Promise((resolve, reject) => {
      createInterface({ input: this.#child.stdout! }).on('line', (line) => {
        this.lines.push(line);
        const parsed = parseJson(line);
        if (isRecord(parsed) && typeof parsed['url'] === 'string' && isRecord(parsed['tokens'])) {
          resolve(parsed as { url: string; tokens: Record<string, string> });
        }
      });
      void this.closed.then(({ code, signal }) =>
        reject(
          new Error(
            `the server exited (code ${code}, signal ${signal}) before it was ready\n` +
              `stderr:\n${this.stderr}\nstdout (last lines):\n${this.lines.slice(-20).join('\n')}`,
          ),
        ),
      );
    });
    this.ready.catch(() => {});
  }

  get running(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  signal(signal: NodeJS.Signals): void {
    if (this.running) this.#child.kill(signal);
  }
}

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

const cliOutputs: string[] = [];

/** Runs the CLI (`viewer-cache ARGS`) as a user would, with the server's environment. */
function cli(args: string[]): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', MAIN, ...args], {
      cwd: ROOT,
      env: serverEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk;
    });
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    child.once('error', reject);
    child.once('close', (code) => {
      cliOutputs.push(stdout, stderr);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The CLI with `--json`, expected to succeed; its stdout parsed. */
async function cliJson<T>(args: string[]): Promise<T> {
  const result = await cli(['--json', ...args]);
  if (result.code !== 0) {
    throw new Error(`viewer-cache ${args.join(' ')} exited ${result.code}: ${result.stderr}`);
  }
  return JSON.parse(result.stdout) as T;
}

// ---------------------------------------------------------------------------------------------
// HTTP

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  json: unknown;
}

async function request(
  method: 'GET' | 'POST',
  path: string,
  options: { token?: string; body?: unknown; raw?: string; contentType?: string } = {},
): Promise<Answer> {
  const headers: Record<string, string> = {};
  if (options.token !== undefined) headers['authorization'] = `Bearer ${options.token}`;
  let body: string | undefined;
  if (options.raw !== undefined || options.body !== undefined) {
    body = options.raw ?? JSON.stringify(options.body);
    headers['content-type'] = options.contentType ?? 'application/json';
  }
  const response = await fetch(`${baseUrl}${path}`, {
    method,
    headers,
    ...(body === undefined ? {} : { body }),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: parseJson(text) };
}

interface RunAnswer extends Answer {
  fromCache: boolean | undefined;
  result: unknown;
  /** The response bytes from `"result":` on: equal for a hit and the miss it repeats. */
  resultBytes: string;
}

/** An app request (`orders-dashboard`) by the token's user. */
async function appRun(token: string, path: string, args?: Record<string, unknown>) {
  return asRun(
    await request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
      token,
      body: args === undefined ? { path } : { path, args },
    }),
  );
}

function asRun(answer: Answer): RunAnswer {
  const body = isRecord(answer.json) ? answer.json : {};
  const at = answer.text.indexOf(',"result":');
  return {
    ...answer,
    fromCache: typeof body['fromCache'] === 'boolean' ? body['fromCache'] : undefined,
    result: body['result'],
    resultBytes: at < 0 ? '' : answer.text.slice(at),
  };
}

/** A successful run: 200, and the cache header agrees with the body. */
function expectOk(answer: RunAnswer, fromCache: boolean): void {
  expect(answer.status, answer.text).toBe(200);
  expect(answer.fromCache).toBe(fromCache);
  expect(answer.headers.get('x-viewer-cache')).toBe(fromCache ? 'hit' : 'miss');
  expect(answer.headers.get('content-type')).toMatch(/^application\/json/);
  expect(answer.json).toMatchObject({ jobId: expect.any(String) });
}

/** A clean refusal: the status, `{ error: { code, message } }` and nothing else worth stealing. */
function expectRefused(answer: Answer, status: number, code: string): void {
  expect(answer.status, answer.text).toBe(status);
  expect(answer.json).toEqual({ error: { code, message: expect.any(String) } });
  expect(answer.headers.get('x-viewer-cache')).toBeNull();
  expectNoSecrets(answer.text);
  // No stack trace, source location or internal detail.
  expect(answer.text).not.toMatch(/\bat \S+ \(|\.ts:\d+|node_modules|Error:/);
}

/** Nothing a client or a log reader must not see: tokens, emails, the secret key. */
function expectNoSecrets(text: string, what = 'text'): void {
  expect(text, what).not.toContain('@example.com');
  expect(text, what).not.toContain(SECRET_KEY);
  expect(text, what).not.toMatch(/vc[tj]_[A-Za-z0-9_-]{20,}/);
  for (const token of allTokens())
    expect(text.includes(token), `${what} holds a token`).toBe(false);
}

async function scrapeMetrics(): Promise<string> {
  const answer = await request('GET', '/metrics');
  expect(answer.status).toBe(200);
  return answer.text;
}

/** The value of an unlabelled sample, or of the first sample whose labels contain `labels`. */
function sample(metrics: string, name: string, labels = ''): number {
  for (const line of metrics.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (labels === '' ? !rest.startsWith(' ') : !(rest.startsWith('{') && rest.includes(labels)))
      continue;
    return Number(rest.slice(rest.lastIndexOf(' ') + 1));
  }
  return Number.NaN;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

// ---------------------------------------------------------------------------------------------
// One server for the whole file

let db: TestDatabase;
let dataDir: string;
let serverEnv: NodeJS.ProcessEnv;
let server: ServerProcess;
let baseUrl: string;
let demoTokens: Record<string, string> = {};
/** Tokens made with `token create`, by email; `other` is alice's in workspace `other`. */
const tokens: Record<string, string> = {};
let otherWorkspaceToken: string;
let redis: Redis;

function allTokens(): string[] {
  return [...Object.values(tokens), ...Object.values(demoTokens), otherWorkspaceToken].filter(
    (token): token is string => typeof token === 'string' && token.length > 0,
  );
}

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-e2e-'));
  const port = await freePort();
  const inherited: NodeJS.ProcessEnv = { ...process.env };
  for (const name of Object.keys(inherited)) {
    if (name.startsWith('VIEWER_CACHE_') || name === 'REDIS_CLUSTER' || name === 'FORCE_COLOR')
      delete inherited[name];
  }
  serverEnv = {
    ...inherited,
    DATABASE_URL: db.url,
    REDIS_URL: inject('redisUrl'),
    VIEWER_CACHE_REDIS_PREFIX: REDIS_PREFIX,
    // The 200 ms default degrades runs to uncached when a loaded machine stalls: hits must be hits.
    VIEWER_CACHE_REDIS_TIMEOUT_MS: '5000',
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
    VIEWER_CACHE_DATA_DIR: dataDir,
    // Only the first scheduled run (before the ready line): later ones would move the counters.
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
    PORT: String(port),
    LOG_FORMAT: 'json',
    LOG_LEVEL: 'debug',
    NO_COLOR: '1',
  };
  redis = new Redis(inject('redisUrl'), { lazyConnect: true, maxRetriesPerRequest: 1 });
  redis.on('error', () => {});

  // The catalog is migrated in the template, so the CLI and the server can start together.
  server = new ServerProcess(serverEnv);
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

  const ready = await server.ready;
  baseUrl = ready.url;
  demoTokens = ready.tokens;
  expect(baseUrl).toBe(`http://127.0.0.1:${port}`);
  // The CLI's tokens are new ones, not the demo's derived tokens.
  for (const email of [ALICE, BOB, CAROL, DAVE]) {
    expect(tokens[email]).toMatch(/^vct_/);
    expect(tokens[email]).not.toBe(demoTokens[email]);
  }
});

afterAll(async () => {
  if (server?.running) {
    server.signal('SIGKILL');
    await server.closed;
  }
  if (redis !== undefined) {
    // Only this file's prefix: both pg projects and the redis suite share the server.
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${REDIS_PREFIX}*`, 'COUNT', 500);
      if (keys.length > 0) await redis.del(...keys);
      cursor = next;
    } while (cursor !== '0');
    redis.disconnect();
  }
  await db?.drop();
  if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
});

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
      const [next, found] = await redis.scan(cursor, 'MATCH', `${REDIS_PREFIX}*`, 'COUNT', 500);
      keys.push(...found);
      cursor = next;
    } while (cursor !== '0');
    expect(keys.length).toBeGreaterThanOrEqual(3);
    for (const key of keys) {
      expect(key).toMatch(new RegExp(`^${REDIS_PREFIX}${WS}/cache/[0-9a-f]{64}$`));
      const value = await redis.getBuffer(key);
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
      cli(['--json', 'cache', 'stats', '--url', baseUrl]),
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
    // Set logins are cluster-wide: keep the ones holding this server's roles.
    const ours = list.filter((row) => row.roles.some((role) => role.startsWith(prefix)));
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

describe('a role change applies on the very next run', () => {
  it('removing carol from group amer with the CLI changes her next response', async () => {
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
    expectRefused(await send(), status, code);
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
    for (const name of [
      'viewer_cache_datatable_resolve_seconds',
      'viewer_cache_datatable_connect_seconds',
    ]) {
      expect(before).toContain(`# TYPE ${name} histogram`);
      expect(sample(before, `${name}_count`, 'access="viewer"')).toBeGreaterThan(0);
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

  it('/healthz and /readyz answer 200 with Postgres and Redis up', async () => {
    const health = await request('GET', '/healthz');
    expect(health.status).toBe(200);
    const ready = await request('GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.json).toEqual({ ok: true, checks: { postgres: 'ok', redis: 'ok' } });
  });
});

describe('shutdown and logs', () => {
  it('stops cleanly on SIGINT (exit 0)', async () => {
    server.signal('SIGINT');
    const exit = await server.closed;
    expect(exit, server.stderr).toEqual({ code: 0, signal: null });
    const messages = server.lines.map((line) => (parseJson(line) as { msg?: string })?.msg);
    expect(messages).toContain('shutting down');
  });

  it('wrote JSON lines only, no errors, and never a token, an email or the secret key', () => {
    expect(server.lines.length).toBeGreaterThan(20);
    const ready = server.lines.filter((line) => line.startsWith('{"url":'));
    // The ready line is the one place demo tokens are printed, by design.
    expect(ready).toHaveLength(1);
    expect(ready[0]).not.toContain(SECRET_KEY);
    for (const line of server.lines) {
      const entry = parseJson(line);
      expect(isRecord(entry), line).toBe(true);
      if (line === ready[0]) continue;
      expectNoSecrets(line, 'a log line');
      expect((entry as { level?: number }).level ?? 0, line).toBeLessThan(50);
    }
    expectNoSecrets(server.stderr, 'stderr');
    // The logs did see the requests, the refusals and the schedule.
    const text = server.lines.join('\n');
    expect(text).toContain('E_NO_VIEWER');
    expect(text).toContain('E_NO_ROLES');
    expect(text).toContain('request completed');
    for (const output of cliOutputs) expect(output).not.toContain(SECRET_KEY);
  });
});
