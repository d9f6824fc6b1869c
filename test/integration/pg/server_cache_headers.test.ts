import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import type { JWK } from 'jose';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { signEmbedAssertion } from '../../../src/index.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { buildHttpApp, type HttpDeps } from '../../../src/server/http/http.js';
import {
  CACHE_HEADERS,
  type DeclaredRoute,
  declaredRoutes,
  type RouteCaching,
} from '../../../src/server/http/http_caching.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { type Answer, httpRequest, type RequestOptions } from '../../helpers/server_process.js';

// No shared cache downstream may keep a viewer's answer (SPEC's CDN leak class). Every route of
// the reference server declares what a cache may keep (src/server/http/http_caching.ts); this file
// takes the list of routes from the route table itself (a route added later without a decision
// does not even register, and one without a case below fails here), and sends each of them
// answers of every kind — success, 401, 403, 404, 400 — to a real server, checking the headers:
// `Cache-Control: private, no-store` and `Vary: Authorization` for anything that depends on who
// asks, `Cache-Control: no-store` for the rest; answers that come from no route say `no-store`.

const WS = 'demo';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-hdr:${prefix}`,
});
const NORA = demoToken(SECRET_KEY, 'nora@example.com');
const ALICE = demoToken(SECRET_KEY, 'alice@example.com');
const PUBLISHER = demoToken(SECRET_KEY, 'publisher@example.com');
let otherWorkspace = '';
let embedLink = '';

type Method = 'GET' | 'POST' | 'HEAD';
const send = (method: Method, path: string, options: RequestOptions = {}) =>
  httpRequest(e2e.url, method, path, options);
const post = (path: string, token: string | undefined, body: unknown) =>
  send('POST', path, { ...(token === undefined ? {} : { token }), body });

interface Case {
  readonly what: string;
  readonly status: number;
  readonly send: () => Promise<Answer>;
}

/** Every route of the server, with the decision it must have and answers of each kind. */
const ROUTES: Record<string, { caching: RouteCaching; cases: Case[] }> = {
  'POST /api/w/:workspace/apps/:app/run': {
    caching: 'per-caller',
    cases: [
      {
        what: 'a viewer’s rows (a miss)',
        status: 200,
        send: () => post(`/api/w/${WS}/apps/clinics/run`, NORA, { path: 'f/clinics/patients' }),
      },
      {
        what: 'the same, a hit (written by hand, not by Fastify)',
        status: 200,
        send: () => post(`/api/w/${WS}/apps/clinics/run`, NORA, { path: 'f/clinics/patients' }),
      },
      {
        what: 'no token',
        status: 401,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/run`, undefined, { path: 'f/clinics/patients' }),
      },
      {
        what: 'another workspace’s token',
        status: 403,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/run`, otherWorkspace, { path: 'f/clinics/patients' }),
      },
      {
        what: 'a refusal of this viewer',
        status: 403,
        send: () => post(`/api/w/${WS}/apps/clinics/run`, ALICE, { path: 'f/clinics/patients' }),
      },
      {
        what: 'an unknown app',
        status: 404,
        send: () => post(`/api/w/${WS}/apps/nope/run`, NORA, { path: 'f/clinics/patients' }),
      },
      {
        what: 'a malformed body',
        status: 400,
        send: () => post(`/api/w/${WS}/apps/clinics/run`, NORA, { path: 1 }),
      },
    ],
  },
  'POST /api/w/:workspace/public/apps/:app/run': {
    caching: 'live',
    cases: [
      {
        what: 'an anonymous visitor refused',
        status: 403,
        send: () =>
          post(`/api/w/${WS}/public/apps/clinics-public/run`, undefined, {
            path: 'f/clinics/counts',
          }),
      },
      {
        what: 'not a public app',
        status: 404,
        send: () =>
          post(`/api/w/${WS}/public/apps/clinics/run`, undefined, { path: 'f/clinics/counts' }),
      },
    ],
  },
  'POST /api/w/:workspace/embed/apps/:app/run': {
    caching: 'per-caller',
    cases: [
      {
        what: 'an embed viewer’s counts, token in the header',
        status: 200,
        send: () =>
          post(`/api/w/${WS}/embed/apps/clinics/run`, embedLink, { path: 'f/clinics/counts' }),
      },
      {
        what: 'the same as a ?token= link',
        status: 200,
        send: () =>
          send('POST', `/api/w/${WS}/embed/apps/clinics/run?token=${embedLink}`, {
            body: { path: 'f/clinics/counts' },
          }),
      },
      {
        what: 'no link',
        status: 401,
        send: () =>
          post(`/api/w/${WS}/embed/apps/clinics/run`, undefined, { path: 'f/clinics/counts' }),
      },
      {
        what: 'a forged link',
        status: 401,
        send: () =>
          send('POST', `/api/w/${WS}/embed/apps/clinics/run?token=a.b.c`, {
            body: { path: 'f/clinics/counts' },
          }),
      },
    ],
  },
  'POST /api/w/:workspace/jobs/run': {
    caching: 'per-caller',
    cases: [
      {
        what: 'a direct run',
        status: 200,
        send: () => post(`/api/w/${WS}/jobs/run`, ALICE, { path: 'f/orders/list' }),
      },
      {
        what: 'no token',
        status: 401,
        send: () => post(`/api/w/${WS}/jobs/run`, undefined, { path: 'f/orders/list' }),
      },
      {
        what: 'an unknown runnable',
        status: 404,
        send: () => post(`/api/w/${WS}/jobs/run`, ALICE, { path: 'f/nope' }),
      },
    ],
  },
  'POST /api/w/:workspace/jobs/preview': {
    caching: 'per-caller',
    cases: [
      {
        what: 'a preview',
        status: 200,
        send: () => post(`/api/w/${WS}/jobs/preview`, ALICE, { path: 'f/orders/list' }),
      },
      {
        what: 'another workspace’s token',
        status: 403,
        send: () => post(`/api/w/${WS}/jobs/preview`, otherWorkspace, { path: 'f/orders/list' }),
      },
    ],
  },
  'POST /api/w/:workspace/jobs/run_child': {
    caching: 'per-caller',
    cases: [
      // A live job token exists only inside a running job (f/orders/remote_child uses one).
      {
        what: 'no job token',
        status: 401,
        send: () => post(`/api/w/${WS}/jobs/run_child`, undefined, { path: 'f/orders/list' }),
      },
      {
        what: 'a token that is no live job’s',
        status: 401,
        send: () => post(`/api/w/${WS}/jobs/run_child`, ALICE, { path: 'f/orders/list' }),
      },
    ],
  },
  'POST /api/w/:workspace/hooks/:hook': {
    caching: 'per-caller',
    cases: [
      {
        what: 'a webhook’s run refused (no viewer)',
        status: 403,
        send: () => post(`/api/w/${WS}/hooks/orders-refresh`, ALICE, {}),
      },
      {
        what: 'an unknown hook',
        status: 404,
        send: () => post(`/api/w/${WS}/hooks/nope`, ALICE, {}),
      },
      {
        what: 'no token',
        status: 401,
        send: () => post(`/api/w/${WS}/hooks/orders-refresh`, undefined, {}),
      },
    ],
  },
  'POST /api/w/:workspace/apps/:app/runs/per-recipient': {
    caching: 'per-caller',
    cases: [
      {
        what: 'the publisher’s batch',
        status: 200,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/runs/per-recipient`, PUBLISHER, {
            path: 'f/clinics/counts',
            recipients: ['ada@example.com'],
          }),
      },
      {
        what: 'anyone else',
        status: 403,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/runs/per-recipient`, NORA, {
            path: 'f/clinics/counts',
            recipients: ['ada@example.com'],
          }),
      },
      {
        what: 'no token',
        status: 401,
        send: () => post(`/api/w/${WS}/apps/clinics/runs/per-recipient`, undefined, {}),
      },
    ],
  },
  'POST /api/w/:workspace/apps/:app/explain': {
    caching: 'per-caller',
    cases: [
      {
        what: 'a workspace admin’s explanation',
        status: 200,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/explain`, PUBLISHER, {
            path: 'f/clinics/patients',
            viewer: { email: 'dana@example.com' },
          }),
      },
      {
        what: 'anyone else',
        status: 403,
        send: () =>
          post(`/api/w/${WS}/apps/clinics/explain`, NORA, {
            path: 'f/clinics/patients',
            viewer: { email: 'dana@example.com' },
          }),
      },
      {
        what: 'no token',
        status: 401,
        send: () => post(`/api/w/${WS}/apps/clinics/explain`, undefined, {}),
      },
    ],
  },
  ...getRoute('/api/w/:workspace/outbox', 'per-caller', [
    ['their own deliveries', 200, () => `/api/w/${WS}/outbox`, () => NORA],
    ['no token', 401, () => `/api/w/${WS}/outbox`, () => undefined],
    ['another workspace’s token', 403, () => `/api/w/${WS}/outbox`, () => otherWorkspace],
  ]),
  ...getRoute('/api/w/:workspace/schedules', 'per-caller', [
    ['the schedules', 200, () => `/api/w/${WS}/schedules`, () => NORA],
    ['no token', 401, () => `/api/w/${WS}/schedules`, () => undefined],
  ]),
  ...getRoute('/api/cache/stats', 'live', [['counters', 200, () => '/api/cache/stats']]),
  ...getRoute('/healthz', 'live', [['alive', 200, () => '/healthz']]),
  ...getRoute('/readyz', 'live', [['ready', 200, () => '/readyz']]),
  ...getRoute('/metrics', 'live', [['metrics', 200, () => '/metrics']]),
};

