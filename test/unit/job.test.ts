import { describe, expect, it, vi } from 'vitest';
import { InvalidJobError } from '../../src/errors.js';
import type { JobPerms, RunOrigin } from '../../src/index.js';
import {
  cachedResultPath,
  createExecutor,
  createViewerCache,
  type Job,
  MemoryCacheStore,
  type RunOptions,
  recordViewer,
  withResultCache,
} from '../../src/index.js';
import { jobPerms, recordViewerIdentity } from '../../src/job.js';
import { ComputedResult, StoredResult } from '../../src/job_result.js';

const alice = 'alice@example.com';
const publisher = 'publisher@example.com';

describe('recordViewer (SPEC invariant 1)', () => {
  const cases: Array<[string, RunOrigin, string | null]> = [
    [
      'app request, signed-in session → the session user',
      { kind: 'app', session: { email: alice } },
      alice,
    ],
    ['app request, anonymous visitor → none', { kind: 'app', session: null }, null],
    ['direct run → the caller', { kind: 'run', caller: { email: alice } }, alice],
    ['preview → the caller', { kind: 'preview', caller: { email: alice } }, alice],
    [
      "job token → the parent's viewer",
      { kind: 'job-token', parent: { perms: { email: publisher, endUserEmail: alice } } },
      alice,
    ],
    [
      'job token of a parent without a viewer → none (never the parent runner)',
      { kind: 'job-token', parent: { perms: { email: publisher, endUserEmail: null } } },
      null,
    ],
    ['schedule → none', { kind: 'schedule' }, null],
    ['trigger → none', { kind: 'trigger' }, null],
    ['AI-agent tool step → none', { kind: 'agent-tool' }, null],
    [
      'one run of a per-recipient job → that recipient',
      { kind: 'recipient', recipient: { email: alice } },
      alice,
    ],
    [
      'embed link → no signed-in viewer, even with an email (see embed_viewer.test.ts)',
      { kind: 'embed', viewer: { app: 'orders', attributes: {}, email: alice } },
      null,
    ],
  ];

  it.each(cases)('%s', (_name, origin, expected) => {
    expect(recordViewer(origin)).toBe(expected);
  });

  it("a job-token origin takes the parent's viewer, not its runner, at every depth", () => {
    let perms: JobPerms = { email: publisher, endUserEmail: alice };
    for (let depth = 0; depth < 5; depth++) {
      const viewer = recordViewer({ kind: 'job-token', parent: { perms } });
      expect(viewer).toBe(alice);
      perms = { email: `runner-${depth}@example.com`, endUserEmail: viewer };
    }
  });

  it.each([
    ['an unknown kind', { kind: 'webhook-v2' }],
    ['a kind in another case', { kind: 'APP', session: { email: alice } }],
    ['no kind', { session: { email: alice } }],
  ])('refuses %s with E_INVALID_JOB (fails closed)', (_name, origin) => {
    expect(() => recordViewer(origin as unknown as RunOrigin)).toThrow(
      expect.objectContaining({ code: 'E_INVALID_JOB' }),
    );
  });

  it.each([
    ['no origin at all', null],
    ['an app origin without a session field', { kind: 'app' }],
    ['a run origin without a caller', { kind: 'run' }],
    ['a job-token origin without a parent', { kind: 'job-token' }],
    ['a recipient origin without a recipient', { kind: 'recipient' }],
    ['a recipient origin with a null recipient', { kind: 'recipient', recipient: null }],
    [
      'a parent whose viewer was never recorded',
      { kind: 'job-token', parent: { perms: { email: 'p@x' } } },
    ],
  ])('refuses %s with E_INVALID_JOB, never as "no viewer"', (_name, origin) => {
    expect(() => recordViewer(origin as unknown as RunOrigin)).toThrow(
      expect.objectContaining({ code: 'E_INVALID_JOB' }),
    );
  });

  it.each<[string, RunOrigin]>([
    ['an empty session email', { kind: 'app', session: { email: '' } }],
    ['an empty caller email', { kind: 'run', caller: { email: '' } }],
    ['a non-string caller email', { kind: 'preview', caller: { email: 42 as unknown as string } }],
    ['an empty recipient email', { kind: 'recipient', recipient: { email: '' } }],
    [
      'a parent viewer that is the empty string',
      { kind: 'job-token', parent: { perms: { email: publisher, endUserEmail: '' } } },
    ],
  ])('refuses %s: an empty identity is not "no viewer"', (_name, origin) => {
    expect(() => recordViewer(origin)).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
  });

  it('ignores every field of the origin except the ones the table names', () => {
    const origin = {
      kind: 'schedule',
      session: { email: alice },
      caller: { email: alice },
      endUserEmail: alice,
      viewer: alice,
      as: alice,
    } as unknown as RunOrigin;
    expect(recordViewer(origin)).toBeNull();
    const anonymous = {
      kind: 'app',
      session: null,
      caller: { email: alice },
    } as unknown as RunOrigin;
    expect(recordViewer(anonymous)).toBeNull();
    // A recipient run's viewer is the recipient, whatever else the origin carries.
    const recipient = {
      kind: 'recipient',
      recipient: { email: alice },
      caller: { email: publisher },
      session: { email: publisher },
    } as unknown as RunOrigin;
    expect(recordViewer(recipient)).toBe(alice);
  });
});

