import { describe, expect, it } from 'vitest';
import type {
  DatatableConnector,
  DatatableLease,
  DatatableQueryResult,
  DatatableRef,
  Job,
  RunContext,
} from '../../src/index.js';
import { createExecutor, errors } from '../../src/index.js';
import { deferred } from '../helpers/deferred.js';
import { makeJob } from '../helpers/jobs.js';

const alice = 'alice@example.com';

/** A fake data-table connector (the seam the executor leaves for data tables). */
class FakeConnector implements DatatableConnector {
  readonly connects: Array<{ job: Job; ref: DatatableRef }> = [];
  readonly releases: boolean[] = [];
  readonly queries: Array<{ text: string; values: readonly unknown[] | undefined }> = [];
  /** When set, connect waits for it (to open a connection "slowly"). */
  hold: Promise<void> | undefined;
  refuse: Error | undefined;

  async connect(job: Job, ref: DatatableRef): Promise<DatatableLease> {
    this.connects.push({ job, ref });
    if (this.refuse) throw this.refuse;
    if (this.hold) await this.hold;
    const query = async (
      text: string,
      values?: readonly unknown[],
    ): Promise<DatatableQueryResult> => {
      this.queries.push({ text, values });
      return { rows: [{ ref: ref.access.kind, values }], rowCount: 1 };
    };
    return {
      client: { query: query as DatatableLease['client']['query'] },
      query,
      release: async (destroy: boolean) => {
        this.releases.push(destroy);
      },
    };
  }
}

function jobFor(path: string, extra: Parameters<typeof makeJob>[0] = {}): Job {
  return makeJob({ path, viewer: alice, hash: 'v1', ...extra });
}

