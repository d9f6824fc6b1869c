import {
  type CryptoKey,
  importJWK,
  type JWK,
  type JWTPayload,
  type JWTVerifyGetKey,
  errors as jose,
  jwtVerify,
} from 'jose';
import { type Duration, resolveDuration } from '../duration.js';
import { canonicalEmbedViewer, EMBED_APP_RE, type EmbedViewer } from '../embed_viewer.js';
import {
  EmbedAudienceError,
  EmbedExpiredError,
  EmbedInvalidError,
  EmbedRevokedError,
  InvalidJobError,
  ViewerCacheError,
} from '../errors.js';
import { WORKSPACE_RE } from '../job.js';

/**
 * The algorithms an embed key may use. Asymmetric only: the server keeps the public half, so
 * nobody who reads its database (or its logs, or a backup) can sign a viewer. `none`, HMAC and
 * RSA are refused before any key is looked up.
 */
export const EMBED_ALGORITHMS = ['EdDSA', 'ES256'] as const;
export type EmbedAlgorithm = (typeof EMBED_ALGORITHMS)[number];

/** The `typ` header an embed assertion must carry (explicit typing, RFC 8725 §3.11). */
export const EMBED_TOKEN_TYPE = 'vc-embed+jwt';

/** The `aud` of an assertion for `app` of `workspace`: another workspace or app never matches. */
export function embedAudience(workspace: string, app: string): string {
  return `viewer-cache:embed:${workspace}/${app}`;
}

/** A workspace's embed key as a verifier needs it: the public JWK, and whether it is revoked. */
export interface EmbedKey {
  readonly kid: string;
  readonly alg: EmbedAlgorithm;
  /** Public key only (`kty`, `crv`, `x`[, `y`]). */
  readonly publicJwk: JWK;
  readonly revoked: boolean;
}

/** Where a verifier finds a workspace's keys (the reference server: its own schema). */
export interface EmbedKeySource {
  /** The key `kid` of `workspace`, revoked ones included; `undefined` when there is none. */
  embedKey(workspace: string, kid: string): Promise<EmbedKey | undefined> | EmbedKey | undefined;
}

export interface RawEmbedVerifierOptions {
  keys: EmbedKeySource;
  /** Clock skew allowed on `exp`, `nbf` and `iat`. @default '30s' */
  clockTolerance?: Duration;
  /**
   * Oldest an assertion may be (from its `iat`), whatever its `exp` says: a link leaked long
   * after it was signed stops working. @default '24h'
   */
  maxLifetime?: Duration;
}

export interface EmbedVerifier {
  /**
   * The embed viewer a token stands for, if it was signed by a live key of `workspace` for
   * `app`. Never logs or keeps the token.
   * @throws {EmbedInvalidError | EmbedExpiredError | EmbedAudienceError | EmbedRevokedError}
   */
  verify(token: string, audience: { workspace: string; app: string }): Promise<EmbedViewer>;
}

/** Longest token accepted: a link with a few attributes is well under 2 KiB. */
const MAX_TOKEN_LENGTH = 8192;
const KID_RE = /^[A-Za-z0-9_-]{1,64}$/;
const MAX_EMAIL_LENGTH = 320;

/**
 * Verifies embed assertions with `jose` (no hand-rolled JWT parsing). An assertion is a JWS
 * compact JWT with header `{ alg: EdDSA|ES256, kid, typ: 'vc-embed+jwt' }` and claims
 * `{ aud: embedAudience(workspace, app), exp, iat, attributes: { name: string }, email? }`.
 */
