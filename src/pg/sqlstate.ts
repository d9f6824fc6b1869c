/**
 * The SQLSTATEs the data-table layer branches on, in one place: Postgres's own, and those the
 * library's own SQL raises (`VC…`). Only the code is read, never the message: Postgres's text
 * may quote a value (an email, an arg) and changes between versions.
 */

/** The SQLSTATE (or socket errno) an error carries, if any. */
export function sqlstateOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** SQLSTATEs and socket errors that mean the connection itself is gone, not the statement. */
const LOST_STATES = new Set(['57P01', '57P02', '57P03', '08000', '08003', '08006', '08001']);
const LOST_ERRNOS = new Set(['ECONNRESET', 'EPIPE', 'ECONNREFUSED', 'ETIMEDOUT', 'EHOSTUNREACH']);

/** Whether `err` says the connection died (as opposed to the statement failing on it). */
export function isConnectionLost(err: unknown): boolean {
  if (err === null || typeof err !== 'object') return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string' && (LOST_STATES.has(code) || LOST_ERRNOS.has(code))) return true;
  const message = (err as { message?: unknown }).message;
  return (
    typeof message === 'string' &&
    /Connection terminated|connection is not open|Client has encountered a connection error|not queryable/i.test(
      message,
    )
  );
}

/** SQLSTATEs meaning "these credentials no longer work". */
const AUTH_FAILURES = new Set(['28P01', '28000']);

/** Whether a connection attempt was refused its credentials (password or login changed). */
export function isAuthFailure(err: unknown): boolean {
  return AUTH_FAILURES.has(sqlstateOf(err) ?? '');
}

/**
 * Whether a statement met a function, table or schema that is not there (undefined_function,
 * undefined_table, invalid_schema_name): something dropped or restored behind the library.
 */
export function isMissingObject(err: unknown): boolean {
  const code = sqlstateOf(err);
  return code === '42883' || code === '42P01' || code === '3F000';
}

/**
 * A role name already in use: 42710 when the role was there before, 23505 (a unique violation on
 * pg_authid's name index) when another transaction created it concurrently and committed first.
 */
export function isRoleNameTaken(err: unknown): boolean {
  const code = sqlstateOf(err);
  return code === '42710' || code === '23505';
}

/**
 * Whether a SQLSTATE is of class 22, data exception (a NUL byte, bad encoding, an out-of-range
 * value…): a value the caller sent, its bad input (400 E_INVALID_DATA), not a fault. The one
 * place this rule is written: the lease, the HTTP answer and an agent's report all ask here.
 */
export function isDataException(code: unknown): boolean {
  return typeof code === 'string' && /^22[0-9A-Z]{3}$/.test(code);
}

/**
 * SQLSTATE insufficient_privilege. On a lent connection it is usually the runnable's own
 * doing, but also what every statement of a session gets once its login was dropped under it
 * (see PooledLease: that case is a lost connection, not a refusal).
 */
export const INSUFFICIENT_PRIVILEGE = '42501';

/** SQLSTATE active_sql_transaction: a statement that cannot run inside a transaction block. */
export const CANNOT_RUN_IN_BLOCK = '25001';
/** SQLSTATE syntax_error, which is also what several statements in one prepared text raise. */
export const SYNTAX_ERROR = '42601';

// Raised by the viewer-identity functions (identity/sql/identity.ts), read by every lease.
/** Reading the identity on a connection that carries none. */
export const NO_IDENTITY = 'VC401';
/** Reading an attribute the viewer was not given. */
export const NO_ATTRIBUTE = 'VC402';
/** Reading the email of an embed viewer whose assertion carries none. */
export const NO_EMAIL = 'VC403';

/** Socket errors and SQLSTATEs of a database that cannot be reached (or is shutting down). */
const UNREACHABLE_ERRNOS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ETIMEDOUT',
  'EPIPE',
]);
const SHUTTING_DOWN = new Set(['57P01', '57P02', '57P03', '08001', '08006']);

/**
 * Why the database behind `err` (or any error on its cause chain) cannot be reached: refused,
 * terminated (or shutting down), or timed out; `null` when the chain says nothing of the kind
 * (a refusal, a statement's own error). Only codes and pg's own fixed texts are read.
 */
export function unreachableReason(err: unknown): string | null {
  let current: unknown = err;
  for (let depth = 0; depth < 8 && current !== null && typeof current === 'object'; depth++) {
    const code = sqlstateOf(current);
    if (code === 'ECONNREFUSED') return 'connection refused';
    if (code === 'ETIMEDOUT') return 'timed out';
    if (code !== undefined && (UNREACHABLE_ERRNOS.has(code) || SHUTTING_DOWN.has(code)))
      return 'connection terminated';
    const message = (current as { message?: unknown }).message;
    if (typeof message === 'string') {
      if (/timeout exceeded when trying to connect|connection timeout/i.test(message))
        return 'timed out';
      if (/Connection terminated/i.test(message)) return 'connection terminated';
    }
    current = (current as { cause?: unknown }).cause;
  }
  return null;
}
