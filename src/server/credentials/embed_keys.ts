import type pg from 'pg';
import {
  createEmbedKeyPair,
  EMBED_ALGORITHMS,
  type EmbedAlgorithm,
  type EmbedKey,
  type EmbedKeyPair,
  type EmbedKeySource,
  type Logger,
} from '../../index.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';
import { RevocableCache } from './revocable_cache.js';
import { revokeCredentials } from './revoke.js';

/** An embed key as `embed-key list` shows it: never key material. */
export interface EmbedKeyInfo {
  readonly kid: string;
  readonly alg: EmbedAlgorithm;
  readonly label: string | null;
  readonly createdAt: string;
  readonly revokedAt: string | null;
}

const KID_RE = /^[A-Za-z0-9_-]{1,64}$/;

export interface RawEmbedKeysOptions {
  /**
   * Longest a revoked key may still verify in this process (ms), as for API tokens: lookups are
   * cached, a poll of the shared revocation generation clears the cache when it moves, and
   * while no poll has confirmed it for this long every lookup goes to Postgres. @default 1000
   */
  maxStaleMs?: number;
  logger?: Logger;
}

/**
 * The embed keys of every workspace, in the server's schema (`embed_key`): public halves only.
 * Verifying a link costs no database round trip once its key is cached; a revocation reaches
 * every process within `maxStaleMs`, through the same generation API-token revocations bump.
 */
export class EmbedKeys implements EmbedKeySource {
  readonly #pool: pg.Pool;
  readonly #lookups: RevocableCache<EmbedKey>;

  constructor(pool: pg.Pool, options: RawEmbedKeysOptions = {}) {
    this.#pool = pool;
    this.#lookups = new RevocableCache(pool, { ...options, what: 'embed keys' });
  }

  /** Starts polling the revocation generation (a quarter of `maxStaleMs` apart). */
  start(): Promise<void> {
    return this.#lookups.start();
  }

  stop(): void {
    this.#lookups.stop();
  }

  /**
   * A new key for `workspace`. Only the public half is stored; the returned pair's private
   * JWK is for the host, shown once.
   */
  async create(
    workspace: string,
    alg: EmbedAlgorithm = 'EdDSA',
    label: string | null = null,
  ): Promise<EmbedKeyPair> {
    const pair = await createEmbedKeyPair(alg);
    await this.#pool.query(
      `insert into ${SERVER_SCHEMA}.embed_key (workspace, kid, alg, public_jwk, label)
       values ($1, $2, $3, $4, $5)`,
      [workspace, pair.kid, pair.alg, JSON.stringify(pair.publicJwk), label],
    );
    return pair;
  }

  /** The keys of `workspace`, oldest first, revoked ones included. */
  async list(workspace: string): Promise<EmbedKeyInfo[]> {
    const { rows } = await this.#pool.query<{
      kid: string;
      alg: EmbedAlgorithm;
      label: string | null;
      created_at: Date;
      revoked_at: Date | null;
    }>(
      `select kid, alg, label, created_at, revoked_at from ${SERVER_SCHEMA}.embed_key
        where workspace = $1 order by created_at, kid`,
      [workspace],
    );
    return rows.map((row) => ({
      kid: row.kid,
      alg: row.alg,
      label: row.label,
      createdAt: row.created_at.toISOString(),
      revokedAt: row.revoked_at?.toISOString() ?? null,
    }));
  }

  /**
   * Revokes key `kid` of `workspace` and bumps the revocation generation in the same
   * transaction. False when there is no such live key.
   */
  async revoke(workspace: string, kid: string): Promise<boolean> {
    if (!KID_RE.test(kid)) throw new TypeError('a key id is what `embed-key list` shows');
    const revoked = await revokeCredentials(this.#pool, {
      table: 'embed_key',
      action: 'stamp',
      where: 'workspace = $1 and kid = $2',
      params: [workspace, kid],
    });
    return revoked > 0;
  }

  async embedKey(workspace: string, kid: string): Promise<EmbedKey | undefined> {
    if (!KID_RE.test(kid)) return undefined;
    const key = `${workspace}\0${kid}`;
    const found = await this.#lookups.get(key, async () => {
      const { rows } = await this.#pool.query<{
        alg: string;
        public_jwk: EmbedKey['publicJwk'];
        revoked: boolean;
      }>(
        `select alg, public_jwk, revoked_at is not null as revoked
           from ${SERVER_SCHEMA}.embed_key where workspace = $1 and kid = $2`,
        [workspace, kid],
      );
      const row = rows[0];
      const found: EmbedKey | undefined =
        row === undefined || !EMBED_ALGORITHMS.includes(row.alg as EmbedAlgorithm)
          ? undefined
          : Object.freeze({
              kid,
              alg: row.alg as EmbedAlgorithm,
              publicJwk: row.public_jwk,
              revoked: row.revoked,
            });
      return found ?? null;
    });
    return found ?? undefined;
  }
}
