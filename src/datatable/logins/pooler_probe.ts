import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { PoolerUnsafeError } from '../../errors.js';
import { withClient } from '../../pg/pg_clients.js';

/** Attempts at meeting the probed backend again before the probe gives up (inconclusive). */
const ATTEMPTS = 5;

/**
 * Refuses a transaction pooler that carries session state from one transaction to the next
 * (SPEC invariant 12). In transaction mode a backend goes to another client after
 * every transaction; without `server_reset_query_always = 1` PgBouncer does not reset it, and a
 * runnable's `SET ROLE` reaches the next run of its login. The library cannot read the
 * pooler's settings, so it looks: one client sets a session setting (its own transaction),
 * another client reads it in the next transaction, until it meets the same backend (an idle
 * PgBouncer hands back the backend it used last). The value still there is a leak. Never
 * meeting the backend again (a session-mode pooler, a busy pool) proves nothing either way:
 * nothing is refused then.
 *
 * Runs as the admin login through the pooler (`loginConnection`'s host and port), which must
 * therefore reach it.
 *
 * @returns whether the probe met the backend again (false: inconclusive)
 */
export async function probePooler(config: pg.ClientConfig): Promise<boolean> {
  const token = randomBytes(12).toString('hex');
  const probe = { ...config, application_name: 'viewer-cache-pooler-probe' };
  return withClient(probe, async (setter) => {
    const { rows } = await setter.query<{ pid: number }>(
      "select pg_backend_pid() as pid, set_config('viewer_cache.pooler_probe', $1, false)",
      [token],
    );
    const pid = rows[0]?.pid;
    return withClient(probe, async (reader) => {
      for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
        const seen = await reader.query<{ pid: number; value: string | null }>(
          "select pg_backend_pid() as pid, current_setting('viewer_cache.pooler_probe', true) as value",
        );
        const row = seen.rows[0];
        if (row?.pid !== pid) continue;
        if (row?.value === token) {
          throw new PoolerUnsafeError(
            'transactionPooler: the pooler keeps session state between transactions (a SET in one transaction was read in the next by another client): set server_reset_query = DISCARD ALL and server_reset_query_always = 1 in PgBouncer',
          );
        }
        return true;
      }
      return false;
    });
  });
}