describe('executor: runnables', () => {
  it('passes args and the context (job id, workspace, viewer) to the runnable', async () => {
    let seen: { args: unknown; ctx: Partial<RunContext> } | undefined;
    const executor = createExecutor({
      runnables: {
        'f/a': {
          hash: 'v1',
          fn: (args, ctx) => {
            seen = {
              args,
              ctx: { jobId: ctx.jobId, workspace: ctx.workspace, viewer: ctx.viewer },
            };
            return 42;
          },
        },
      },
    });
    const job = jobFor('f/a', { args: { x: [1, 2] }, id: 'job-1' });
    const result = await executor.run(job);
    expect(result).toMatchObject({ jobId: 'job-1', value: 42, fromCache: false });
    expect(seen).toEqual({
      args: { x: [1, 2] },
      ctx: { jobId: 'job-1', workspace: 'ws', viewer: alice },
    });
  });

  it('a runnable mutating its args cannot change the caller’s args', async () => {
    const executor = createExecutor({
      runnables: {
        'f/mutate': {
          hash: 'v1',
          fn: (args) => {
            (args['list'] as unknown[]).push('added');
            (args['nested'] as Record<string, unknown>)['x'] = 'changed';
            args['extra'] = true;
            delete args['gone'];
            return args;
          },
        },
      },
    });
    const args = { list: [1], nested: { x: 1 }, gone: 'here' };
    const snapshot = structuredClone(args);
    const job = jobFor('f/mutate', { args });
    const result = await executor.run(job);
    expect(job.args).toEqual(snapshot);
    expect(args).toEqual(snapshot);
    expect(result.value).toEqual({ list: [1, 'added'], nested: { x: 'changed' }, extra: true });
  });

  it('defaults the hash to the function source, and honours an explicit one', () => {
    const executor = createExecutor({
      runnables: {
        'f/one': { fn: () => 1 },
        'f/two': { fn: () => 2 },
        'f/pinned': { fn: () => 3, hash: 'pinned', cacheTtlS: 5 },
      },
    });
    const one = executor.runnable('f/one')!;
    expect(one.hash).toMatch(/^[0-9a-f]{16}$/);
    expect(executor.runnable('f/two')!.hash).not.toBe(one.hash);
    expect(executor.runnable('f/pinned')).toEqual({
      path: 'f/pinned',
      hash: 'pinned',
      cacheTtlS: 5,
    });
    expect(executor.runnable('f/none')).toBeUndefined();
  });

  it('refuses bad definitions at construction', () => {
    expect(() => createExecutor(null as never)).toThrow(TypeError);
    expect(() => createExecutor({ runnables: null as never })).toThrow(TypeError);
    expect(() => createExecutor({ runnables: { 'f/x': {} as never } })).toThrow(TypeError);
    expect(() => createExecutor({ runnables: { 'f/x': { fn: () => 1, hash: '' } } })).toThrow(
      TypeError,
    );
    expect(() =>
      createExecutor({
        runnables: { 'f/x': { kind: 'sql', database: 'postgres://x', sql: 'select 1' } },
      }),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_DATATABLE_REF' }));
  });
});

describe('executor: errors', () => {
  const executor = createExecutor({
    runnables: {
      'f/a': { hash: 'v1', fn: () => 1 },
      'f/throws': {
        hash: 'v1',
        fn: () => {
          throw new TypeError('cannot read x of undefined');
        },
      },
      'f/rejects': { hash: 'v1', fn: async () => Promise.reject(new RangeError('late')) },
      'f/throws-string': {
        hash: 'v1',
        fn: () => {
          throw 'a string';
        },
      },
      'f/refuses': {
        hash: 'v1',
        fn: () => {
          throw new errors.E_NO_VIEWER();
        },
      },
    },
  });

  it('an unknown path is E_UNKNOWN_RUNNABLE, at createJob and at run', async () => {
    expect(() =>
      executor.createJob({
        workspace: 'ws',
        path: 'f/nope',
        runAs: alice,
        origin: { kind: 'schedule' },
      }),
    ).toThrow(expect.objectContaining({ code: 'E_UNKNOWN_RUNNABLE', status: 404 }));
    await expect(executor.run(jobFor('f/nope'))).rejects.toMatchObject({
      code: 'E_UNKNOWN_RUNNABLE',
    });
  });

  it('an unknown hash (another version) is E_UNKNOWN_RUNNABLE', async () => {
    await expect(executor.run(jobFor('f/a', { hash: 'v0' }))).rejects.toMatchObject({
      code: 'E_UNKNOWN_RUNNABLE',
    });
  });

  it.each([
    ['throws', TypeError, 'cannot read x of undefined'],
    ['rejects', RangeError, 'late'],
  ])(
    'a runnable that %s is E_EXECUTOR_FAILED with the original as cause',
    async (name, cls, msg) => {
      const err = await executor.run(jobFor(`f/${name}`)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(errors.E_EXECUTOR_FAILED);
      expect(err).toMatchObject({ code: 'E_EXECUTOR_FAILED', status: 500 });
      expect((err as Error).cause).toBeInstanceOf(cls);
      expect(((err as Error).cause as Error).message).toBe(msg);
    },
  );

  it('a thrown non-Error is wrapped too', async () => {
    const err = await executor.run(jobFor('f/throws-string')).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_EXECUTOR_FAILED' });
    expect(((err as Error).cause as Error).message).toBe('a string');
  });

  it('a refusal keeps its own code', async () => {
    await expect(executor.run(jobFor('f/refuses'))).rejects.toMatchObject({
      code: 'E_NO_VIEWER',
      status: 403,
    });
  });

  it('a runnable that never settles is E_EXECUTOR_TIMEOUT, and its signal is aborted', async () => {
    let signal: AbortSignal | undefined;
    const slow = createExecutor({
      timeout: 20,
      runnables: {
        'f/never': {
          hash: 'v1',
          fn: (_args, ctx) => {
            signal = ctx.signal;
            return new Promise(() => {});
          },
        },
      },
    });
    await expect(slow.run(jobFor('f/never'))).rejects.toMatchObject({
      code: 'E_EXECUTOR_TIMEOUT',
      status: 504,
    });
    expect(signal?.aborted).toBe(true);
  });

  it('a signal first read after the timeout comes aborted, and one read before hears the abort', async () => {
    // The signal is made only when a runnable asks for it: asked late, it must still say so.
    let heard = false;
    let readLate!: (signal: AbortSignal) => void;
    const late = new Promise<AbortSignal>((resolve) => {
      readLate = resolve;
    });
    let timedOut!: () => void;
    const ended = new Promise<void>((resolve) => {
      timedOut = resolve;
    });
    const slow = createExecutor({
      timeout: 20,
      runnables: {
        'f/late': {
          hash: 'v1',
          fn: async (_args, ctx) => {
            await ended;
            readLate(ctx.signal);
            return null;
          },
        },
        'f/early': {
          hash: 'v1',
          fn: (_args, ctx) =>
            new Promise((resolve) => {
              ctx.signal.addEventListener('abort', () => {
                heard = true;
                resolve(null);
              });
            }),
        },
      },
    });
    await expect(slow.run(jobFor('f/late'))).rejects.toMatchObject({ code: 'E_EXECUTOR_TIMEOUT' });
    timedOut();
    expect((await late).aborted).toBe(true);
    await expect(slow.run(jobFor('f/early'))).rejects.toMatchObject({
      code: 'E_EXECUTOR_TIMEOUT',
    });
    expect(heard).toBe(true);
  });
});

describe('executor: data tables', () => {
  it('ctx.datatable without a connector is E_DATATABLE_UNAVAILABLE', async () => {
    const executor = createExecutor({
      runnables: {
        'f/dt': { hash: 'v1', fn: (_a, ctx) => ctx.datatable('main', { as: 'viewer' }) },
      },
    });
    await expect(executor.run(jobFor('f/dt'))).rejects.toMatchObject({
      code: 'E_DATATABLE_UNAVAILABLE',
    });
  });

  it('passes the job and the parsed request to the connector', async () => {
    const connector = new FakeConnector();
    const executor = createExecutor({
      datatables: connector,
      runnables: {
        'f/dt': {
          hash: 'v1',
          fn: async (_a, ctx) => {
            await ctx.datatable('main', { as: 'viewer' });
            await ctx.datatable('main', { role: 'analyst' });
            await ctx.datatable('other');
            return null;
          },
        },
      },
    });
    const job = jobFor('f/dt');
    await executor.run(job);
    expect(connector.connects.map((c) => c.ref)).toEqual([
      { name: 'main', access: { kind: 'viewer' } },
      { name: 'main', access: { kind: 'role', role: 'analyst' } },
      { name: 'other', access: { kind: 'default' } },
    ]);
    expect(connector.connects.every((c) => c.job === job)).toBe(true);
    expect(connector.releases).toEqual([false, false, false]);
  });

  it.each([
    ['as anything but viewer', { as: 'admin' }],
    ['both as and role', { as: 'viewer', role: 'analyst' }],
    ['an unknown option', { user: 'x' }],
  ])('refuses a request with %s', async (_name, request) => {
    const connector = new FakeConnector();
    const executor = createExecutor({
      datatables: connector,
      runnables: {
        'f/dt': { hash: 'v1', fn: (_a, ctx) => ctx.datatable('main', request as never) },
      },
    });
    await expect(executor.run(jobFor('f/dt'))).rejects.toMatchObject({
      code: 'E_INVALID_DATATABLE_REF',
    });
    expect(connector.connects).toHaveLength(0);
  });

  it('refuses a reserved role name', async () => {
    const executor = createExecutor({
      datatables: new FakeConnector(),
      runnables: {
        'f/dt': { hash: 'v1', fn: (_a, ctx) => ctx.datatable('main', { role: 'admin' }) },
      },
    });
    await expect(executor.run(jobFor('f/dt'))).rejects.toMatchObject({
      code: 'E_INVALID_ROLE_NAME',
    });
  });

  it('runs a SQL runnable through the connector with its params, and releases the lease', async () => {
    const connector = new FakeConnector();
    const executor = createExecutor({
      datatables: connector,
      runnables: {
        'f/sql': {
          kind: 'sql',
          database: 'datatable://main?as=viewer',
          sql: 'select * from t where a = $1 and b = $2',
          params: ['a', 'b'],
        },
      },
    });
    const job = makeJob({ path: 'f/sql', hash: executor.runnable('f/sql')!.hash, args: { a: 1 } });
    const result = await executor.run(job);
    expect(result.value).toEqual([{ ref: 'viewer', values: [1, null] }]);
    expect(connector.queries).toEqual([
      { text: 'select * from t where a = $1 and b = $2', values: [1, null] },
    ]);
    expect(connector.releases).toEqual([false]);
  });

  it('a connector refusal keeps its code and leaves nothing to release', async () => {
    const connector = new FakeConnector();
    connector.refuse = new errors.E_NO_ROLES();
    const executor = createExecutor({
      datatables: connector,
      runnables: {
        'f/dt': { hash: 'v1', fn: (_a, ctx) => ctx.datatable('main', { as: 'viewer' }) },
      },
    });
    await expect(executor.run(jobFor('f/dt'))).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    expect(connector.releases).toEqual([]);
  });
});

describe('executor: leases are released however the job ends', () => {
  function setup(fn: (ctx: RunContext) => Promise<unknown>, timeout = 60_000) {
    const connector = new FakeConnector();
    const executor = createExecutor({
      datatables: connector,
      timeout,
      runnables: { 'f/dt': { hash: 'v1', fn: (_a, ctx) => fn(ctx) } },
    });
    return { connector, run: () => executor.run(jobFor('f/dt')) };
  }

  it('on success: every lease, reset for reuse', async () => {
    const { connector, run } = setup(async (ctx) => {
      const a = await ctx.datatable('main', { as: 'viewer' });
      const b = await ctx.datatable('main');
      await a.query('select 1');
      await b.query('select 2');
      return 'ok';
    });
    await run();
    expect(connector.releases).toEqual([false, false]);
  });

  it('on failure: every lease, reset for reuse', async () => {
    const { connector, run } = setup(async (ctx) => {
      await ctx.datatable('main', { as: 'viewer' });
      await ctx.datatable('main');
      throw new Error('runnable bug');
    });
    await expect(run()).rejects.toMatchObject({ code: 'E_EXECUTOR_FAILED' });
    expect(connector.releases).toEqual([false, false]);
  });

  it('on timeout: every lease, destroyed (it may be mid-query)', async () => {
    const { connector, run } = setup(async (ctx) => {
      await ctx.datatable('main', { as: 'viewer' });
      return new Promise(() => {});
    }, 20);
    await expect(run()).rejects.toMatchObject({ code: 'E_EXECUTOR_TIMEOUT' });
    expect(connector.releases).toEqual([true]);
  });

  it('on timeout while a connection is still opening: released when it arrives', async () => {
    const gate = deferred();
    const asked = deferred();
    const settled = deferred<unknown>();
    const { connector, run } = setup(async (ctx) => {
      const pending = ctx.datatable('main', { as: 'viewer' });
      pending.then(
        () => settled.resolve('handed a client after the job ended'),
        (err: unknown) => settled.resolve(err),
      );
      asked.resolve();
      await pending;
      return 'never reached in time';
    }, 20);
    connector.hold = gate.promise;
    const outcome = run();
    await asked.promise;
    await expect(outcome).rejects.toMatchObject({ code: 'E_EXECUTOR_TIMEOUT' });
    expect(connector.releases).toEqual([]);
    // the pool hands the connection over only now, after the job ended
    gate.resolve();
    expect(await settled.promise).toMatchObject({ code: 'E_EXECUTOR_TIMEOUT' });
    expect(connector.releases).toEqual([true]);
  });

  it('a lease that arrives after a runnable returned without awaiting it is released', async () => {
    const gate = deferred();
    const settled = deferred<unknown>();
    const { connector, run } = setup(async (ctx) => {
      // fire and forget: a runnable bug the executor must still clean up after
      ctx.datatable('main', { as: 'viewer' }).then(
        () => settled.resolve('handed a client after the job ended'),
        (err: unknown) => settled.resolve(err),
      );
      return 'done';
    });
    connector.hold = gate.promise;
    await run();
    gate.resolve();
    expect(await settled.promise).toBeInstanceOf(errors.E_EXECUTOR_FAILED);
    expect(connector.releases).toEqual([false]);
  });
});

describe('a bad data-table reference at registration', () => {
  it('is E_INVALID_DATATABLE_REF naming the runnable', () => {
    expect(() =>
      createExecutor({
        runnables: {
          'f/bad_ref': { kind: 'sql', sql: 'select 1', database: 'datatable://main?as=nobody' },
        },
      }),
    ).toThrow(/^runnable f\/bad_ref: /);
  });
});