describe('executor.createJob records the viewer from the origin only', () => {
  const seen: Array<string | null> = [];
  const executor = createExecutor({
    runnables: {
      'f/app/who': {
        fn: (args, ctx) => {
          seen.push(ctx.viewer);
          return { viewer: ctx.viewer, args };
        },
        cacheTtlS: 30,
      },
    },
  });
  const smuggling = {
    endUserEmail: 'mallory@example.com',
    viewer: 'mallory@example.com',
    as: 'mallory@example.com',
    perms: { email: 'mallory@example.com', endUserEmail: 'mallory@example.com' },
  };

  it.each<[string, RunOrigin, string | null]>([
    ['signed-in app session', { kind: 'app', session: { email: alice } }, alice],
    ['anonymous app visitor', { kind: 'app', session: null }, null],
    ['direct run', { kind: 'run', caller: { email: alice } }, alice],
    ['preview', { kind: 'preview', caller: { email: alice } }, alice],
    [
      'job token',
      { kind: 'job-token', parent: { perms: { email: publisher, endUserEmail: alice } } },
      alice,
    ],
    ['schedule', { kind: 'schedule' }, null],
    ['trigger', { kind: 'trigger' }, null],
    ['agent tool', { kind: 'agent-tool' }, null],
    ['per-recipient run', { kind: 'recipient', recipient: { email: alice } }, alice],
  ])('%s: args carrying endUserEmail, viewer and as change nothing', async (_n, origin, viewer) => {
    const plain = executor.createJob({
      workspace: 'ws',
      path: 'f/app/who',
      runAs: publisher,
      origin,
      id: 'j1',
    });
    const smuggled = executor.createJob({
      workspace: 'ws',
      path: 'f/app/who',
      args: smuggling,
      runAs: publisher,
      origin,
      id: 'j2',
    });
    expect(plain.perms).toEqual({ email: publisher, endUserEmail: viewer });
    expect(smuggled.perms).toEqual({ email: publisher, endUserEmail: viewer });
    expect(smuggled.cacheTtlS).toBe(30);

    const result = await executor.run(smuggled);
    expect((result.value as { viewer: unknown }).viewer).toBe(viewer);
    expect(seen.at(-1)).toBe(viewer);

    // The smuggled args are part of the key as data, never as identity: the entry is the
    // recorded viewer's, and differs from mallory's own.
    const mallorys = executor.createJob({
      workspace: 'ws',
      path: 'f/app/who',
      args: smuggling,
      runAs: publisher,
      origin: { kind: 'run', caller: { email: 'mallory@example.com' } },
    });
    expect(cachedResultPath(smuggled)).not.toBe(cachedResultPath(mallorys));
    expect(cachedResultPath(smuggled)).toBe(
      cachedResultPath({ ...plain, args: structuredClone(smuggling) }),
    );
  });

  it('refuses an unknown origin kind with E_INVALID_JOB', () => {
    expect(() =>
      executor.createJob({
        workspace: 'ws',
        path: 'f/app/who',
        runAs: publisher,
        origin: { kind: 'header' } as unknown as RunOrigin,
      }),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
  });

  it('refuses an empty runAs', () => {
    expect(() =>
      executor.createJob({
        workspace: 'ws',
        path: 'f/app/who',
        runAs: '',
        origin: { kind: 'schedule' },
      }),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
  });
});

describe('jobs built on the request path', () => {
  // newJob's comment has the measurement: a job literal gets pretenured by V8 once misses hold
  // their jobs, and each hit's job then drags its young children into the old generation. Only
  // objects made by `new` escape that; this fails if a job goes back to being a literal.
  const isLiteral = (job: Job) => Object.getPrototypeOf(job) === Object.prototype;
  // An adopter's executor may spread, serialise or clone the job it is handed: every field must
  // be the job's own (a getter on a class prototype would vanish from all three).
  const plainData = (job: Job) => {
    const fields = {
      id: job.id,
      workspace: job.workspace,
      runnable: { path: job.runnable.path, hash: job.runnable.hash },
      args: job.args,
      perms: job.perms,
      cacheTtlS: job.cacheTtlS,
    };
    expect({ ...job, runnable: { ...job.runnable } }).toEqual(fields);
    expect(JSON.parse(JSON.stringify(job))).toEqual(JSON.parse(JSON.stringify(fields)));
    expect(structuredClone(job)).toEqual(fields);
  };

  it('executor.createJob and a child job are class instances that still clone as plain data', async () => {
    const executor = createExecutor({
      runnables: {
        'f/app/parent': { fn: (_args, ctx) => ctx.runChild('f/app/child', { n: 1 }) },
        'f/app/child': { fn: () => 2, cacheTtlS: 5 },
      },
    });
    // Every job that reaches the executor, the child's included (it comes back through the cache).
    const seen: Job[] = [];
    const cache = withResultCache(
      {
        run: (job: Job, options?: RunOptions) => {
          seen.push(job);
          return executor.run(job, options);
        },
      },
      { store: new MemoryCacheStore() },
    );
    const job = executor.createJob({
      workspace: 'ws',
      path: 'f/app/parent',
      runAs: publisher,
      origin: { kind: 'app', session: { email: alice } },
    });
    expect((await cache.run(job)).value).toBe(2);
    const child = seen.find((j) => j.runnable.path === 'f/app/child') as Job;
    expect(child).toMatchObject({ args: { n: 1 }, cacheTtlS: 5 });
    for (const built of [job, child]) {
      expect(isLiteral(built)).toBe(false);
      expect(Object.getPrototypeOf(built.runnable)).not.toBe(Object.prototype);
      plainData(built);
    }
  });

  it("createViewerCache hands an adopter's executor a class instance too", async () => {
    const seen: Job[] = [];
    const cache = createViewerCache({
      ttl: '60s',
      executor: async (job: Job) => {
        seen.push(job);
        return 1;
      },
    });
    await cache.run({ path: 'f/r', origin: { kind: 'app', session: { email: alice } } });
    await cache.close();
    expect(seen).toHaveLength(1);
    expect(isLiteral(seen[0] as Job)).toBe(false);
    plainData(seen[0] as Job);
  });
});

describe('the job createViewerCache builds for its own functions', () => {
  const origin = { kind: 'app', session: { email: alice } } as const;

  it('draws its id once: a hit reports one stable id of its own, a miss the id its function saw', async () => {
    const seenIds: string[] = [];
    const cache = createViewerCache({
      ttl: '60s',
      functions: {
        'f/id': async (_args, ctx) => {
          seenIds.push(ctx.jobId);
          return 1;
        },
      },
    });
    const miss = await cache.run({ path: 'f/id', origin });
    expect(miss.fromCache).toBe(false);
    expect(miss.jobId).toBe(seenIds[0]);
    const hits = [
      await cache.run({ path: 'f/id', origin }),
      await cache.run({ path: 'f/id', origin }),
    ];
    await cache.close();
    const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    for (const hit of hits) {
      expect(hit.fromCache).toBe(true);
      expect(hit.jobId).toMatch(uuid);
      expect(hit.jobId).toBe(hit.jobId);
    }
    expect(new Set([miss.jobId, ...hits.map((hit) => hit.jobId)]).size).toBe(3);
    expect(seenIds).toHaveLength(1);
  });

  it('records the same perms as every other job builder, key order included', () => {
    const origins: RunOrigin[] = [
      origin,
      { kind: 'app', session: null },
      { kind: 'run', caller: { email: alice } },
      { kind: 'preview', caller: { email: alice } },
      { kind: 'recipient', recipient: { email: alice } },
    ];
    for (const o of origins) {
      const general = { email: publisher, ...recordViewerIdentity(o) };
      expect(JSON.stringify(jobPerms(publisher, o))).toBe(JSON.stringify(general));
    }
    // Malformed origins still fail closed on the short path.
    for (const bad of [
      { kind: 'app' },
      { kind: 'app', session: { email: '' } },
      { kind: 'run', caller: {} },
      { kind: 'recipient' },
    ]) {
      expect(() => jobPerms(publisher, bad as RunOrigin)).toThrow(InvalidJobError);
    }
  });
});

describe('results', () => {
  it('ComputedResult serialises once, and undefined as JSON null', () => {
    const result = new ComputedResult('j', { a: [1, 'é'] });
    expect(result.fromCache).toBe(false);
    const bytes = result.json();
    expect(Buffer.from(bytes).toString('utf8')).toBe('{"a":[1,"é"]}');
    expect(result.json()).toBe(bytes);
    expect(Buffer.from(new ComputedResult('j', undefined).json()).toString()).toBe('null');
  });

  it('a received ComputedResult hands back its bytes and parses them only when value is read', () => {
    const bytes = Buffer.from('{"rows":[1,{"b":2}]}');
    const parse = vi.spyOn(JSON, 'parse');
    try {
      const result = ComputedResult.received('j', bytes, true);
      expect(result).toMatchObject({ jobId: 'j', fromCache: false, stored: true });
      expect(result.json()).toBe(bytes);
      // Handed on (the cache in front of a queue, a flight's joiner): still not parsed.
      const again = ComputedResult.again('k', result, result.json());
      expect(again).toMatchObject({ jobId: 'k', fromCache: false, stored: false });
      expect(again.json()).toBe(bytes);
      expect(parse).not.toHaveBeenCalled();
      expect(result.value).toEqual({ rows: [1, { b: 2 }] });
      expect(result.value).toBe(result.value);
      expect(parse).toHaveBeenCalledTimes(1);
      // Each holder parses its own copy: a joiner's writes never reach the leader's value.
      expect(again.value).toEqual(result.value);
      expect(again.value).not.toBe(result.value);
      expect({ ...result }.value).toEqual({ rows: [1, { b: 2 }] });
    } finally {
      parse.mockRestore();
    }
  });

  it('ComputedResult.again keeps the value of a result computed here', () => {
    const value = { a: 1 };
    const computed = new ComputedResult('j', value);
    const again = ComputedResult.again('k', computed, computed.json(), true);
    expect(again.value).toBe(value);
    expect(again).toMatchObject({ jobId: 'k', stored: true });
  });

  it('StoredResult hands back its bytes and parses them only when value is read', () => {
    const backing = Buffer.from('xx[1,{"b":2}]yy');
    const view = backing.subarray(2, backing.length - 2);
    const result = new StoredResult({ id: 'j' }, view);
    expect(result.fromCache).toBe(true);
    expect(result.jobId).toBe('j');
    expect(result.json()).toBe(view);
    expect(result.value).toEqual([1, { b: 2 }]);
    expect(result.value).toBe(result.value);
  });
});
