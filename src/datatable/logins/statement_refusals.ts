import {
  InvalidDataError,
  NoViewerAttributeError,
  NoViewerError,
  type ViewerCacheError,
} from '../../errors.js';
import { isDataException, NO_ATTRIBUTE, NO_EMAIL, NO_IDENTITY } from '../../pg/sqlstate.js';

/**
 * What a statement Postgres refused with SQLSTATE `code` means on a lent connection: the coded
 * error the runnable gets, or null when it is none of these (thrown as Postgres raised it). The
 * lease (pooled_lease.ts) handles what needs its state first: a lost connection, a login
 * dropped under the session.
 */
export function refusalOf(code: string | undefined, err: unknown): ViewerCacheError | null {
  if (code === NO_IDENTITY) {
    return new NoViewerError(
      'this connection carries no viewer identity: only a run with a viewer, connected with ?as=viewer, has one',
      { cause: err },
    );
  }
  if (code === NO_EMAIL) {
    return new NoViewerError(
      'this viewer has no email: an embed viewer has one only when its host signed one',
      { cause: err },
    );
  }
  if (code === NO_ATTRIBUTE) return new NoViewerAttributeError(undefined, { cause: err });
  // Class 22 (data exception: a NUL byte, bad encoding, out-of-range value…) is the request's
  // fault, not the server's: a coded 4xx instead of a runnable failure. Postgres's message can
  // quote the value (an email, an arg): only the SQLSTATE goes in ours; the original stays in
  // `cause` for whoever chooses to look.
  if (isDataException(code)) {
    return new InvalidDataError(`the database refused a value in this request (SQLSTATE ${code})`, {
      cause: err,
    });
  }
  return null;
}
