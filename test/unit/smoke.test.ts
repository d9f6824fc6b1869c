import { describe, expect, it } from 'vitest';
import { cachedResultPath } from '../../src/index.js';

describe('smoke', () => {
  it('derives a key', () => {
    const key = cachedResultPath({
      id: 'j',
      workspace: 'w',
      runnable: { path: 'p', hash: 'h' },
      args: {},
      perms: { email: 'a@x', endUserEmail: null },
    });
    expect(key).toMatch(/^w\/cache\/[0-9a-f]{64}$/);
  });
});