/** A GET route and the HEAD route Fastify adds beside it, with the same cases. */
function getRoute(
  url: string,
  caching: RouteCaching,
  cases: [string, number, () => string, (() => string | undefined)?][],
): Record<string, { caching: RouteCaching; cases: Case[] }> {
  const of = (method: Method) =>
    cases.map(([what, status, path, token]) => ({
      what,
      status,
      send: () => {
        const value = token?.();
        return send(method, path(), value === undefined ? {} : { token: value });
      },
    }));
  return {
    [`GET ${url}`]: { caching, cases: of('GET') },
    [`HEAD ${url}`]: { caching, cases: of('HEAD') },
  };
}

/** The routes as the server's own route table declares them (no request is served). */
async function routeTable(): Promise<readonly DeclaredRoute[]> {
  const stub = {} as never;
  const deps: HttpDeps = {
    logger: pino({ level: 'silent' }),
    executor: stub,
    cache: stub,
    datatables: stub,
    apps: {},
    hooks: {},
    schedules: () => [],
    apiTokens: stub,
    jobTokens: stub,
    embedVerifier: stub,
    metrics: { registry: new Registry(), observeRequest() {}, observeJob() {} },
    // Every optional route group on: the table must be complete.
    recipients: { perRecipient: stub, outbox: stub },
    storeState: async () => 'ok',
  };
  const app = buildHttpApp(deps);
  try {
    await app.ready();
    return declaredRoutes(app);
  } finally {
    await app.close();
  }
}

