import * as crypto from 'node:crypto';
import type pg from 'pg';
import type { Job, JobPerms, JobTokenIssuer, Logger, RunningJobs } from '../../index.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';
import { RevocableCache } from './revocable_cache.js';
import { revokeCredentials } from './revoke.js';

/** Who a bearer token belongs to. */
export interface TokenIdentity {
  readonly workspace: string;
  readonly email: string;
  /**
   * A scoped token's role scope (catalog ids, sorted): runs made with it hold at most the
   * owner's roles ∩ these (`JobRequest.roleScope`). Absent: the owner's full roles.
   */
  readonly roleScope?: readonly number[];
}

/** A stored token as `token list` shows it: never the token, only a prefix of its hash. */
export interface TokenInfo {
  /** The first 12 hex digits of the token's SHA-256: enough to name it in `token revoke`. */
  readonly id: string;
  readonly email: string;
  readonly label: string | null;
  readonly createdAt: string;
  /** The catalog ids the token is scoped to, or null when it is not scoped. */
  readonly roleScope: readonly number[] | null;
}

const TOKEN_PREFIX = 'vct_';
const JOB_TOKEN_PREFIX = 'vcj_';
const TOKEN_ID_RE = /^[0-9a-f]{8,64}$/;

// One-shot `crypto.hash` (Node ≥ 20.12) costs 0.25 µs for a token against 0.9 µs for
// createHash().update().digest(): cheap enough to key the identity cache by the digest on every
// request, so the cache never holds a raw token (a map keyed by the token itself would keep up to
// `max` live credentials in the heap to save a quarter of a microsecond).
const oneShot = (crypto as { hash?: (alg: string, data: string, enc: 'base64') => string }).hash;
function digestBase64(token: string): string {
  return oneShot !== undefined
    ? oneShot('sha256', token, 'base64')
    : crypto.createHash('sha256').update(token).digest('base64');
}

export interface RawApiTokensOptions {
  /**
   * Longest a revoked token may still be accepted by this process (ms). Lookups are cached; a
   * poll of the revocation generation clears the cache when it moves, and when the poll has not
   * confirmed the generation for this long the cache is not trusted (every lookup goes to
   * Postgres, and fails closed if Postgres does not answer). @default 1000
   */
  maxStaleMs?: number;
  logger?: Logger;
}

/**
 * Bearer tokens of people, stored as SHA-256 only (`viewer_cache_server.api_token`). Lookups are
 * cached in process, so an authenticated cache hit costs no database round trip; revocation
 * reaches every process within `maxStaleMs` (see the option).
 */
export class ApiTokens {
  readonly #pool: pg.Pool;
  readonly #lookups: RevocableCache<TokenIdentity>;

  constructor(pool: pg.Pool, options: RawApiTokensOptions = {}) {
    this.#pool = pool;
    this.#lookups = new RevocableCache(pool, { ...options, what: 'tokens' });
  }

  /** Starts polling the revocation generation (a quarter of `maxStaleMs` apart). */
  start(): Promise<void> {
    return this.#lookups.start();
  }

  stop(): void {
    this.#lookups.stop();
  }

  /**
   * Creates a token for `email`, scoped to the roles whose catalog ids `roleScope` lists (a
   * non-empty list), or unscoped; the plain token is returned once and never stored.
   */
  async create(
    workspace: string,
    email: string,
    label: string | null = null,
    roleScope?: readonly number[],
  ): Promise<string> {
    const token = TOKEN_PREFIX + crypto.randomBytes(32).toString('base64url');
    await this.store(workspace, email, token, label, roleScope);
    return token;
  }

