import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { deleteKeys, rawClient, uniquePrefix } from '../../helpers/redis.js';

const FILL = fileURLToPath(new URL('../../fixtures/fill_memory_store.ts', import.meta.url));
const MAX_BYTES = 16 << 20;
/** As in `memory_store_accounting.test.ts`: the key-digest memo and the runtime's own growth. */
const BOUND = 4 << 20;
const prefix = uniquePrefix('two_tier_memory_accounting');

afterAll(async () => {
  const client = await rawClient(inject('redisUrl'));
  await deleteKeys(client, prefix);
  client.disconnect();
});

describe('the memory tier of a sealed two-tier store holds what it says (a process of its own)', () => {
  it('filled through createViewerCache to its maxBytes with opened entries: grows by ≤ maxBytes + 4 MiB', async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [
        '--expose-gc',
        '--import',
        'tsx',
        FILL,
        String(MAX_BYTES),
        '1024',
        inject('redisUrl'),
        prefix,
      ],
      { maxBuffer: 1 << 20 },
    );
    const { grew, counted, entries } = JSON.parse(stdout.trim().split('\n').pop()!) as {
      grew: number;
      counted: number;
      entries: number;
    };
    expect(entries).toBeGreaterThan(1000);
    expect(counted).toBeGreaterThan(MAX_BYTES * 0.98);
    expect(counted).toBeLessThanOrEqual(MAX_BYTES);
    expect(grew).toBeLessThanOrEqual(MAX_BYTES + BOUND);
    expect(grew / counted).toBeGreaterThan(0.9);
  }, 120_000);
});
