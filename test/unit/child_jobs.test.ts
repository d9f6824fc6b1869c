import { describe, expect, it } from 'vitest';
import type { Job, JobExecutor, JobResult, RunOptions } from '../../src/index.js';
import {
  createExecutor,
  MemoryCacheStore,
  recordViewer,
  withResultCache,
} from '../../src/index.js';
import { ManualClock } from '../helpers/clock.js';

const alice = 'alice@example.com';
const bob = 'bob@example.com';
const publisher = 'publisher@example.com';

/** Sits between the cache and the executor and records every job that reaches the executor. */
class Recorder implements JobExecutor {
  readonly jobs: Job[] = [];
  constructor(readonly inner: JobExecutor) {}
  run(job: Job, options?: RunOptions): Promise<JobResult> {
    this.jobs.push(job);
    return this.inner.run(job, options);
  }
  ran(path: string): Job[] {
    return this.jobs.filter((job) => job.runnable.path === path);
  }
}

function setup() {
  const seenByChild: Array<string | null> = [];
  const executor = createExecutor({
    runnables: {
      'f/parent': {
        // no cacheTtlS: the parent itself runs every time, its child may be served from cache
        fn: async (args, ctx) => ({
          parentViewer: ctx.viewer,
          child: await ctx.runChild('f/child', { region: args['region'] }, { cacheTtlS: 60 }),
        }),
      },
      'f/child': {
        fn: (args, ctx) => {
          seenByChild.push(ctx.viewer);
          return { childViewer: ctx.viewer, region: args['region'] };
        },
      },
      'f/cached-parent': {
        cacheTtlS: 60,
        fn: async (_args, ctx) => ctx.runChild('f/child', { region: 'us' }, { cacheTtlS: 60 }),
      },
      'f/bad-parent': {
        fn: async (_args, ctx) => ctx.runChild('f/missing'),
      },
    },
  });
  const recorder = new Recorder(executor);
  const clock = new ManualClock();
  const cache = withResultCache(recorder, {
    store: new MemoryCacheStore({ now: clock.now }),
    now: clock.now,
  });
  const parentJob = (viewer: string | null) =>
    executor.createJob({
      workspace: 'ws',
      path: 'f/parent',
      args: { region: 'eu' },
      runAs: publisher,
      origin:
        viewer === null
          ? { kind: 'app', session: null }
          : { kind: 'app', session: { email: viewer } },
    });
  return { executor, recorder, cache, seenByChild, parentJob };
}

describe('child jobs (ctx.runChild)', () => {
  it("inherit the parent's viewer, never the runner", async () => {
    const { cache, recorder, parentJob } = setup();
    const result = await cache.run(parentJob(alice));
    expect(result.value).toEqual({
      parentViewer: alice,
      child: { childViewer: alice, region: 'eu' },
    });
    const [child] = recorder.ran('f/child');
    expect(child!.perms).toEqual({ email: publisher, endUserEmail: alice });
  });

  it('of an anonymous run have no viewer (not the publisher)', async () => {
    const { cache, recorder, parentJob } = setup();
    const result = await cache.run(parentJob(null));
    expect(result.value).toEqual({
      parentViewer: null,
      child: { childViewer: null, region: 'eu' },
    });
    expect(recorder.ran('f/child')[0]!.perms).toEqual({ email: publisher, endUserEmail: null });
  });

  it('are built with the job-token origin', async () => {
    const { cache, recorder, parentJob } = setup();
    for (const viewer of [alice, null]) {
      const parent = parentJob(viewer);
      await cache.run(parent);
      const child = recorder.ran('f/child').at(-1)!;
      expect(child.perms.endUserEmail).toBe(
        recordViewer({ kind: 'job-token', parent: { perms: parent.perms } }),
      );
      expect(child.workspace).toBe(parent.workspace);
      expect(child.id).not.toBe(parent.id);
    }
  });

  it("go through the cache: a second parent run hits the child's entry", async () => {
    const { cache, recorder, seenByChild, parentJob } = setup();
    const first = await cache.run(parentJob(alice));
    const second = await cache.run(parentJob(alice));
    expect(second.value).toEqual(first.value);
    expect(recorder.ran('f/parent')).toHaveLength(2);
    expect(recorder.ran('f/child')).toHaveLength(1);
    expect(seenByChild).toEqual([alice]);
    expect(cache.stats).toMatchObject({ hits: 1, stored: 1, bypasses: 2 });
  });

  it("never serve one viewer's child result to another", async () => {
    const { cache, recorder, parentJob } = setup();
    const a = await cache.run(parentJob(alice));
    const b = await cache.run(parentJob(bob));
    const anon = await cache.run(parentJob(null));
    expect((a.value as { child: { childViewer: unknown } }).child.childViewer).toBe(alice);
    expect((b.value as { child: { childViewer: unknown } }).child.childViewer).toBe(bob);
    expect((anon.value as { child: { childViewer: unknown } }).child.childViewer).toBeNull();
    expect(recorder.ran('f/child')).toHaveLength(3);
    expect(cache.stats.hits).toBe(0);
  });

  it('of a cached parent also go through the cache', async () => {
    const { executor, cache, recorder } = setup();
    const job = executor.createJob({
      workspace: 'ws',
      path: 'f/cached-parent',
      runAs: publisher,
      origin: { kind: 'run', caller: { email: alice } },
    });
    await cache.run(job);
    expect(recorder.ran('f/child')).toHaveLength(1);
    // the child was cached under its own key, not only inside its parent's entry
    const child = recorder.ran('f/child')[0]!;
    expect((await cache.run({ ...child, id: 'again' })).fromCache).toBe(true);
    expect(cache.stats).toMatchObject({ stored: 2, hits: 1 });
  });

  it('run through the executor itself when it is not wrapped', async () => {
    const { executor, parentJob } = setup();
    const result = await executor.run(parentJob(alice));
    expect(result.value).toEqual({
      parentViewer: alice,
      child: { childViewer: alice, region: 'eu' },
    });
  });

  it('refuse an unknown child path with E_UNKNOWN_RUNNABLE', async () => {
    const { executor, cache } = setup();
    const job = executor.createJob({
      workspace: 'ws',
      path: 'f/bad-parent',
      runAs: publisher,
      origin: { kind: 'schedule' },
    });
    await expect(cache.run(job)).rejects.toMatchObject({ code: 'E_UNKNOWN_RUNNABLE' });
  });
});
