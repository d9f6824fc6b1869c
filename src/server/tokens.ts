import { createHash, createHmac, randomBytes } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import type pg from 'pg';
import type { Job, JobPerms, JobTokenIssuer } from '../index.js';

/** Who a bearer token belongs to. */
export interface TokenIdentity {
  readonly workspace: string;
  readonly email: string;
}

const TOKEN_PREFIX = 'vct_';
const JOB_TOKEN_PREFIX = 'vcj_';

function digest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}

/**
 * Bearer tokens of people, stored as SHA-256 only (`viewer_cache.api_token`). Lookups are cached
 * in process for `cacheMs`, so an authenticated cache hit costs no database round trip.
 */
export class ApiTokens {
  readonly #pool: pg.Pool;
  readonly #cache: LRUCache<string, TokenIdentity | false>;

  constructor(pool: pg.Pool, cacheMs = 30_000) {
    this.#pool = pool;
    this.#cache = new LRUCache({ max: 10_000, ttl: cacheMs });
  }

  /** Creates a token for `email`; the plain token is returned once and never stored. */
  async create(workspace: string, email: string, label: string | null = null): Promise<string> {
    const token = TOKEN_PREFIX + randomBytes(32).toString('base64url');
    await this.store(workspace, email, token, label);
    return token;
  }

  /** Records `token` (idempotent): used for the demo's derived tokens. */
  async store(
    workspace: string,
    email: string,
    token: string,
    label: string | null,
  ): Promise<void> {
    await this.#pool.query(
      `insert into viewer_cache.api_token (token_hash, workspace, email, label) values ($1, $2, $3, $4)
       on conflict (token_hash) do nothing`,
      [digest(token), workspace, email, label],
    );
  }

  /** The identity behind `token`, or null. */
  async verify(token: string): Promise<TokenIdentity | null> {
    if (!token.startsWith(TOKEN_PREFIX) || token.length > 100) return null;
    const key = digest(token).toString('base64');
    const cached = this.#cache.get(key);
    if (cached !== undefined) return cached === false ? null : cached;
    const { rows } = await this.#pool.query<TokenIdentity>(
      'select workspace, email from viewer_cache.api_token where token_hash = $1',
      [digest(token)],
    );
    const found = rows[0] ?? null;
    this.#cache.set(key, found ?? false);
    return found;
  }
}

/** A deterministic demo token for `email`, derived from the server's secret key. */
export function demoToken(secretKey: string, email: string): string {
  return (
    TOKEN_PREFIX + createHmac('sha256', secretKey).update(`demo-token:${email}`).digest('base64url')
  );
}

/** What a job token stands for: the job's workspace and perms. */
export interface JobTokenGrant {
  readonly workspace: string;
  readonly perms: JobPerms;
}

/**
 * Tokens that let a running job start children through the API as itself (job-token origin).
 * Held in memory, valid only while the job runs: a token that ends up in a cached result is
 * already dead.
 */
export class JobTokens implements JobTokenIssuer {
  readonly #byHash = new Map<string, JobTokenGrant>();
  readonly #byJob = new Map<string, string>();

  issue(job: Job): string {
    const token = JOB_TOKEN_PREFIX + randomBytes(32).toString('base64url');
    const hash = digest(token).toString('base64');
    this.#byHash.set(hash, { workspace: job.workspace, perms: job.perms });
    this.#byJob.set(job.id, hash);
    return token;
  }

  revoke(job: Job): void {
    const hash = this.#byJob.get(job.id);
    if (hash === undefined) return;
    this.#byJob.delete(job.id);
    this.#byHash.delete(hash);
  }

  verify(token: string): JobTokenGrant | null {
    if (!token.startsWith(JOB_TOKEN_PREFIX)) return null;
    return this.#byHash.get(digest(token).toString('base64')) ?? null;
  }
}
