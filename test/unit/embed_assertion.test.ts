import { createHmac } from 'node:crypto';
import { importJWK, type JWK, SignJWT } from 'jose';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  createEmbedKeyPair,
  createEmbedVerifier,
  EMBED_TOKEN_TYPE,
  type EmbedKey,
  type EmbedKeyPair,
  embedAudience,
  signEmbedAssertion,
} from '../../src/index.js';

// Verification of embed assertions: every refusal the issue lists, each with its stable code.

const WS = 'acme';
const APP = 'orders';

/** An in-memory key source, as the server's embed_key table would answer. */
class Keys {
  readonly byKid = new Map<string, EmbedKey>();
  add(pair: EmbedKeyPair, workspace = WS): void {
    this.byKid.set(`${workspace}/${pair.kid}`, {
      kid: pair.kid,
      alg: pair.alg,
      publicJwk: pair.publicJwk,
      revoked: false,
    });
  }
  revoke(pair: EmbedKeyPair): void {
    const key = this.byKid.get(`${WS}/${pair.kid}`)!;
    this.byKid.set(`${WS}/${pair.kid}`, { ...key, revoked: true });
  }
  embedKey(workspace: string, kid: string): EmbedKey | undefined {
    return this.byKid.get(`${workspace}/${kid}`);
  }
}

let ed: EmbedKeyPair;
let es: EmbedKeyPair;
let stranger: EmbedKeyPair;

beforeAll(async () => {
  [ed, es, stranger] = await Promise.all([
    createEmbedKeyPair(),
    createEmbedKeyPair('ES256'),
    createEmbedKeyPair(),
  ]);
});

function setup() {
  const keys = new Keys();
  keys.add(ed);
  keys.add(es);
  return { keys, verifier: createEmbedVerifier({ keys }) };
}

const claims = { workspace: WS, app: APP, attributes: { customer_id: 'c-17' } };

/** A token signed by hand with jose, for the cases signEmbedAssertion would never produce. */
async function handSigned(
  privateJwk: JWK,
  payload: Record<string, unknown>,
  header: Record<string, unknown> = {},
  audience: string = embedAudience(WS, APP),
): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT(payload)
    .setProtectedHeader({
      alg: privateJwk.alg!,
      kid: privateJwk.kid!,
      typ: EMBED_TOKEN_TYPE,
      ...header,
    })
    .setAudience(audience)
    .setIssuedAt(now)
    .setExpirationTime(now + 600)
    .sign(await importJWK(privateJwk, privateJwk.alg));
}

/** An assertion issued `iat` seconds from now that expires `exp` seconds from now. */
async function timed(iat: number, exp: number): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ attributes: {} })
    .setProtectedHeader({ alg: 'EdDSA', kid: ed.kid, typ: EMBED_TOKEN_TYPE })
    .setAudience(embedAudience(WS, APP))
    .setIssuedAt(now + iat)
    .setExpirationTime(now + exp)
    .sign(await importJWK(ed.privateJwk, 'EdDSA'));
}

const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');

describe('embed assertions that verify', () => {
  it('an EdDSA and an ES256 assertion give the signed attributes and email, canonical', async () => {
    const { verifier } = setup();
    const token = await signEmbedAssertion(ed.privateJwk, {
      ...claims,
      attributes: { z: '1', customer_id: 'c-17' },
      email: 'viewer@host.example',
    });
    const viewer = await verifier.verify(token, { workspace: WS, app: APP });
    expect(viewer).toEqual({
      app: APP,
      attributes: { customer_id: 'c-17', z: '1' },
      email: 'viewer@host.example',
    });
    expect(Object.keys(viewer.attributes)).toEqual(['customer_id', 'z']);
    expect(Object.isFrozen(viewer)).toBe(true);
    const es256 = await signEmbedAssertion(es.privateJwk, claims);
    await expect(verifier.verify(es256, { workspace: WS, app: APP })).resolves.toEqual({
      app: APP,
      attributes: { customer_id: 'c-17' },
      email: null,
    });
  });

  it('rotation: a new key verifies, and so does the old one until it is revoked', async () => {
    const { keys, verifier } = setup();
    const next = await createEmbedKeyPair();
    keys.add(next);
    const old = await signEmbedAssertion(ed.privateJwk, claims);
    const fresh = await signEmbedAssertion(next.privateJwk, claims);
    await expect(verifier.verify(fresh, { workspace: WS, app: APP })).resolves.toBeDefined();
    await expect(verifier.verify(old, { workspace: WS, app: APP })).resolves.toBeDefined();
    keys.revoke(ed);
    await expect(verifier.verify(old, { workspace: WS, app: APP })).rejects.toMatchObject({
      code: 'E_EMBED_REVOKED',
      status: 401,
    });
    await expect(verifier.verify(fresh, { workspace: WS, app: APP })).resolves.toBeDefined();
  });
});

