import { describe, expect, it } from 'vitest';
import { takerSlots } from '../../src/queue/queue_worker.js';

describe('takerSlots: how a queue worker splits its slots between BullMQ workers', () => {
  it('keeps every slot, at most 8 a worker while at most 4 workers take the queue', () => {
    for (let concurrency = 1; concurrency <= 1000; concurrency++) {
      const slots = takerSlots(concurrency);
      expect(slots.reduce((a, b) => a + b, 0)).toBe(concurrency);
      expect(slots.length).toBe(Math.min(4, Math.ceil(concurrency / 8)));
      // As even as can be: no two shares differ by more than one, none empty.
      expect(Math.max(...slots) - Math.min(...slots)).toBeLessThanOrEqual(1);
      expect(Math.min(...slots)).toBeGreaterThan(0);
      if (slots.length < 4) expect(Math.max(...slots)).toBeLessThanOrEqual(8);
    }
    expect(takerSlots(1)).toEqual([1]);
    expect(takerSlots(8)).toEqual([8]);
    expect(takerSlots(9)).toEqual([5, 4]);
    expect(takerSlots(32)).toEqual([8, 8, 8, 8]);
    expect(takerSlots(33)).toEqual([9, 8, 8, 8]);
  });
});
