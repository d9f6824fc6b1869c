import { describe, expect, it } from 'vitest';
import { isDataException } from '../../src/index.js';

// One rule for "the caller's bad input" (400 E_INVALID_DATA), asked by the lease, the HTTP
// answer and the agent protocol alike.
describe('isDataException', () => {
  it('is a five-character SQLSTATE of class 22', () => {
    expect(['22P02', '22021', '22003', '2200G'].map(isDataException)).toEqual([
      true,
      true,
      true,
      true,
    ]);
  });

  it('is nothing else: other classes, our codes, fragments, non-strings', () => {
    for (const code of ['42501', '23505', 'E_22_THING', '22', '22P02x', undefined, 22021, null])
      expect(isDataException(code)).toBe(false);
  });
});
