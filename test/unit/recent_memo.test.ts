import { describe, expect, it } from 'vitest';
import { RecentMemo } from '../../src/util/recent_memo.js';

// The result cache's memo of key digests: bounded, and it keeps what is used.

describe('RecentMemo', () => {
  it('never holds more than two generations', () => {
    const memo = new RecentMemo<string, number>(4);
    for (let i = 0; i < 100; i++) {
      memo.set(`k${i}`, i);
      expect(memo.size).toBeLessThanOrEqual(8);
    }
    expect(memo.get('k99')).toBe(99);
    expect(memo.get('k0')).toBeUndefined();
  });

  it('an entry used once per generation survives any number of insertions', () => {
    const memo = new RecentMemo<string, number>(4);
    memo.set('hot', 1);
    for (let i = 0; i < 100; i++) {
      memo.set(`cold${i}`, i);
      if (i % 3 === 0) expect(memo.get('hot')).toBe(1);
    }
    expect(memo.get('hot')).toBe(1);
  });

  it('hands back what was set under the exact key, and nothing for another', () => {
    const memo = new RecentMemo<string, string>(2);
    memo.set('["a"]', 'A');
    memo.set('["b"]', 'B');
    memo.set('["c"]', 'C'); // "a" and "b" move to the previous generation
    expect(memo.get('["a"]')).toBe('A');
    expect(memo.get('["b"]')).toBe('B');
    expect(memo.get('["c"]')).toBe('C');
    expect(memo.get('["a" ]')).toBeUndefined();
    memo.set('["a"]', 'A2'); // replacing does not start a generation
    expect(memo.get('["a"]')).toBe('A2');
  });

  it('refuses a size that is not a positive integer', () => {
    expect(() => new RecentMemo(0)).toThrow(RangeError);
    expect(() => new RecentMemo(1.5)).toThrow(RangeError);
  });
});