export function createEmbedVerifier(options: RawEmbedVerifierOptions): EmbedVerifier {
  if (options === null || typeof options !== 'object') throw new TypeError('options are required');
  const { keys } = options;
  if (typeof keys?.embedKey !== 'function') {
    throw new TypeError('keys must have an embedKey(workspace, kid) method');
  }
  const toleranceS = resolveDuration(options.clockTolerance ?? '30s', 'clockTolerance') / 1000;
  const maxLifetimeS = resolveDuration(options.maxLifetime ?? '24h', 'maxLifetime') / 1000;
  if (!(maxLifetimeS > 0)) throw new TypeError('maxLifetime must be greater than 0');
  /** Imported public keys, per key record (a new record after a reload imports again). */
  const imported = new WeakMap<EmbedKey, Promise<CryptoKey | Uint8Array>>();

  return {
    async verify(token, { workspace, app }) {
      if (!WORKSPACE_RE.test(workspace) || !EMBED_APP_RE.test(app)) {
        throw new EmbedAudienceError();
      }
      if (typeof token !== 'string' || token.length === 0 || token.length > MAX_TOKEN_LENGTH) {
        throw new EmbedInvalidError('an embed link needs its token');
      }
      const getKey: JWTVerifyGetKey = async (header) => {
        const kid = header.kid;
        if (typeof kid !== 'string' || !KID_RE.test(kid)) {
          throw new EmbedInvalidError('the embed token names no key (kid)');
        }
        const key = await keys.embedKey(workspace, kid);
        if (key === undefined) throw new EmbedInvalidError('the embed token names an unknown key');
        if (key.revoked) throw new EmbedRevokedError();
        // A key verifies only under its own algorithm (no ES256 key read as anything else).
        if (header.alg !== key.alg) {
          throw new EmbedInvalidError('the embed token is not signed with its key’s algorithm');
        }
        let cryptoKey = imported.get(key);
        if (cryptoKey === undefined) {
          cryptoKey = importJWK(key.publicJwk, key.alg);
          imported.set(key, cryptoKey);
        }
        return cryptoKey;
      };
      let payload: JWTPayload;
      try {
        ({ payload } = await jwtVerify(token, getKey, {
          algorithms: [...EMBED_ALGORITHMS],
          typ: EMBED_TOKEN_TYPE,
          audience: embedAudience(workspace, app),
          clockTolerance: toleranceS,
          maxTokenAge: maxLifetimeS,
          requiredClaims: ['exp', 'iat'],
        }));
      } catch (err) {
        throw refusalOf(err);
      }
      return viewerOf(payload, app);
    },
  };
}

/** A jose failure as one of the four embed codes; our own refusals pass as they are. */
function refusalOf(err: unknown): ViewerCacheError {
  if (err instanceof ViewerCacheError) return err;
  if (err instanceof jose.JWTExpired) return new EmbedExpiredError(undefined, { cause: err });
  if (err instanceof jose.JWTClaimValidationFailed && err.claim === 'aud') {
    return new EmbedAudienceError(undefined, { cause: err });
  }
  if (err instanceof jose.JOSEAlgNotAllowed) {
    return new EmbedInvalidError('the embed token is signed with an algorithm not accepted', {
      cause: err,
    });
  }
  if (err instanceof jose.JWSSignatureVerificationFailed) {
    return new EmbedInvalidError('the embed token’s signature does not verify', { cause: err });
  }
  if (err instanceof jose.JWTClaimValidationFailed) {
    // The claim's name is ours to show; its value (the host's data) is not.
    return new EmbedInvalidError(`the embed token’s "${err.claim}" claim is not valid`, {
      cause: err,
    });
  }
  return new EmbedInvalidError(undefined, { cause: err });
}

/** The verified claims as an embed viewer; anything missing or ill-typed is refused. */
function viewerOf(payload: JWTPayload, app: string): EmbedViewer {
  const { attributes, email } = payload as { attributes?: unknown; email?: unknown };
  if (attributes === undefined) {
    throw new EmbedInvalidError('the embed token carries no "attributes" claim');
  }
  if (
    email !== undefined &&
    (typeof email !== 'string' ||
      email.length === 0 ||
      email.length > MAX_EMAIL_LENGTH ||
      /[\s\p{C}]/u.test(email))
  ) {
    throw new EmbedInvalidError('the embed token’s "email" claim is not an email');
  }
  try {
    return canonicalEmbedViewer({ app, attributes, email: email ?? null });
  } catch (err) {
    if (!(err instanceof InvalidJobError)) throw err;
    throw new EmbedInvalidError(`the embed token’s attributes are not valid: ${err.message}`);
  }
}
