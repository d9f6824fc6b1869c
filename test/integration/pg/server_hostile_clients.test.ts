import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { get } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { freePort } from '../../helpers/free_port.js';
import { asAdmin, createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import {
  httpRequest,
  pollUntil,
  runCli,
  ServerProcess,
  serverEnv,
} from '../../helpers/server_process.js';

// The reference server against clients that hold connections open: bodies that never finish,
// and more connections than one client should have. Started as a user would with DATABASE_URL
// and nothing else: no demo seeding, no tokens anywhere in its output.

const REQUEST_TIMEOUT_MS = 1000;
const PER_CLIENT = 6;
const SECRET_KEY = randomBytes(32).toString('hex');
const prefix = uniquePrefix();

let db: TestDatabase;
let dataDir: string;
let env: NodeJS.ProcessEnv;
let server: ServerProcess;
let baseUrl: string;
/** A second server process on the same database: a revocation must reach it too. */
let second: ServerProcess;
let secondUrl: string;
const sockets: Socket[] = [];

beforeAll(async () => {
  db = await createTestDatabase(prefix);
  dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-hostile-'));
  env = serverEnv({
    DATABASE_URL: db.url,
    VIEWER_CACHE_SECRET_KEY: SECRET_KEY,
    VIEWER_CACHE_DATA_DIR: dataDir,
    VIEWER_CACHE_REQUEST_TIMEOUT_MS: String(REQUEST_TIMEOUT_MS),
    VIEWER_CACHE_MAX_CONNECTIONS_PER_CLIENT: String(PER_CLIENT),
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    HOST: '127.0.0.1',
    PORT: String(await freePort()),
    LOG_LEVEL: 'info',
  });
  server = new ServerProcess(env);
  second = new ServerProcess({ ...env, PORT: String(await freePort()) });
  [baseUrl, secondUrl] = (await Promise.all([server.ready, second.ready])).map((r) => r.url) as [
    string,
    string,
  ];
});

afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  if (server?.running) await server.kill();
  if (second?.running) await second.kill();
  await db?.drop();
  if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
});

/** A raw TCP connection to the server, with everything it receives and when it closed. */
function openSocket(): Promise<{ socket: Socket; received: () => string; closed: Promise<void> }> {
  const { port } = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    let data = '';
    const socket = connect(Number(port), '127.0.0.1');
    sockets.push(socket);
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      data += chunk;
    });
    socket.on('error', () => {});
    const closed = new Promise<void>((done) => socket.once('close', () => done()));
    socket.once('connect', () => resolve({ socket, received: () => data, closed }));
    socket.once('error', reject);
  });
}

/**
 * `GET /healthz` on a connection of its own, closed after the answer (fetch would keep its
 * connection alive, and it would count against this client's connections).
 */
const healthy = () =>
  new Promise<boolean>((resolve) => {
    const req = get(
      `${baseUrl}/healthz`,
      { agent: false, headers: { connection: 'close' } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode === 200));
        res.on('error', () => resolve(false));
      },
    );
    req.on('error', () => resolve(false));
  });

describe('a client that never finishes its request', () => {
  it('a body that never finishes is answered 408 and closed, and the server keeps serving', async () => {
    const slow = await openSocket();
    slow.socket.write(
      'POST /api/w/demo/jobs/run HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n' +
        'content-length: 1000\r\n\r\n{"path":',
    );
    // One more byte now and then: the connection is never idle, the request never complete.
    const trickle = setInterval(() => slow.socket.write(' '), 100);
    try {
      const started = performance.now();
      await Promise.race([
        slow.closed,
        pollUntil(async () => slow.socket.destroyed, REQUEST_TIMEOUT_MS * 5),
      ]);
      // The timeout plus Node's checking interval (a quarter of it), with slack for a busy box.
      expect(performance.now() - started).toBeLessThan(REQUEST_TIMEOUT_MS * 4);
    } finally {
      clearInterval(trickle);
    }
    expect(slow.received()).toMatch(/^HTTP\/1\.1 408 /);
    expect(slow.received()).toContain('{"error":{"code":"E_REQUEST_TIMEOUT"');
    expect(await healthy()).toBe(true);
  });

  it('headers that never finish are answered 408 and closed', async () => {
    const slow = await openSocket();
    slow.socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n');
    await Promise.race([
      slow.closed,
      pollUntil(async () => slow.socket.destroyed, REQUEST_TIMEOUT_MS * 5),
    ]);
    expect(slow.received()).toMatch(/^HTTP\/1\.1 408 /);
  });
});

