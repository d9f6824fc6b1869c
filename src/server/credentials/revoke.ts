import type pg from 'pg';
import { withTransaction } from '../../index.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';

/** Which rows of a credential table a revocation takes (`where` is ours, never input). */
export interface Revocation {
  /** The table under the server schema: `api_token`, `agent_token`, `embed_key`. */
  readonly table: 'api_token' | 'agent_token' | 'embed_key';
  /** The rows, with `$1`, `$2`… bound to `params`. */
  readonly where: string;
  readonly params: readonly unknown[];
  /** A short id could name several rows: refuse (TypeError) rather than take more than one. */
  readonly oneRow?: boolean;
  /** `delete` the rows, or `stamp` their `revoked_at` (kept for the audit of who signed what). */
  readonly action: 'delete' | 'stamp';
}

/**
 * The credential tables' one revoke path: in one transaction, the change and a bump of the
 * revocation generation, so every server's revocable cache drops what it held at its next poll
 * (a revocation is never committed without the bump, nor the bump without it). Returns how many
 * rows were revoked.
 */
export async function revokeCredentials(pool: pg.Pool, revocation: Revocation): Promise<number> {
  const { table, where, params, action } = revocation;
  const client = await pool.connect();
  try {
    return await withTransaction(client, async () => {
      if (revocation.oneRow === true) {
        const { rows } = await client.query<{ n: number }>(
          `select count(*)::int as n from ${SERVER_SCHEMA}.${table} where ${where}`,
          [...params],
        );
        if ((rows[0]?.n ?? 0) > 1)
          throw new TypeError('that id names several tokens: give more digits');
      }
      const { rowCount } = await client.query(
        action === 'delete'
          ? `delete from ${SERVER_SCHEMA}.${table} where ${where}`
          : `update ${SERVER_SCHEMA}.${table} set revoked_at = now()
              where ${where} and revoked_at is null`,
        [...params],
      );
      await client.query(`update ${SERVER_SCHEMA}.token_generation set value = value + 1`);
      return rowCount ?? 0;
    });
  } finally {
    client.release();
  }
}
