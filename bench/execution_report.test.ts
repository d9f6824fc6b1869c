import { describe, expect, it } from 'vitest';
import { median, pairedRow, ratioText } from './execution_report.js';

// The queue's throughput rows: a ratio is the median of each round's own ratio, so that one slow
// round falls on its pair, not on one side of the figure.

describe('pairedRow', () => {
  it("takes the median of the rounds' ratios, not the ratio of the medians", () => {
    // Round 2 was slow for both kinds alike: its pair still reads 0.8.
    const row = pairedRow('r', 'label', 'base', [1000, 500, 1000], [800, 400, 700]);
    expect(row.ratio).toBeCloseTo(0.8, 10);
    expect(row.range).toEqual([0.7, 0.8]);
    expect(row.baseline).toBe(1000);
    expect(row.value).toBe(700);
    // The ratio of the medians would read 0.7.
    expect(row.value / row.baseline).toBeCloseTo(0.7, 10);
  });

  it('refuses rounds that do not pair up', () => {
    expect(() => pairedRow('r', 'label', 'base', [1, 2], [1])).toThrow(/1 rounds.*2/);
    expect(() => pairedRow('r', 'label', 'base', [], [])).toThrow();
  });
});

describe('median', () => {
  it('is the middle value, or the mean of the middle two', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
  });
});

describe('ratioText', () => {
  it("shows a paired row's range, and a plain row's ratio alone", () => {
    const paired = pairedRow('r', 'label', 'base', [1000, 1000, 1000], [800, 700, 750]);
    expect(ratioText(paired, '×')).toBe('0.75× (0.70–0.80)');
    expect(ratioText({ ratio: 1.234 })).toBe('1.23');
  });
});
