import { timingSafeEqual } from 'node:crypto';
import type pg from 'pg';
import { SecretMismatchError } from '../../errors.js';
import type { PasswordDeriver } from '../logins/passwords.js';

/** The use the check value is derived for: a key of its own, never a password or another MAC. */
const LABEL = 'secret-check';

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
 * for ever, and distrusted every learned dependency set.
 */
export async function checkSecretKey(pool: pg.Pool, passwords: PasswordDeriver): Promise<void> {
  const mine = passwords.deriveKey(LABEL);
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
