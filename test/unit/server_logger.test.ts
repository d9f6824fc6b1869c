import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { readConfig } from '../../src/server/process/config.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/fatal_logger.mjs', import.meta.url));
const dirs: string[] = [];
afterEach(async () => {
  for (const dir of dirs.splice(0)) await rm(dir, { recursive: true, force: true });
});

/** Runs the fixture; resolves to its exit code and the JSON lines it logged. */
async function dies(lines: number, mode?: string) {
  const dir = await mkdtemp(join(tmpdir(), 'vc-fatal-'));
  dirs.push(dir);
  const file = join(dir, 'log.jsonl');
  const child = spawn(process.execPath, [FIXTURE, file, String(lines), ...(mode ? [mode] : [])], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
    stderr += chunk;
  });
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  const text = await readFile(file, 'utf8').catch(() => '');
  const logged = text
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { msg: string; level: number });
  return { code, logged, stderr };
}

describe('the server log on a fatal error (buffered lines, Decision 3 of issue 23)', () => {
  it('an uncaught exception loses no buffered line: all of them, then one fatal line, exit 1', async () => {
    // 20 lines stay under the 4 KiB buffer: only a flush on the way out writes them.
    const { code, logged, stderr } = await dies(20);
    expect(code).toBe(1);
    expect(logged.filter((line) => line.msg === 'request completed')).toHaveLength(20);
    expect(logged.at(-1)).toMatchObject({ level: 60, msg: 'fatal error; exiting' });
    expect(stderr).toContain('Error: boom');
  }, 30_000);

  it('held access lines are written when the process exits before the tick that writes them', async () => {
    const { code, logged } = await dies(20, '--access');
    expect(code).toBe(3);
    expect(logged.map((line) => (line as { reqId?: string }).reqId)).toEqual(
      Array.from({ length: 20 }, (_, i) => `req-${i}`),
    );
  }, 30_000);

  it('without the handler the lines are still written (the exit flush), but no fatal line', async () => {
    const { code, logged } = await dies(20, '--no-handler');
    expect(code).toBe(1);
    expect(logged).toHaveLength(20);
    expect(logged.some((line) => line.level === 60)).toBe(false);
  }, 30_000);
});

describe('VIEWER_CACHE_ACCESS_LOG', () => {
  it('is on by default, off with off, and refuses anything else', () => {
    expect(readConfig({}).accessLog).toBe(true);
    expect(readConfig({ VIEWER_CACHE_ACCESS_LOG: 'on' }).accessLog).toBe(true);
    expect(readConfig({ VIEWER_CACHE_ACCESS_LOG: 'off' }).accessLog).toBe(false);
    expect(() => readConfig({ VIEWER_CACHE_ACCESS_LOG: 'false' })).toThrow(
      /VIEWER_CACHE_ACCESS_LOG must be on or off/,
    );
  });
});
