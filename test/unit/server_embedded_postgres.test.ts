import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { ViewerCacheError } from '../../src/index.js';
import { startEmbeddedPostgres } from '../../src/server/process/embedded_postgres.js';
import {
  checkPostgresUserAccess,
  firstClosedFolder,
} from '../../src/server/process/postgres_user_access.js';
import { freePort } from '../helpers/free_port.js';

// A newcomer running as root in a project folder the `postgres` OS user cannot enter (anything
// under a mode-0700 home such as /root): the start stops with one sentence naming the fix,
// before anything is spawned, instead of dying of an unhandled `spawn … initdb EACCES`.

const folders: string[] = [];
afterEach(async () => {
  for (const folder of folders.splice(0)) await rm(folder, { recursive: true, force: true });
});

/** A private home (mode 0700, like /root) with a project folder inside. */
async function privateHome(): Promise<{ home: string; project: string }> {
  const home = await mkdtemp(join(tmpdir(), 'viewer-cache-home-'));
  folders.push(home);
  const project = join(home, 'project');
  await mkdir(project);
  await chmod(home, 0o700);
  return { home, project };
}

const FIX = /cannot enter .*: set DATABASE_URL .*non-root user.*VIEWER_CACHE_DATA_DIR/;

describe('embedded PostgreSQL in a folder the postgres user cannot enter', () => {
  it('as root, the start refuses with one sentence naming the folder and the fix', async () => {
    const { home, project } = await privateHome();
    const dataDir = join(project, '.viewer-cache', 'pg');
    // This machine and CI run the suite as root, the case at hand. Elsewhere the same refusal is
    // checked through the preflight itself, for a user who owns nothing here.
    const refusal =
      process.getuid?.() === 0
        ? await startEmbeddedPostgres(dataDir, await freePort(), pino({ level: 'silent' })).then(
            (handle) => handle.stop().then(() => null),
            (err: unknown) => err,
          )
        : await checkPostgresUserAccess([{ what: 'its data folder', path: dataDir }], {
            uid: 2_000_000_000,
            gid: 2_000_000_000,
          }).then(
            () => null,
            (err: unknown) => err,
          );
    expect(refusal).toBeInstanceOf(ViewerCacheError);
    expect((refusal as ViewerCacheError).code).toBe('E_EMBEDDED_POSTGRES');
    expect((refusal as Error).message).toMatch(FIX);
    expect((refusal as Error).message).toContain(home);
    expect((refusal as Error).message).not.toMatch(/\n|EACCES|spawn/);
    // Nothing was written before the refusal: no half-made data folder to clean up.
    expect(existsSync(dataDir)).toBe(false);
  });

  it('a closed folder on the way to the binaries does not suggest VIEWER_CACHE_DATA_DIR as the fix', async () => {
    const { home, project } = await privateHome();
    const refusal = await checkPostgresUserAccess(
      [{ what: 'the PostgreSQL binaries', path: join(project, 'node_modules'), binaries: true }],
      { uid: 2_000_000_000, gid: 2_000_000_000 },
    ).then(
      () => null,
      (err: unknown) => err,
    );
    expect((refusal as ViewerCacheError).code).toBe('E_EMBEDDED_POSTGRES');
    expect((refusal as Error).message).toContain(home);
    expect((refusal as Error).message).toMatch(
      /install the project in a folder every user may enter/,
    );
    expect((refusal as Error).message).toMatch(/VIEWER_CACHE_DATA_DIR moves only the data/);
  });

  it('firstClosedFolder finds the private folder, and passes open ones', async () => {
    const { home, project } = await privateHome();
    const stranger = { uid: 2_000_000_000, gid: 2_000_000_000 };
    expect(await firstClosedFolder(join(project, 'x', 'y'), stranger)).toBe(home);
    // Its owner may enter it.
    const owner = { uid: process.getuid?.() ?? 0, gid: 2_000_000_000 };
    expect(await firstClosedFolder(project, owner)).toBeNull();
    await chmod(home, 0o711);
    expect(await firstClosedFolder(project, stranger)).toBeNull();
  });
});
