import { afterEach, describe, expect, it, vi } from 'vitest';
import { createViewerCache, type Job } from '../../src/index.js';

// createViewerCache: your function, the origin, the TTL — the wrapper builds the job, records
// the viewer from the origin alone, derives the bytes and keys the entry.

const as = (email: string) => ({ kind: 'app', session: { email } }) as const;

afterEach(() => {
  vi.restoreAllMocks();
});

describe('createViewerCache', () => {
  it('caches a map of functions per viewer: a hit is only ever the same viewer’s', async () => {
    let calls = 0;
    const cache = createViewerCache({
      ttl: '60s',
      functions: { 'f/who': async (_args, ctx) => ({ viewer: ctx.viewer, call: ++calls }) },
    });
    const a1 = await cache.run({ path: 'f/who', origin: as('a@x.test') });
    const b1 = await cache.run({ path: 'f/who', origin: as('b@x.test') });
    const a2 = await cache.run({ path: 'f/who', origin: as('a@x.test') });
    const anon = await cache.run({ path: 'f/who', origin: { kind: 'app', session: null } });
    expect([a1.fromCache, b1.fromCache, a2.fromCache, anon.fromCache]).toEqual([
      false,
      false,
      true,
      false,
    ]);
    expect(a2.value).toEqual({ viewer: 'a@x.test', call: 1 });
    expect(b1.value).toEqual({ viewer: 'b@x.test', call: 2 });
    expect(anon.value).toEqual({ viewer: null, call: 3 });
    expect(Buffer.from(a2.json()).toString()).toBe('{"viewer":"a@x.test","call":1}');
    await cache.close();
  });

  it('hands your executor a job whose viewer comes from the origin, never from args', async () => {
    const seen: Job[] = [];
    const cache = createViewerCache({
      ttl: '60s',
      workspace: 'acme',
      executor: async (job: Job) => {
        seen.push(job);
        return job.args;
      },
    });
    await cache.run({
      path: 'f/r',
      args: { endUserEmail: 'mallory@x.test' },
      origin: as('a@x.test'),
      version: 'v2',
    });
    expect(seen[0]).toMatchObject({
      workspace: 'acme',
      runnable: { path: 'f/r', hash: 'v2' },
      perms: { email: 'app', endUserEmail: 'a@x.test' },
      cacheTtlS: 60,
    });
    const again = await cache.run({
      path: 'f/r',
      args: { endUserEmail: 'mallory@x.test' },
      origin: as('mallory@x.test'),
      version: 'v2',
    });
    expect(again.fromCache).toBe(false);
    await cache.close();
  });

  it('a child run (job-token origin) keeps its parent’s role scope, with your executor or functions', async () => {
    const parent = {
      perms: { email: 'app', endUserEmail: 'a@x.test', roleScope: Object.freeze([7]) },
    } as unknown as Job;
    const origin = { kind: 'job-token', parent } as const;
    const seen: Job[] = [];
    const withExecutor = createViewerCache({
      ttl: '60s',
      executor: async (job: Job) => {
        seen.push(job);
        return 1;
      },
    });
    await withExecutor.run({ path: 'f/child', origin });
    const withFunctions = createViewerCache({
      ttl: '60s',
      functions: { 'f/child': async (_args, ctx) => ctx.viewer },
    });
    await withFunctions.run({ path: 'f/child', origin });
    // The scope is in the key: the same viewer unscoped must not be handed the scoped entry.
    const unscoped = await withFunctions.run({ path: 'f/child', origin: as('a@x.test') });
    // Without the scope the child would run with every role of its viewer: wider than its parent.
    expect(seen[0]?.perms).toEqual({ email: 'app', endUserEmail: 'a@x.test', roleScope: [7] });
    expect(unscoped.fromCache).toBe(false);
    await withExecutor.close();
    await withFunctions.close();
  });

  it('a run without a TTL is counted and warned once per path, never silently uncached', async () => {
    const warn = vi.spyOn(process, 'emitWarning').mockImplementation(() => {});
    let calls = 0;
    const cache = createViewerCache({
      functions: { 'f/a': () => ++calls, 'f/b': () => ++calls },
    });
    for (let i = 0; i < 3; i++) await cache.run({ path: 'f/a', origin: as('a@x.test') });
    await cache.run({ path: 'f/b', origin: as('a@x.test') });
    expect(calls).toBe(4);
    expect(cache.untimedRuns).toBe(4);
    expect(warn).toHaveBeenCalledTimes(2);
    expect(String(warn.mock.calls[0]![0])).toContain('f/a');
    expect(warn.mock.calls[0]![1]).toMatchObject({ code: 'VIEWER_CACHE_NO_TTL' });
    // The run's own TTL caches it.
    await cache.run({ path: 'f/a', origin: as('a@x.test'), ttl: '1m' });
    expect((await cache.run({ path: 'f/a', origin: as('a@x.test'), ttl: '1m' })).fromCache).toBe(
      true,
    );
    expect(cache.untimedRuns).toBe(4);
  });

  it('refuses options that cannot work, naming them', () => {
    expect(() => createViewerCache({})).toThrow(/exactly one of functions .* or executor/);
    expect(() =>
      createViewerCache({ functions: { 'f/a': () => 1 }, executor: async () => 1 }),
    ).toThrow(TypeError);
    expect(() => createViewerCache({ executor: {} as never })).toThrow(/executor must be/);
    expect(() =>
      createViewerCache({ functions: { 'f/a': () => 1 }, ttl: 'soon' as never }),
    ).toThrow(/ttl/);
  });

  it('refuses an option key it does not know, naming it', () => {
    expect(() => createViewerCache({ executor: async () => 1, stor: undefined } as never)).toThrow(
      TypeError,
    );
    expect(() => createViewerCache({ executor: async () => 1, stor: undefined } as never)).toThrow(
      /unknown option "stor"/,
    );
  });

  it('a run it cannot build a job for is a rejection (coded), never a synchronous throw', async () => {
    const withFunctions = createViewerCache({ functions: { 'f/a': () => 1 }, ttl: '60s' });
    const unknown = withFunctions.run({ path: 'f/nope', origin: as('a@x.test') });
    await expect(unknown).rejects.toMatchObject({ code: 'E_UNKNOWN_RUNNABLE' });
    const withExecutor = createViewerCache({ executor: async () => 1, ttl: '60s', runAs: '' });
    const noRunAs = withExecutor.run({ path: 'f/a', origin: as('a@x.test') });
    await expect(noRunAs).rejects.toMatchObject({ code: 'E_INVALID_JOB' });
    const noOrigin = withExecutor.run({ path: 'f/a', origin: undefined as never });
    await expect(noOrigin).rejects.toMatchObject({ code: 'E_INVALID_JOB' });
    await withFunctions.close();
    await withExecutor.close();
  });

  it('refuses a bare number as ttl (seconds or milliseconds?), in the wrapper and in a run', async () => {
    expect(() => createViewerCache({ functions: { 'f/a': () => 1 }, ttl: 60 })).toThrow(
      /ttl must be a string with its unit/,
    );
    const cache = createViewerCache({ functions: { 'f/a': () => 1 }, ttl: '60s' });
    await expect(async () =>
      cache.run({ path: 'f/a', origin: { kind: 'trigger' }, ttl: 60 }),
    ).rejects.toThrow(/ttl must be a string with its unit/);
    await cache.close();
  });
});
