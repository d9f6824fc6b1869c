import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const FILL = fileURLToPath(new URL('../fixtures/fill_memory_store.ts', import.meta.url));
const MAX_BYTES = 32 << 20;
/**
 * What the process may hold beyond `maxBytes` once the store is full: the result cache's memo
 * of recent key digests (4096 names, ≈ 2.5 MB when full) and the runtime's own growth.
 */
const BOUND = 4 << 20;

/** Fills a store to twice its bound in a fresh process (`--expose-gc`): what it grew by. */
async function fill(resultBytes: number) {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['--expose-gc', '--import', 'tsx', FILL, String(MAX_BYTES), String(resultBytes)],
    { maxBuffer: 1 << 20 },
  );
  return JSON.parse(stdout.trim().split('\n').pop()!) as {
    grew: number;
    counted: number;
    entries: number;
  };
}

describe('MemoryCacheStore holds what it says it holds (a process of its own)', () => {
  it.each([100, 1024, 10_000])(
    'filled through createViewerCache to its maxBytes, ~%i-byte results: the process grows by ≤ maxBytes + 4 MiB',
    async (resultBytes) => {
      const { grew, counted, entries } = await fill(resultBytes);
      expect(entries).toBeGreaterThan(1000);
      // Full: evictions kept it at its bound.
      expect(counted).toBeGreaterThan(MAX_BYTES * 0.98);
      expect(counted).toBeLessThanOrEqual(MAX_BYTES);
      // Entries cut from Node's shared 8 KiB buffer pool kept whole slabs alive: 1.6× maxBytes.
      expect(grew).toBeLessThanOrEqual(MAX_BYTES + BOUND);
      // And the count is what entries cost, not a guess: within 10 % of what the process holds.
      expect(grew / counted).toBeGreaterThan(0.9);
      expect(grew / counted).toBeLessThan(1.1 + BOUND / counted);
    },
    60_000,
  );
});
