import { describe, expect, it } from 'vitest';
import { plainEntries } from '../../src/cache/cache_entry.js';
import { canonicalKeyInput, keyDigest } from '../../src/cache/cache_key.js';
import { CacheRuns } from '../../src/cache/cache_run.js';
import type { Job } from '../../src/index.js';
import { MemoAdmission } from '../../src/util/memo_admission.js';

// The result cache's key memos keep every miss while they serve, and a sample while they churn
// (a working set larger than they hold); either way, a run's key is the key of its text.

describe('MemoAdmission', () => {
  it('keeps every miss while at least half of the lookups find their key', () => {
    const admission = new MemoAdmission(10);
    for (let i = 0; i < 100; i++) admission.looked(i % 2 === 0);
    expect(admission.sampling).toBe(false);
    for (let i = 0; i < 50; i++) expect(admission.admits()).toBe(true);
    expect(admission.kept).toBe(50);
  });

  it('after a window where under half found, keeps one miss in 64', () => {
    const admission = new MemoAdmission(10);
    for (let i = 0; i < 10; i++) admission.looked(i < 4);
    expect(admission.sampling).toBe(true);
    let kept = 0;
    for (let i = 0; i < 6400; i++) if (admission.admits()) kept++;
    expect(kept).toBe(100);
    expect(admission.kept).toBe(100);
  });

  it('decides per window: back to every miss once half found again', () => {
    const admission = new MemoAdmission(10);
    for (let i = 0; i < 10; i++) admission.looked(false);
    expect(admission.sampling).toBe(true);
    // Mid-window, the last decision holds.
    for (let i = 0; i < 9; i++) admission.looked(true);
    expect(admission.sampling).toBe(true);
    admission.looked(false);
    expect(admission.sampling).toBe(false);
    expect(admission.admits()).toBe(true);
  });

  it('refuses a window that is not a positive integer', () => {
    expect(() => new MemoAdmission(0)).toThrow(RangeError);
    expect(() => new MemoAdmission(2.5)).toThrow(RangeError);
  });
});

function job(i: number, viewer: string): Job {
  return {
    id: `j${i}`,
    workspace: 'ws',
    runnable: { path: 'f/report', hash: 'h1' },
    args: { page: i, region: 'emea' },
    perms: { email: 'publisher@example.com', endUserEmail: viewer },
  };
}

const keyOf = (j: Job) => keyDigest(canonicalKeyInput(j, 'fp'));

describe('CacheRuns under a working set larger than its memos', () => {
  it('samples what it keeps while cycling through many runs, and every key stays exact', () => {
    const runs = new CacheRuns(plainEntries, false);
    const jobs = Array.from({ length: 12_000 }, (_, i) => job(i, `viewer${i % 300}@example.com`));
    for (let round = 0; round < 2; round++) {
      for (const j of jobs) expect(runs.of(j, 'fp', 60_000, {}).digest).toBe(keyOf(j));
    }
    expect(runs.admission.sampling).toBe(true);
    // Keeping every miss would have kept all 24 000; sampled, far fewer.
    expect(runs.admission.kept).toBeLessThan(6_000);
  });

  it('keeps every miss again once the runs in use fit, and finds them', () => {
    const runs = new CacheRuns(plainEntries, false);
    for (let i = 0; i < 12_000; i++) runs.of(job(i, 'alice@example.com'), 'fp', 60_000, {});
    expect(runs.admission.sampling).toBe(true);
    const few = Array.from({ length: 100 }, (_, i) => job(50_000 + i, 'bob@example.com'));
    let rounds = 0;
    while (runs.admission.sampling && rounds < 1_000) {
      for (const j of few) expect(runs.of(j, 'fp', 60_000, {}).digest).toBe(keyOf(j));
      rounds++;
    }
    expect(runs.admission.sampling).toBe(false);
    // A sample at a time: each of the hundred is kept within a few hundred rounds at most.
    expect(rounds).toBeLessThan(400);
    // A viewer whose runs fit is served from the memo again: another key for another viewer.
    const carol = job(50_000, 'carol@example.com');
    expect(runs.of(carol, 'fp', 60_000, {}).digest).toBe(keyOf(carol));
    expect(runs.of(carol, 'fp', 60_000, {}).digest).not.toBe(keyOf(few[0]!));
  });
});