  /** Records `token` (idempotent): used for the demo's derived tokens. */
  async store(
    workspace: string,
    email: string,
    token: string,
    label: string | null,
    roleScope?: readonly number[],
  ): Promise<void> {
    if (
      roleScope !== undefined &&
      (roleScope.length === 0 || !roleScope.every((id) => Number.isInteger(id) && id > 0))
    ) {
      // An empty scope is "no roles", not "unscoped": refused rather than stored as either.
      throw new TypeError('a role scope is a non-empty list of role catalog ids');
    }
    const scope = roleScope === undefined ? null : [...new Set(roleScope)].sort((a, b) => a - b);
    await this.#pool.query(
      `insert into ${SERVER_SCHEMA}.api_token (token_hash, workspace, email, label, role_scope)
       values ($1, $2, $3, $4, $5) on conflict (token_hash) do nothing`,
      [Buffer.from(digestBase64(token), 'base64'), workspace, email, label, scope],
    );
  }

  /** The tokens of `workspace`, oldest first. */
  async list(workspace: string): Promise<TokenInfo[]> {
    const { rows } = await this.#pool.query<{
      id: string;
      email: string;
      label: string | null;
      created_at: Date;
      role_scope: number[] | null;
    }>(
      `select encode(token_hash, 'hex') as id, email, label, created_at,
              to_json(role_scope) as role_scope
         from ${SERVER_SCHEMA}.api_token where workspace = $1 order by created_at, token_hash`,
      [workspace],
    );
    return rows.map((row) => ({
      id: row.id.slice(0, 12),
      email: row.email,
      label: row.label,
      createdAt: row.created_at.toISOString(),
      roleScope: row.role_scope,
    }));
  }

  /**
   * Deletes the tokens of `workspace` whose id (hash prefix, ≥ 8 hex digits) or user matches,
   * and bumps the revocation generation in the same transaction. Returns how many went.
   */
  async revoke(workspace: string, which: { id: string } | { email: string }): Promise<number> {
    if ('id' in which && !TOKEN_ID_RE.test(which.id)) {
      throw new TypeError('a token id is 8 to 64 hex digits, as `token list` shows it');
    }
    // A short id could name several tokens: revoke exactly one, or none.
    return revokeCredentials(this.#pool, {
      table: 'api_token',
      action: 'delete',
      ...('id' in which
        ? {
            where: `workspace = $1 and starts_with(encode(token_hash, 'hex'), $2)`,
            params: [workspace, which.id],
            oneRow: true,
          }
        : { where: 'workspace = $1 and email = $2', params: [workspace, which.email] }),
    });
  }

  /** The identity behind `token`, or null. */
  async verify(token: string): Promise<TokenIdentity | null> {
    if (!token.startsWith(TOKEN_PREFIX) || token.length > 100) return null;
    const key = digestBase64(token);
    return this.#lookups.get(key, async () => {
      const { rows } = await this.#pool.query<{
        workspace: string;
        email: string;
        role_scope: number[] | null;
      }>(
        `select workspace, email, to_json(role_scope) as role_scope
           from ${SERVER_SCHEMA}.api_token where token_hash = $1`,
        [Buffer.from(key, 'base64')],
      );
      // The scope is part of the cached identity: one lookup answers who and how narrowly.
      const row = rows[0];
      const found: TokenIdentity | null =
        row === undefined
          ? null
          : Object.freeze({
              workspace: row.workspace,
              email: row.email,
              ...(row.role_scope === null ? {} : { roleScope: Object.freeze(row.role_scope) }),
            });
      return found;
    });
  }
}

/** A deterministic demo token for `email`, derived from the server's secret key. */
export function demoToken(secretKey: string, email: string): string {
  return (
    TOKEN_PREFIX +
    crypto.createHmac('sha256', secretKey).update(`demo-token:${email}`).digest('base64url')
  );
}

/** What a job token stands for: the job's workspace and perms, and the job itself. */
export interface JobTokenGrant {
  readonly workspace: string;
  readonly perms: JobPerms;
  /** The job as the server recorded it: what the query proxy runs statements for. */
  readonly job: Job;
}

/**
 * Tokens that let a running job start children through the API as itself (job-token origin).
 * Held in memory, valid only while the job runs: a token that ends up in a cached result is
 * already dead.
 */
export class JobTokens implements JobTokenIssuer, RunningJobs {
  readonly #byHash = new Map<string, JobTokenGrant>();
  readonly #byJob = new Map<string, string>();
  readonly #revoked: ((job: Job) => void)[] = [];

  /** Told of every job whose token dies (it ended): the query proxy rolls its transactions back. */
  onRevoke(listener: (job: Job) => void): void {
    this.#revoked.push(listener);
  }

  issue(job: Job): string {
    const token = JOB_TOKEN_PREFIX + crypto.randomBytes(32).toString('base64url');
    const hash = digestBase64(token);
    this.#byHash.set(hash, { workspace: job.workspace, perms: job.perms, job });
    this.#byJob.set(job.id, hash);
    return token;
  }

  revoke(job: Job): void {
    const hash = this.#byJob.get(job.id);
    if (hash === undefined) return;
    this.#byJob.delete(job.id);
    const grant = this.#byHash.get(hash);
    this.#byHash.delete(hash);
    if (grant !== undefined) for (const listener of this.#revoked) listener(grant.job);
  }

  verify(token: string): JobTokenGrant | null {
    if (!token.startsWith(JOB_TOKEN_PREFIX) || token.length > 100) return null;
    return this.#byHash.get(digestBase64(token)) ?? null;
  }

  /** The running job `token` stands for (the query proxy's {@link RunningJobs}). */
  jobOfToken(token: string): Job | null {
    return this.verify(token)?.job ?? null;
  }
}