describe('embed assertions that are refused, each with its code', () => {
  const refused = async (token: string, code: string, app = APP, workspace = WS) => {
    const { verifier } = setup();
    await expect(verifier.verify(token, { workspace, app })).rejects.toMatchObject({
      code,
      status: 401,
    });
  };

  it('expired: E_EMBED_EXPIRED (beyond the 30 s tolerance)', async () => {
    await refused(await timed(-120, -60), 'E_EMBED_EXPIRED');
  });

  it('within the clock tolerance: an assertion that expired 5 s ago still verifies', async () => {
    const { verifier } = setup();
    await expect(
      verifier.verify(await timed(-60, -5), { workspace: WS, app: APP }),
    ).resolves.toBeDefined();
  });

  it('older than maxLifetime, whatever its exp says: E_EMBED_EXPIRED', async () => {
    await refused(await timed(-3 * 86400, 3600), 'E_EMBED_EXPIRED');
  });

  it('issued in the future beyond the tolerance: E_EMBED_INVALID', async () => {
    await refused(await timed(600, 1200), 'E_EMBED_INVALID');
  });

  it('another app or another workspace: E_EMBED_AUDIENCE', async () => {
    const token = await signEmbedAssertion(ed.privateJwk, claims);
    await refused(token, 'E_EMBED_AUDIENCE', 'billing');
    // Same kid registered in the other workspace too: the audience still refuses it.
    const keys = new Keys();
    keys.add(ed, 'other');
    const verifier = createEmbedVerifier({ keys });
    await expect(verifier.verify(token, { workspace: 'other', app: APP })).rejects.toMatchObject({
      code: 'E_EMBED_AUDIENCE',
    });
  });

  it('a key of another workspace is unknown here: E_EMBED_INVALID', async () => {
    const keys = new Keys();
    keys.add(ed, 'other');
    const verifier = createEmbedVerifier({ keys });
    const token = await signEmbedAssertion(ed.privateJwk, claims);
    await expect(verifier.verify(token, { workspace: WS, app: APP })).rejects.toMatchObject({
      code: 'E_EMBED_INVALID',
    });
  });

  it('alg none (with and without a kid): E_EMBED_INVALID', async () => {
    const now = Math.floor(Date.now() / 1000);
    const payload = b64({
      aud: embedAudience(WS, APP),
      iat: now,
      exp: now + 600,
      attributes: { customer_id: 'c-17' },
    });
    for (const header of [
      { alg: 'none', kid: ed.kid, typ: EMBED_TOKEN_TYPE },
      { alg: 'none', typ: 'JWT' },
      { alg: 'NONE', kid: ed.kid, typ: EMBED_TOKEN_TYPE },
    ]) {
      await refused(`${b64(header)}.${payload}.`, 'E_EMBED_INVALID');
    }
  });

  it('signed by another key under a known kid: E_EMBED_INVALID', async () => {
    const forged = await signEmbedAssertion({ ...stranger.privateJwk, kid: ed.kid }, claims);
    await refused(forged, 'E_EMBED_INVALID');
  });

  it('an unknown kid, or none: E_EMBED_INVALID', async () => {
    await refused(await signEmbedAssertion(stranger.privateJwk, claims), 'E_EMBED_INVALID');
    const noKid = await handSigned(ed.privateJwk, { attributes: {} }, { kid: undefined });
    await refused(noKid, 'E_EMBED_INVALID');
  });

  it('HS256 keyed with the public key (algorithm confusion): E_EMBED_INVALID', async () => {
    const now = Math.floor(Date.now() / 1000);
    const head = b64({ alg: 'HS256', kid: ed.kid, typ: EMBED_TOKEN_TYPE });
    const body = b64({ aud: embedAudience(WS, APP), iat: now, exp: now + 600, attributes: {} });
    const mac = createHmac('sha256', JSON.stringify(ed.publicJwk))
      .update(`${head}.${body}`)
      .digest('base64url');
    await refused(`${head}.${body}.${mac}`, 'E_EMBED_INVALID');
  });

  it('an ES256 header on an EdDSA key: E_EMBED_INVALID', async () => {
    const token = await handSigned(es.privateJwk, { attributes: {} }, { kid: ed.kid });
    await refused(token, 'E_EMBED_INVALID');
  });

  it('a wrong or missing typ: E_EMBED_INVALID', async () => {
    await refused(
      await handSigned(ed.privateJwk, { attributes: {} }, { typ: 'JWT' }),
      'E_EMBED_INVALID',
    );
    await refused(
      await handSigned(ed.privateJwk, { attributes: {} }, { typ: undefined }),
      'E_EMBED_INVALID',
    );
  });

  it('malformed tokens: E_EMBED_INVALID', async () => {
    const good = await signEmbedAssertion(ed.privateJwk, claims);
    const [h, p, s] = good.split('.');
    for (const token of [
      '',
      'x',
      'a.b.c',
      `${h}.${p}`,
      `${h}.${p}.${s}.x`,
      `${h}.${p}.${s!.slice(0, -2)}`,
      `${h}.${b64({ ...JSON.parse(Buffer.from(p!, 'base64url').toString()), attributes: { customer_id: 'c-18' } })}.${s}`,
      'x'.repeat(9000),
    ]) {
      await refused(token, 'E_EMBED_INVALID');
    }
  });

  it('missing or ill-typed attributes, or an ill-typed email: E_EMBED_INVALID', async () => {
    for (const payload of [
      {},
      { attributes: null },
      { attributes: [] },
      { attributes: 'customer_id=1' },
      { attributes: { customer_id: 17 } },
      { attributes: { customer_id: null } },
      { attributes: { customer_id: { nested: 'x' } } },
      { attributes: { 'customer id': 'x' } },
      { attributes: { customer_id: 'x'.repeat(1025) } },
      { attributes: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`a${i}`, 'x'])) },
      { attributes: {}, email: 17 },
      { attributes: {}, email: '' },
      { attributes: {}, email: 'a b@example.com' },
    ]) {
      await refused(await handSigned(ed.privateJwk, payload), 'E_EMBED_INVALID');
    }
  });

  it('refusal messages never quote the token or its claims', async () => {
    const { verifier } = setup();
    const token = await handSigned(ed.privateJwk, {
      attributes: { customer_id: 'secret-customer-42' },
      email: 'bad email@example.com',
    });
    const err = await verifier.verify(token, { workspace: WS, app: APP }).catch((e: Error) => e);
    expect((err as Error).message).not.toContain('secret-customer-42');
    expect((err as Error).message).not.toContain('bad email');
    expect((err as Error).message).not.toContain(token);
  });
});