describe('one client holding many connections', () => {
  it(`the connection over ${PER_CLIENT} from one address is closed on arrival; others are served`, async () => {
    const held = [];
    for (let i = 0; i < PER_CLIENT; i++) held.push(await openSocket());
    // The server has accepted them all before the extra one arrives (each answers a request).
    for (const { socket, received } of held) {
      socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      await pollUntil(async () => received().includes('{"ok":true}'), 5000);
    }
    const extra = await openSocket();
    extra.socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    await Promise.race([extra.closed, pollUntil(async () => extra.socket.destroyed, 5000)]);
    expect(extra.received()).toBe('');
    // Let them go: the next client is served again.
    for (const { socket, closed } of held) {
      socket.destroy();
      await closed;
    }
    await pollUntil(healthy, 5000);
  });
});

describe('token revocation', () => {
  it('a revoked token is refused by every server process within 1 s', async () => {
    const made = await runCli(env, ['--json', 'token', 'create', '--user', 'erin@example.com']);
    expect(made.code, made.stderr).toBe(0);
    const { token } = JSON.parse(made.stdout) as { token: string };
    const status = async (url: string) =>
      (await httpRequest(url, 'GET', '/api/w/demo/schedules', { token })).status;
    // Used on both processes, so both hold it in their token cache.
    expect([await status(baseUrl), await status(secondUrl)]).toEqual([200, 200]);

    const revoked = await runCli(env, ['--json', 'token', 'revoke', '--user', 'erin@example.com']);
    expect(revoked.code, revoked.stderr).toBe(0);
    expect(JSON.parse(revoked.stdout)).toEqual({ revoked: 1 });
    const took = await Promise.all(
      [baseUrl, secondUrl].map((url) => pollUntil(async () => (await status(url)) === 401, 1000)),
    );
    expect(Math.max(...took)).toBeLessThanOrEqual(1000);
  });
});

describe('started with DATABASE_URL and nothing else', () => {
  it('did not seed the demo: no data table, no roles, no tokens in that database', async () => {
    const counts = await asAdmin(db.name, async (c) => {
      const { rows } = await c.query<{ datatables: number; roles: number; tokens: number }>(
        `select (select count(*) from viewer_cache.datatable)::int as datatables,
                (select count(*) from viewer_cache.role)::int as roles,
                (select count(*) from viewer_cache_server.api_token)::int as tokens`,
      );
      return rows[0];
    });
    expect(counts).toEqual({ datatables: 0, roles: 0, tokens: 0 });
    const tokens = await runCli(env, ['--json', 'token', 'list']);
    expect(tokens.code, tokens.stderr).toBe(0);
    expect(JSON.parse(tokens.stdout)).toEqual([]);
  });

  it('printed no token and no email, in the ready line or in any log line', async () => {
    const demoTokens = ['alice', 'bob', 'carol', 'dave', 'publisher'].map((name) =>
      demoToken(SECRET_KEY, `${name}@example.com`),
    );
    await Promise.all([server.kill(), second.kill()]);
    const output = [...server.lines, server.stderr, ...second.lines, second.stderr].join('\n');
    expect(server.lines.filter((line) => line.startsWith('{"url":'))).toEqual([
      JSON.stringify({ url: baseUrl }),
    ]);
    for (const token of demoTokens) expect(output).not.toContain(token);
    expect(output).not.toMatch(/vct_|@example\.com/);
  });
});
