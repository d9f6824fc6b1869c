import { randomBytes } from 'node:crypto';
import { importJWK, type JWK, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { EMBED_TOKEN_TYPE, embedAudience, signEmbedAssertion } from '../../../src/index.js';
import { asAdmin, uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import {
  expectNoSecrets as expectNoSecretsIn,
  expectOk,
  expectRefused as expectRefusedWith,
  type Secrets,
} from '../../helpers/server_expect.js';
import { type Answer, asRun, pollUntil } from '../../helpers/server_process.js';

// Per-viewer embed links through the reference server, end to end: keys made with the CLI,
// links signed as a host would sign them, the route's 401 codes, rows by signed attribute under
// RLS, hits on second runs, rotation and revocation across the process boundary, and no token
// or private key in any log line or CLI output but the one `create` prints.

const WS = 'demo';
const APP = 'orders-dashboard';
const prefix = uniquePrefix();
const EMBED_ROLE = `${prefix}embed_customer`;
const SECRET_KEY = randomBytes(32).toString('hex');

const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e-embed:${prefix}`,
});
const { request, cli, cliJson } = e2e;

interface Created {
  workspace: string;
  kid: string;
  alg: string;
  privateJwk: JWK;
  audience: string;
  stillActive?: string[];
}
let key: Created;
let otherWorkspaceKey: Created;
/** Every link signed here: none may show up in a log line. */
const links: string[] = [];
/** The private parts (`d`) of every key the CLI printed. */
const privateParts: string[] = [];

const secrets: Secrets = { secretKey: SECRET_KEY, tokens: () => links };
const expectRefused = (answer: Answer, code: string) =>
  expectRefusedWith(secrets, answer, 401, code);

async function link(
  jwk: JWK,
  attributes: Record<string, string>,
  options: { app?: string; email?: string } = {},
): Promise<string> {
  const token = await signEmbedAssertion(jwk, {
    workspace: WS,
    app: options.app ?? APP,
    attributes,
    ...(options.email === undefined ? {} : { email: options.email }),
  });
  links.push(token);
  return token;
}

/** An embed run: the token in the Authorization header, or in `?token=` (a link). */
async function embedRun(token: string | null, via: 'header' | 'query' = 'header', app = APP) {
  const query = via === 'query' && token !== null ? `?token=${encodeURIComponent(token)}` : '';
  return asRun(
    await request('POST', `/api/w/${WS}/embed/apps/${app}/run${query}`, {
      ...(via === 'header' && token !== null ? { token } : {}),
      body: { path: 'f/orders/list' },
    }),
  );
}

const customers = (answer: { result?: unknown }) =>
  (answer.result as { customer: string }[]).map((row) => row.customer);

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
  [key, otherWorkspaceKey] = await Promise.all([
    cliJson<Created>(['embed-key', 'create', '--label', 'host app']),
    cliJson<Created>(['-w', 'other', 'embed-key', 'create']),
  ]);
  privateParts.push(key.privateJwk.d as string, otherWorkspaceKey.privateJwk.d as string);
  // An embed role on the demo's data table, with a policy that reads the signed attribute.
  await cliJson(['roles', 'create', EMBED_ROLE, '--tenant', `embed:${APP}`]);
  const database = new URL(e2e.env['DATABASE_URL']!).pathname.slice(1);
  await asAdmin(database, async (c) => {
    await c.query(`grant usage on schema demo to ${EMBED_ROLE}`);
    await c.query(`grant select on demo.orders to ${EMBED_ROLE}`);
    await c.query(
      `create policy orders_embed on demo.orders for select to ${EMBED_ROLE}
         using (customer = (select viewer_cache.viewer_attribute('customer')))`,
    );
  });
  // The server learns of the new role through NOTIFY: wait until an embed run resolves it.
  const probe = await link(key.privateJwk, { customer: 'probe' });
  await pollUntil(async () => (await embedRun(probe)).status === 200, 10_000);
});

afterAll(() => e2e.stop());

describe('embed-key CLI', () => {
  it('create prints a private JWK once; list shows kid, algorithm, dates and no key material', async () => {
    expect(key).toMatchObject({
      workspace: WS,
      kid: expect.stringMatching(/^ek_[0-9a-f]{16}$/),
      alg: 'EdDSA',
      audience: embedAudience(WS, '<app>'),
    });
    expect(key.privateJwk).toMatchObject({
      kty: 'OKP',
      crv: 'Ed25519',
      kid: key.kid,
      alg: 'EdDSA',
    });
    const list = await cliJson<Record<string, unknown>[]>(['embed-key', 'list']);
    expect(list).toEqual([
      {
        kid: key.kid,
        alg: 'EdDSA',
        label: 'host app',
        createdAt: expect.any(String),
        revokedAt: null,
      },
    ]);
    const human = await cli(['embed-key', 'list']);
    expect(human.stdout).toContain(key.kid);
    expect(human.stdout).toContain('active');
    for (const secret of privateParts) {
      expect(human.stdout + human.stderr + JSON.stringify(list)).not.toContain(secret);
    }
  });

  it('the server stores the public half only', async () => {
    const database = new URL(e2e.env['DATABASE_URL']!).pathname.slice(1);
    const rows = await asAdmin(database, (c) =>
      c.query<{ public_jwk: JWK }>('select public_jwk from viewer_cache_server.embed_key'),
    );
    expect(rows.rows).toHaveLength(2);
    for (const row of rows.rows) expect(row.public_jwk).not.toHaveProperty('d');
  });

  it('refuses a malformed or unknown kid on revoke', async () => {
    expect((await cli(['embed-key', 'revoke', 'ek_0000000000000000'])).code).toBe(1);
    expect((await cli(['embed-key', 'revoke', '../x'])).code).toBe(2);
  });
});

describe('embed links', () => {
  it('rows match the signed attribute; second run is a hit (header and ?token=)', async () => {
    const acme = await link(key.privateJwk, { customer: 'Acme GmbH' });
    const miss = await embedRun(acme);
    expectOk(miss, false);
    expect(customers(miss)).toEqual(['Acme GmbH']);
    const hit = await embedRun(acme, 'query');
    expectOk(hit, true);
    expect(hit.text.slice(hit.text.indexOf('"result"'))).toBe(
      miss.text.slice(miss.text.indexOf('"result"')),
    );
  });

  it('two embeds differing in one attribute never share an entry or rows', async () => {
    const globex = await link(key.privateJwk, { customer: 'Globex Inc' });
    const first = await embedRun(globex);
    expectOk(first, false);
    expect(customers(first)).toEqual(['Globex Inc']);
    expectOk(await embedRun(globex), true);
    // A fresh link for Acme (another token, same claims) is a hit on Acme's entry: the key holds
    // the verified claims, never the token.
    const acmeAgain = await link(key.privateJwk, { customer: 'Acme GmbH' });
    const hit = await embedRun(acmeAgain);
    expectOk(hit, true);
    expect(customers(hit)).toEqual(['Acme GmbH']);
  });

  it('an embed carrying a signed-in user’s email is not that user, and shares nothing with them', async () => {
    const asEmbed = await embedRun(
      await link(key.privateJwk, { customer: 'Initech SA' }, { email: 'alice@example.com' }),
    );
    expectOk(asEmbed, false);
    expect(customers(asEmbed)).toEqual(['Initech SA']);
  });

  it('refusals are 401 with a stable code, and never cached', async () => {
    const now = Math.floor(Date.now() / 1000);
    const signer = await importJWK(key.privateJwk, 'EdDSA');
    const expired = await new SignJWT({ attributes: { customer: 'Acme GmbH' } })
      .setProtectedHeader({ alg: 'EdDSA', kid: key.kid, typ: EMBED_TOKEN_TYPE })
      .setAudience(embedAudience(WS, APP))
      .setIssuedAt(now - 600)
      .setExpirationTime(now - 300)
      .sign(signer);
    links.push(expired);
    const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
    const none = `${b64({ alg: 'none', kid: key.kid, typ: EMBED_TOKEN_TYPE })}.${b64({
      aud: embedAudience(WS, APP),
      iat: now,
      exp: now + 600,
      attributes: { customer: 'Acme GmbH' },
    })}.`;
    const cases: [string, Answer, string][] = [
      ['no token', await embedRun(null), 'E_EMBED_INVALID'],
      ['garbage', await embedRun('not-a-jwt'), 'E_EMBED_INVALID'],
      ['alg none', await embedRun(none), 'E_EMBED_INVALID'],
      ['expired', await embedRun(expired), 'E_EMBED_EXPIRED'],
      [
        'another app',
        await embedRun(await link(key.privateJwk, { customer: 'x' }, { app: 'orders-public' })),
        'E_EMBED_AUDIENCE',
      ],
      [
        'signed for this app, used on another',
        await embedRun(await link(key.privateJwk, { customer: 'x' }), 'header', 'orders-public'),
        'E_EMBED_AUDIENCE',
      ],
      [
        "another workspace's key",
        await embedRun(await link(otherWorkspaceKey.privateJwk, { customer: 'x' })),
        'E_EMBED_INVALID',
      ],
      [
        'missing attributes',
        await embedRun(
          await new SignJWT({})
            .setProtectedHeader({ alg: 'EdDSA', kid: key.kid, typ: EMBED_TOKEN_TYPE })
            .setAudience(embedAudience(WS, APP))
            .setIssuedAt()
            .setExpirationTime('5m')
            .sign(signer),
        ),
        'E_EMBED_INVALID',
      ],
    ];
    for (const [what, answer, code] of cases) {
      expect(answer.status, what).toBe(401);
      expectRefused(answer, code);
    }
    // A token in the query and one in the header: the header wins; a bad query token alone fails.
    expect((await embedRun('x', 'query')).status).toBe(401);
  });

  it('a policy reading an attribute the link lacks: 403 E_NO_VIEWER_ATTRIBUTE, never cached', async () => {
    const bare = await link(key.privateJwk, {});
    for (let i = 0; i < 2; i++) {
      const answer = await embedRun(bare);
      expect(answer.status).toBe(403);
      expect(answer.json).toMatchObject({ error: { code: 'E_NO_VIEWER_ATTRIBUTE' } });
    }
  });

  it('rotate: the new key signs, the old one verifies until revoked; revoke reaches the server within 1 s', async () => {
    const rotated = await cliJson<Created>(['embed-key', 'rotate']);
    privateParts.push(rotated.privateJwk.d as string);
    expect(rotated.stillActive).toEqual([key.kid]);
    const oldLink = await link(key.privateJwk, { customer: 'Umbrella LLC' });
    const newLink = await link(rotated.privateJwk, { customer: 'Umbrella LLC' });
    expectOk(await embedRun(newLink), false);
    expectOk(await embedRun(oldLink), true);
    expect(await cliJson(['embed-key', 'revoke', key.kid])).toEqual({ revoked: key.kid });
    // From when the CLI returned (the revocation committed): the bound is 1 s (250 ms polls).
    const took = await pollUntil(async () => (await embedRun(oldLink)).status === 401, 1000);
    expect(took).toBeLessThanOrEqual(1000);
    expectRefused(await embedRun(oldLink), 'E_EMBED_REVOKED');
    expectOk(await embedRun(newLink), true);
    const list = await cliJson<{ kid: string; revokedAt: string | null }[]>(['embed-key', 'list']);
    expect(list.map((k) => [k.kid, k.revokedAt === null])).toEqual([
      [key.kid, false],
      [rotated.kid, true],
    ]);
  });

  it('no log line holds a link, a private key or the query string', async () => {
    await pollUntil(
      async () => e2e.server.lines.some((line) => line.includes('/embed/apps/:app/run')),
      5000,
    );
    const logs = e2e.server.lines.join('\n') + e2e.server.stderr;
    for (const token of links) expect(logs.includes(token), 'a link in the logs').toBe(false);
    for (const secret of privateParts) expect(logs).not.toContain(secret);
    expect(logs).not.toContain('token=');
    expectNoSecretsIn(secrets, logs, 'server logs');
  });
});
