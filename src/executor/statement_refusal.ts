import { InvalidDataError, QueryFailedError, type ViewerCacheError } from '../errors.js';
import type { Job } from '../job.js';
import { isDataException } from '../pg/sqlstate.js';

/**
 * A statement Postgres refused that the runnable let through (a pg DatabaseError, or the
 * agent proxy's error in the same shape: `severity` and a five-character SQLSTATE), as a coded
 * error that reads the same in process and on an agent; null for anything else.
 */
export function statementRefusal(job: Job, err: Error): ViewerCacheError | null {
  const sqlstate = (err as { code?: unknown }).code;
  if (!('severity' in err) || typeof sqlstate !== 'string' || !/^[0-9A-Z]{5}$/.test(sqlstate))
    return null;
  // Class 22 (data exception): the request's value, not the runnable's statement.
  if (isDataException(sqlstate))
    return new InvalidDataError(
      `the database refused a value in this request (SQLSTATE ${sqlstate})`,
      { cause: err },
    );
  return new QueryFailedError(
    `runnable ${job.runnable.path}: the database refused a statement (SQLSTATE ${sqlstate}): ${err.message}`,
    { sqlstate, cause: err },
  );
}