function expectHeaders(answer: Answer, caching: RouteCaching, what: string): void {
  expect(answer.headers.get('cache-control'), what).toBe(CACHE_HEADERS[caching]['cache-control']);
  if (caching === 'per-caller') {
    expect(answer.headers.get('cache-control'), what).toBe('private, no-store');
    expect(answer.headers.get('vary') ?? '', what).toMatch(/\bAuthorization\b/i);
  } else {
    expect(answer.headers.get('cache-control'), what).toBe('no-store');
  }
}

beforeAll(async () => {
  await e2e.start();
  otherWorkspace = (
    await e2e.cliJson<{ token: string }>(['-w', 'other', 'token', 'create', '--user', 'x@x'])
  ).token;
  const key = await e2e.cliJson<{ privateJwk: JWK }>(['embed-key', 'create']);
  embedLink = await signEmbedAssertion(key.privateJwk, {
    workspace: WS,
    app: 'clinics',
    attributes: { health_system: 'north' },
  });
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe('what a cache in front of the server may keep', () => {
  it('every route of the server has a decision, and a case here', async () => {
    const table = await routeTable();
    expect(table.length).toBeGreaterThan(10);
    const keys = table.map(({ method, url }) => `${method} ${url}`);
    // Nothing registered twice, nothing forgotten, nothing here that is no longer a route.
    expect(new Set(keys).size).toBe(keys.length);
    expect(keys.sort()).toEqual(Object.keys(ROUTES).sort());
    for (const { method, url, caching } of table)
      expect(caching, `${method} ${url}`).toBe(ROUTES[`${method} ${url}`]!.caching);
  });

  it('registering a route without a decision fails at once', async () => {
    const app = buildHttpApp({
      logger: pino({ level: 'silent' }),
      metrics: { registry: new Registry(), observeRequest() {}, observeJob() {} },
    } as unknown as HttpDeps);
    expect(() => app.get('/undecided', async () => 'x')).toThrow(/declares no caching/);
    await app.close();
  });

  for (const [route, { caching, cases }] of Object.entries(ROUTES)) {
    it(`${route}: ${caching}, on every answer`, async () => {
      for (const { what, status, send: sendIt } of cases) {
        const answer = await sendIt();
        expect(answer.status, `${what}: ${answer.text}`).toBe(status);
        expectHeaders(answer, caching, `${route} — ${what}`);
      }
    });
  }

  it('answers that come from no route: no-store', async () => {
    const unmatched = await send('GET', '/api/w/demo/nope');
    expect(unmatched.status).toBe(404);
    expectHeaders(unmatched, 'live', 'an unmatched route');
    const tooLong = await send('GET', `/api/w/${'w'.repeat(200)}/outbox`, { token: NORA });
    expect(tooLong.status).toBe(414);
    expectHeaders(tooLong, 'live', 'a path segment too long');
    // Refused by Node before Fastify sees it: headers over 16 KiB.
    const raw = await rawRequest(
      `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
    );
    expect(raw).toMatch(/^HTTP\/1\.1 431 /);
    expect(raw).toMatch(/\r\nCache-Control: no-store\r\n/i);
  });
});

/** Writes `text` on a fresh connection and returns everything received until it closes. */
function rawRequest(text: string): Promise<string> {
  const { hostname, port } = new URL(e2e.url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname);
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      received += chunk;
    });
    socket.on('error', (err) => (received === '' ? reject(err) : resolve(received)));
    socket.on('close', () => resolve(received));
    socket.on('connect', () => socket.write(text));
  });
}
