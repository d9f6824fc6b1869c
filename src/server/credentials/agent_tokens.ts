import * as crypto from 'node:crypto';
import type pg from 'pg';
import type { Logger } from '../../index.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';
import { RevocableCache } from './revocable_cache.js';
import { revokeCredentials } from './revoke.js';

/** Who an agent token belongs to: a worker group of one workspace. */
export interface AgentIdentity {
  /** The token's id (first 12 hex digits of its SHA-256): which agent holds a job. */
  readonly id: string;
  readonly workspace: string;
  readonly group: string;
}

/** A stored agent token as `agent-token list` shows it (never the token). */
export interface AgentTokenInfo {
  readonly id: string;
  readonly group: string;
  readonly label: string | null;
  readonly createdAt: string;
}

const AGENT_TOKEN_PREFIX = 'vca_';
const TOKEN_ID_RE = /^[0-9a-f]{8,64}$/;
/** A worker group name: short, lowercase, safe in a log line and a URL. */
export const GROUP_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

function digest(token: string): Buffer {
  return crypto.createHash('sha256').update(token).digest();
}

/**
 * Bearer tokens of agent workers (`viewer_cache_server.agent_token`), stored as SHA-256 only
 * and revocable like API tokens: lookups are cached in process and dropped when the shared
 * revocation generation moves, so a revoked agent is refused by every server within
 * `maxStaleMs`. An agent token is not a person's: it names no user and grants no viewer; it
 * lets an agent take its group's jobs, each of which carries its own recorded viewer.
 */
export class AgentTokens {
  readonly #pool: pg.Pool;
  readonly #lookups: RevocableCache<AgentIdentity>;

  constructor(pool: pg.Pool, options: { maxStaleMs?: number; logger?: Logger } = {}) {
    this.#pool = pool;
    this.#lookups = new RevocableCache(pool, { ...options, what: 'agent tokens' });
  }

  start(): Promise<void> {
    return this.#lookups.start();
  }

  stop(): void {
    this.#lookups.stop();
  }

  /** Creates a token for agents of `group`; the plain token is returned once, never stored. */
  async create(workspace: string, group: string, label: string | null = null): Promise<string> {
    if (!GROUP_RE.test(group)) {
      throw new TypeError('a worker group is 1–63 lowercase letters, digits, _ or -');
    }
    const token = AGENT_TOKEN_PREFIX + crypto.randomBytes(32).toString('base64url');
    await this.#pool.query(
      `insert into ${SERVER_SCHEMA}.agent_token (token_hash, workspace, worker_group, label)
       values ($1, $2, $3, $4)`,
      [digest(token), workspace, group, label],
    );
    return token;
  }

  async list(workspace: string): Promise<AgentTokenInfo[]> {
    const { rows } = await this.#pool.query<{
      id: string;
      worker_group: string;
      label: string | null;
      created_at: Date;
    }>(
      `select encode(token_hash, 'hex') as id, worker_group, label, created_at
         from ${SERVER_SCHEMA}.agent_token where workspace = $1 order by created_at, token_hash`,
      [workspace],
    );
    return rows.map((row) => ({
      id: row.id.slice(0, 12),
      group: row.worker_group,
      label: row.label,
      createdAt: row.created_at.toISOString(),
    }));
  }

  /**
   * Deletes the workspace's agent token whose id (hash prefix) matches, or every token of a
   * group, and bumps the revocation generation in the same transaction.
   */
  async revoke(workspace: string, which: { id: string } | { group: string }): Promise<number> {
    if ('id' in which && !TOKEN_ID_RE.test(which.id)) {
      throw new TypeError(
        'an agent token id is 8 to 64 hex digits, as `agent-token list` shows it',
      );
    }
    return revokeCredentials(this.#pool, {
      table: 'agent_token',
      action: 'delete',
      ...('id' in which
        ? {
            where: `workspace = $1 and starts_with(encode(token_hash, 'hex'), $2)`,
            params: [workspace, which.id],
            oneRow: true,
          }
        : { where: 'workspace = $1 and worker_group = $2', params: [workspace, which.group] }),
    });
  }

  /** The agent behind `token`, or null (unknown, revoked, or not an agent token). */
  async verify(token: string): Promise<AgentIdentity | null> {
    if (!token.startsWith(AGENT_TOKEN_PREFIX) || token.length > 100) return null;
    const hash = digest(token);
    return this.#lookups.get(hash.toString('base64'), async () => {
      const { rows } = await this.#pool.query<{ workspace: string; worker_group: string }>(
        `select workspace, worker_group from ${SERVER_SCHEMA}.agent_token where token_hash = $1`,
        [hash],
      );
      const row = rows[0];
      return row === undefined
        ? null
        : Object.freeze({
            id: hash.toString('hex').slice(0, 12),
            workspace: row.workspace,
            group: row.worker_group,
          });
    });
  }
}
