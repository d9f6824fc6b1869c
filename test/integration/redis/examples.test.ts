import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../../helpers/server_process.js';

// Every program in examples/ runs as a reader would run it — `npx tsx examples/NAME.ts` — and
// exits 0 having closed everything it opened (a leaked socket or timer would keep it alive past
// the timeout). The README's first TypeScript snippet is one of them, verbatim.

const EXAMPLES = join(ROOT, 'examples');
const files = readdirSync(EXAMPLES).filter((name) => name.endsWith('.ts'));

function runExample(file: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('npx', ['tsx', join('examples', file)], {
      cwd: ROOT,
      env: { ...process.env, NO_COLOR: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      out += chunk;
    });
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      out += chunk;
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, out }));
  });
}

describe('examples', () => {
  it('there are examples to run (an empty folder would pass vacuously)', () => {
    expect(files).toEqual(expect.arrayContaining(['own-executor.ts', 'datatable-as-viewer.ts']));
  });

  it.each(files)('npx tsx examples/%s exits 0', { timeout: 180_000 }, async (file) => {
    const { code, out } = await runExample(file);
    expect(out).not.toMatch(/Error|warning/i);
    expect({ file, code }).toEqual({ file, code: 0 });
  });

  it("README's first TypeScript snippet is examples/own-executor.ts, verbatim", () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const first = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
    expect(first).toBe(readFileSync(join(EXAMPLES, 'own-executor.ts'), 'utf8'));
  });
});
