import { randomBytes } from 'node:crypto';
import { exportJWK, generateKeyPair, importJWK, type JWK, SignJWT } from 'jose';
import { type Duration, resolveDuration } from '../duration.js';
import {
  EMBED_ALGORITHMS,
  EMBED_TOKEN_TYPE,
  type EmbedAlgorithm,
  embedAudience,
} from './embed_assertion.js';

/** A new embed key: the public half for the server, the private half for the host (once). */
export interface EmbedKeyPair {
  readonly kid: string;
  readonly alg: EmbedAlgorithm;
  readonly publicJwk: JWK;
  /** The signing key, as a JWK with `kid` and `alg` set. Give it to the host; never store it. */
  readonly privateJwk: JWK;
}

/** Generates an embed key pair with a random `kid` (`ek_` + 16 hex digits). */
export async function createEmbedKeyPair(alg: EmbedAlgorithm = 'EdDSA'): Promise<EmbedKeyPair> {
  if (!EMBED_ALGORITHMS.includes(alg)) {
    throw new TypeError(`alg must be one of ${EMBED_ALGORITHMS.join(', ')}`);
  }
  const kid = `ek_${randomBytes(8).toString('hex')}`;
  const { publicKey, privateKey } = await generateKeyPair(alg, {
    ...(alg === 'EdDSA' ? { crv: 'Ed25519' } : {}),
    extractable: true,
  });
  const publicJwk = await exportJWK(publicKey);
  const privateJwk = await exportJWK(privateKey);
  return {
    kid,
    alg,
    publicJwk: { kty: publicJwk.kty, crv: publicJwk.crv, x: publicJwk.x, ...onlyY(publicJwk) },
    privateJwk: { ...privateJwk, kid, alg },
  };
}

function onlyY(jwk: JWK): { y?: string } {
  return jwk.y === undefined ? {} : { y: jwk.y };
}

/** What a host signs for one viewer of one app. */
export interface EmbedClaims {
  readonly workspace: string;
  readonly app: string;
  /** Attributes policies read with `viewer_cache.viewer_attribute(name)`; string values. */
  readonly attributes: Readonly<Record<string, string>>;
  readonly email?: string;
  /** How long the link works. @default '15m' */
  readonly expiresIn?: Duration;
}

/**
 * Signs an embed assertion with a key from {@link createEmbedKeyPair} (for hosts on Node; any
 * JOSE library can make the same token: see docs/embed-viewers.md). The private JWK carries
 * `kid`, `alg`.
 */
export async function signEmbedAssertion(privateJwk: JWK, claims: EmbedClaims): Promise<string> {
  const { kid, alg } = privateJwk;
  if (typeof kid !== 'string' || !EMBED_ALGORITHMS.includes(alg as EmbedAlgorithm)) {
    throw new TypeError('privateJwk must carry the kid and alg that createEmbedKeyPair gave it');
  }
  const key = await importJWK(privateJwk, alg);
  const now = Math.floor(Date.now() / 1000);
  const lifetimeS = Math.ceil(resolveDuration(claims.expiresIn ?? '15m', 'expiresIn') / 1000);
  return new SignJWT({
    attributes: { ...claims.attributes },
    ...(claims.email === undefined ? {} : { email: claims.email }),
  })
    .setProtectedHeader({ alg: alg as string, kid, typ: EMBED_TOKEN_TYPE })
    .setAudience(embedAudience(claims.workspace, claims.app))
    .setIssuedAt(now)
    .setExpirationTime(now + lifetimeS)
    .sign(key);
}
