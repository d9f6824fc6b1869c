/**
 * Text Postgres's grammar cannot read is refused before any connection, but answered as Postgres
 * itself answers it: a pg `DatabaseError` with SQLSTATE 42601 and the parser's message and
 * 1-based position. A runnable's error handling (`err.code === '42601'`) reads the same through
 * the proxy as in process, and the transports forward it as they forward Postgres's own errors.
 */
import pg from 'pg';

/** The pg-shaped error for a syntax error the proxy's parser found. */
export function syntaxErrorOf(found: {
  readonly syntaxError: string;
  readonly position: number;
}): pg.DatabaseError {
  const err = new pg.DatabaseError(found.syntaxError, 0, 'error');
  err.severity = 'ERROR';
  err.code = '42601';
  err.position = String(found.position);
  return err;
}
