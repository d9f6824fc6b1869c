import { describe, expect, it } from 'vitest';
import { withEpochs } from '../../src/cache/cache_epochs.js';
import type { CacheInvalidation } from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

const job = makeJob({ workspace: 'ws', path: 'f/a' });
const invalidation = (tag: string | Promise<string>): CacheInvalidation => ({
  tag: () => tag,
  invalidate: async () => {},
});

describe('withEpochs: the epochs current at a run’s start join its fingerprint', () => {
  it('is synchronous when the epochs and the fingerprint are (the hit path)', () => {
    expect(withEpochs(null, invalidation('id.1.0'))(job)).toBe('eid.1.0:n');
    expect(withEpochs(() => 'fp', invalidation('id.1.0'))(job)).toBe('eid.1.0:sfp');
  });

  it('waits for epochs read from Redis, and rejects when they cannot be read', async () => {
    await expect(
      withEpochs(() => 'fp', invalidation(Promise.resolve('id.2.3')))(job),
    ).resolves.toBe('eid.2.3:sfp');
    const failing = Promise.reject(new Error('down'));
    failing.catch(() => {});
    await expect(Promise.resolve(withEpochs(null, invalidation(failing))(job))).rejects.toThrow(
      'down',
    );
  });

  it('keeps "no fingerprint" apart from every fingerprint, and epochs apart from each other', () => {
    const seen = new Set<string | null>();
    for (const tag of ['a.0.0', 'a.1.0', 'a.0.1', 'b.0.0']) {
      for (const fp of [null, '', 'n', ':n', 'x']) {
        seen.add(withEpochs(() => fp, invalidation(tag))(job) as string);
      }
    }
    expect(seen.size).toBe(4 * 5);
  });

  it('hands a fingerprint that is not text on unchanged, so the key refuses it as before', () => {
    const odd = withEpochs(() => 42 as unknown as string, invalidation('a.0.0'))(job);
    expect(odd).toBe(42);
  });

  it('keeps a tracking fingerprint tracking: settled keys get the start epochs, none if invalidated', async () => {
    let tag = 'a.0.0';
    const moving: CacheInvalidation = { tag: () => tag, invalidate: async () => {} };
    const abandoned: string[] = [];
    const tracked = Object.assign(() => 'predicted', {
      track: () => ({
        settle: (fp: string | null) => [fp, 'asked'],
        abandon: () => abandoned.push('x'),
      }),
    });
    const fn = withEpochs(tracked, moving);
    const started = fn(job) as string;
    expect(started).toBe('ea.0.0:spredicted');
    await expect(fn.track!(job).settle(started)).resolves.toEqual([
      'ea.0.0:spredicted',
      'ea.0.0:sasked',
    ]);
    const run = fn.track!(job);
    tag = 'a.1.0'; // invalidated while it ran
    await expect(run.settle(started)).resolves.toBeUndefined();
    fn.track!(job).abandon();
    expect(abandoned).toHaveLength(1);
  });
});
