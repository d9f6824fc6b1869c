import { timingSafeEqual } from 'node:crypto';
import type pg from 'pg';
import { SecretMismatchError } from '../../errors.js';

/** Records the check value on first use; returns the one the catalog holds (one statement). */
const RECORD_OR_READ = `
  with recorded as (
    insert into viewer_cache.secret_check (check_value) values ($1)
    on conflict (only_row) do nothing
    returning check_value
  )
  select check_value from recorded
  union all
  select check_value from viewer_cache.secret_check
  limit 1`;

const READ = 'select check_value from viewer_cache.secret_check';
const UNDEFINED_TABLE = '42P01';

/**
 * One secret per deployment. The first process that opens a catalog records a check value of
 * its secret key (catalog migration 8); every later one compares its own and refuses to start
 * with E_SECRET_MISMATCH when they differ. Without this a process with another key (one a CLI
 * generated in another folder) took the managed logins back from the others, and they from it,
 * for ever, and distrusted every learned dependency set. `mine` is this process's check value:
 * a key derived from the secret for this use alone (`passwords.deriveKey('secret-check')`).
 */
export async function checkSecretKey(pool: pg.Pool, mine: Buffer): Promise<void> {
  let recorded: Buffer | undefined;
  try {
    const { rows } = await pool.query<{ check_value: Buffer }>(RECORD_OR_READ, [mine]);
    // Empty when a concurrent first process committed its row after this statement's snapshot:
    // read it again, now that it is there.
    recorded =
      rows[0]?.check_value ??
      (await pool.query<{ check_value: Buffer }>(READ)).rows[0]?.check_value;
  } catch (err) {
    // A catalog migrated by its owner to a version before the check (migrate: false): nothing
    // to compare with yet.
    if ((err as { code?: unknown }).code === UNDEFINED_TABLE) return;
    throw err;
  }
  if (recorded === undefined) return;
  if (recorded.length !== mine.length || !timingSafeEqual(recorded, mine))
    throw new SecretMismatchError();
}
