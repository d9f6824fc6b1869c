import { describe, expect, it } from 'vitest';
import { roundOrder, wholePeriods } from './helpers.js';

// The bench's interleaving: over one period every scenario runs once in every position and right
// after every other one equally often, so no scenario always pays for the same predecessor.

function period(n: number): number {
  return n % 2 === 0 ? n : 2 * n;
}

describe('roundOrder', () => {
  for (const n of [2, 3, 4, 5, 7, 10, 13]) {
    it(`balances positions and predecessors over a period (${n} scenarios)`, () => {
      const items = Array.from({ length: n }, (_, i) => `s${i}`);
      for (const start of [0, period(n), 3 * period(n)]) {
        const positions = new Map<string, number>();
        const pairs = new Map<string, number>();
        for (let r = start; r < start + period(n); r++) {
          const order = roundOrder(items, r);
          expect([...order].sort()).toEqual([...items].sort());
          order.forEach((s, i) => {
            positions.set(`${s}@${i}`, (positions.get(`${s}@${i}`) ?? 0) + 1);
            if (i > 0)
              pairs.set(`${order[i - 1]}>${s}`, (pairs.get(`${order[i - 1]}>${s}`) ?? 0) + 1);
          });
        }
        const each = period(n) / n;
        expect(positions.size).toBe(n * n);
        for (const count of positions.values()) expect(count).toBe(each);
        expect(pairs.size).toBe(n * (n - 1));
        for (const count of pairs.values()) expect(count).toBe(each);
      }
    });
  }

  it('casts the scenarios anew each period, the same way in every run', () => {
    const items = Array.from({ length: 13 }, (_, i) => i);
    const first = Array.from({ length: 26 }, (_, r) => roundOrder(items, r).join());
    const second = Array.from({ length: 26 }, (_, r) => roundOrder(items, 26 + r).join());
    expect(second).not.toEqual(first);
    expect(Array.from({ length: 26 }, (_, r) => roundOrder(items, r).join())).toEqual(first);
  });
});

describe('wholePeriods', () => {
  it('rounds up to whole periods of the design', () => {
    expect(wholePeriods(13, 40)).toBe(52);
    expect(wholePeriods(13, 100)).toBe(104);
    expect(wholePeriods(4, 8)).toBe(8);
    expect(wholePeriods(4, 9)).toBe(12);
    expect(wholePeriods(1, 5)).toBe(5);
    expect(wholePeriods(6, 0)).toBe(6);
  });
});
