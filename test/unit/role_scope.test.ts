import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalKeyInput } from '../../src/cache/cache_key.js';
import type { DatatableRef } from '../../src/connector/datatable_ref.js';
import { JobAuthorization } from '../../src/datatable/access/authorization.js';
import { JobAuthorizations } from '../../src/datatable/access/job_authorizations.js';
import type { CatalogSnapshot } from '../../src/datatable/catalog/catalog_snapshot.js';
import { type CatalogRole, CatalogState } from '../../src/datatable/catalog/catalog_state.js';
import { ViewerCacheError } from '../../src/errors.js';
import {
  cachedResultPath,
  createExecutor,
  type Job,
  type RunOrigin,
  recordRoleScope,
} from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

// Scoped API keys (issue 9 §4): a run started with a key scoped to some roles gets at most its
// principals' roles ∩ the scope, its cache key tells it apart from every other scope (and from
// no scope), and nothing — a child job, a memoised authorization — widens it.

const scoped = (job: Job, roleScope: readonly number[] | undefined): Job => ({
  ...job,
  perms: roleScope === undefined ? job.perms : { ...job.perms, roleScope },
});

describe('recordRoleScope', () => {
  const parent = (roleScope?: number[]): RunOrigin => ({
    kind: 'job-token',
    parent: {
      perms: { email: 'p@x', endUserEmail: 'v@x', ...(roleScope ? { roleScope } : {}) },
    },
  });
  const run: RunOrigin = { kind: 'run', caller: { email: 'v@x' } };

  it('is the credential scope, canonical (sorted, no duplicates); none is undefined', () => {
    expect(recordRoleScope(run)).toBeUndefined();
    expect(recordRoleScope(run, [3, 1, 3, 2])).toEqual([1, 2, 3]);
    expect(recordRoleScope(run, [])).toEqual([]);
  });

  it('is a frozen copy: changing the array passed in changes no job', () => {
    const passed = [1, 2];
    const recorded = recordRoleScope(run, passed)!;
    passed.push(3);
    expect(recorded).toEqual([1, 2]);
    expect(Object.isFrozen(recorded)).toBe(true);
  });

  it("a child is never wider than its parent: the parent's scope ∩ its own", () => {
    expect(recordRoleScope(parent([1, 2]))).toEqual([1, 2]);
    expect(recordRoleScope(parent([1, 2]), [2, 3])).toEqual([2]);
    expect(recordRoleScope(parent([1]), [2])).toEqual([]);
    expect(recordRoleScope(parent(), [2])).toEqual([2]);
    expect(recordRoleScope(parent())).toBeUndefined();
  });

  it('refuses anything but catalog ids with E_INVALID_JOB', () => {
    for (const bad of [[0], [-1], [1.5], ['1'], [2 ** 32], 'x', null]) {
      expect(() => recordRoleScope(run, bad as unknown as number[])).toThrow(
        expect.objectContaining({ code: 'E_INVALID_JOB' }),
      );
    }
  });

  it('the executor records it on the job, and a child job inherits it', async () => {
    const seen: Job[] = [];
    const executor = createExecutor({
      runnables: {
        parent: { fn: (_args, ctx) => ctx.runChild('child') },
        child: { fn: () => 'ok' },
      },
    });
    const spy = {
      run: (job: Job) => {
        seen.push(job);
        return executor.run(job, { dispatcher: spy });
      },
    };
    const job = executor.createJob({
      workspace: 'ws',
      path: 'parent',
      runAs: 'v@x',
      origin: run,
      roleScope: [7, 5],
    });
    expect(job.perms.roleScope).toEqual([5, 7]);
    await spy.run(job);
    expect(seen.map((j) => j.perms.roleScope)).toEqual([
      [5, 7],
      [5, 7],
    ]);
    const plain = executor.createJob({
      workspace: 'ws',
      path: 'parent',
      runAs: 'v@x',
      origin: run,
    });
    expect('roleScope' in plain.perms).toBe(false);
  });
});

describe('cache key with a role scope', () => {
  const base = makeJob({ viewer: 'alice@example.com', args: { region: 'eu', limit: 10 } });

  it('leaves unscoped keys byte-identical to the keys before scopes existed', () => {
    // Computed on main before this change (same job, same fingerprint).
    const job = { ...base, runnable: { path: 'f/app/report', hash: 'h1' } };
    expect(cachedResultPath(job, 'c1;fp')).toBe(
      'ws/cache/27fcf0497f3da6965aa8da2b4b8339ddfa42e067bc10d69892166540aa8167b3',
    );
    expect(cachedResultPath({ ...job, perms: { ...job.perms, endUserEmail: null } })).toBe(
      'ws/cache/79cbe4d25d7bc92fba37b12f08fa8ef08c9e0ee5503226e93276850012d3af6d',
    );
  });

  it('unscoped, [], and every scope are different keys; order and duplicates are not', () => {
    const keys = [undefined, [], [1], [2], [1, 2], [12]].map((s) =>
      cachedResultPath(scoped(base, s)),
    );
    expect(new Set(keys).size).toBe(6);
    expect(cachedResultPath(scoped(base, [2, 1, 2]))).toBe(cachedResultPath(scoped(base, [1, 2])));
  });

  it('a malformed scope is refused, never read as unscoped', () => {
    for (const bad of [null, [0], ['1'], {}]) {
      expect(() => cachedResultPath(scoped(base, bad as unknown as number[]))).toThrow(
        expect.objectContaining({ code: 'E_INVALID_JOB' }),
      );
    }
  });

  it('property: keys are equal exactly when (viewer, fingerprint, args, scope) are', () => {
    const input = fc.record({
      viewer: fc.constantFrom<string | null>(null, '', 'a@x', 'a@x"],[1'),
      fingerprint: fc.constantFrom<string | null>(null, '', '[1]', 's'),
      args: fc.dictionary(fc.constantFrom('a', 'b', ']'), fc.constantFrom<unknown>(1, '[1]', [1]), {
        maxKeys: 2,
      }),
      scope: fc.option(fc.uniqueArray(fc.integer({ min: 1, max: 4 }), { maxLength: 3 }), {
        nil: undefined,
      }),
    });
    type Input = typeof input extends fc.Arbitrary<infer T> ? T : never;
    const jobOf = (i: Input) =>
      scoped(makeJob({ viewer: i.viewer, args: i.args as Record<string, unknown> }), i.scope);
    const canonical = (i: Input) =>
      JSON.stringify([
        i.viewer,
        i.fingerprint,
        Object.entries(i.args).sort(([a], [b]) => (a < b ? -1 : 1)),
        i.scope === undefined ? 'unscoped' : [...i.scope].sort((a, b) => a - b),
      ]);
    fc.assert(
      fc.property(input, input, (a, b) => {
        const sameKey =
          cachedResultPath(jobOf(a), a.fingerprint) === cachedResultPath(jobOf(b), b.fingerprint);
        expect(sameKey).toBe(canonical(a) === canonical(b));
        // And the input is one JSON value whose last element is the scope when there is one.
        const parsed = JSON.parse(canonicalKeyInput(jobOf(a), a.fingerprint)) as unknown[];
        expect(parsed.length).toBe(a.scope === undefined ? 7 : 8);
      }),
      { numRuns: 2000 },
    );
  });
});

// A small catalog: the owner holds r1, r2, r3 (tenants) and may use r4 by name (workspace
// admin); r5 is nobody's; r1 is also the default role of `main`.
const WS = 'ws';
const OWNER = 'owner@x';
function role(oid: number, name: string, tenants: string[], enabled = true): CatalogRole {
  return {
    oid,
    workspace: WS,
    datatable: 'main',
    name,
    enabled,
    version: 0,
    tenants,
    secret: Buffer.alloc(0),
    safe: true,
  };
}
function stateOf(disabled: number[] = []): CatalogState {
  const owner = `user:${OWNER}`;
  return new CatalogState(
    1,
    [{ workspace: WS, name: 'main', database: 'db', defaultRole: 101 }],
    [
      role(101, 'r1', [owner], !disabled.includes(101)),
      role(102, 'r2', [owner], !disabled.includes(102)),
      role(103, 'r3', ['group:g'], !disabled.includes(103)),
      role(104, 'r4', ['user:someone@x']),
      role(105, 'r5', ['user:someone@x']),
    ],
    [
      { workspace: WS, email: OWNER, kind: 'group', name: 'g' },
      { workspace: WS, email: OWNER, kind: 'admin', name: WS },
    ],
    'catalog',
  );
}
function authorizationOf(state: CatalogState, roleScope?: number[]): JobAuthorization {
  const principals = state.principals(WS, OWNER);
  return new JobAuthorization(state, {
    workspace: WS,
    runner: { email: OWNER, principals },
    viewer: { email: OWNER, principals },
    ...(roleScope === undefined
      ? {}
      : { roleScope: recordRoleScope({ kind: 'schedule' }, roleScope) }),
  });
}
const viewerRef: DatatableRef = { name: 'main', access: { kind: 'viewer' } };
const byName = (name: string): DatatableRef => ({
  name: 'main',
  access: { kind: 'role', role: name },
});
const defaultRef: DatatableRef = { name: 'main', access: { kind: 'default' } };
const outcome = (authorization: JobAuthorization, ref: DatatableRef): string => {
  try {
    return authorization
      .grant(ref)
      .roles.map((r) => r.name)
      .join(',');
  } catch (err) {
    if (err instanceof ViewerCacheError) return err.code;
    throw err;
  }
};

describe('JobAuthorization with a role scope: owner ∩ key, never more', () => {
  it('narrows the viewer to the intersection; an empty one is E_NO_ROLES', () => {
    const state = stateOf();
    expect(outcome(authorizationOf(state), viewerRef)).toBe('r1,r2,r3');
    expect(outcome(authorizationOf(state, [101, 102]), viewerRef)).toBe('r1,r2');
    expect(outcome(authorizationOf(state, [101, 105]), viewerRef)).toBe('r1');
    expect(outcome(authorizationOf(state, [105]), viewerRef)).toBe('E_NO_ROLES');
    expect(outcome(authorizationOf(state, []), viewerRef)).toBe('E_NO_ROLES');
    expect(outcome(authorizationOf(stateOf([101]), [101]), viewerRef)).toBe('E_NO_ROLES');
  });

  it('narrows ?role= and the default role too', () => {
    const state = stateOf();
    expect(outcome(authorizationOf(state), byName('r4'))).toBe('r4'); // admin may use it
    expect(outcome(authorizationOf(state, [101]), byName('r4'))).toBe('E_ROLE_NOT_PERMITTED');
    expect(outcome(authorizationOf(state, [104]), byName('r4'))).toBe('r4');
    expect(outcome(authorizationOf(state, [102]), defaultRef)).toBe('E_ROLE_NOT_PERMITTED');
    expect(outcome(authorizationOf(state, [101]), defaultRef)).toBe('r1');
  });

  it('ctx.hasRole (viewerHolds) sees the scoped set', () => {
    const authorization = authorizationOf(stateOf(), [102]);
    expect(authorization.viewerHolds('main', 'r2')).toBe(true);
    expect(authorization.viewerHolds('main', 'r1')).toBe(false);
    expect(authorization.viewerHolds('main', 'r3')).toBe(false);
  });

  it('property: every grant under a scope is the unscoped grant restricted to it, or refused', () => {
    const state = stateOf();
    const unscoped = authorizationOf(state);
    const refs = [viewerRef, defaultRef, ...['r1', 'r2', 'r3', 'r4', 'r5'].map(byName)];
    fc.assert(
      fc.property(fc.uniqueArray(fc.integer({ min: 100, max: 106 }), { maxLength: 4 }), (scope) => {
        const narrowed = authorizationOf(state, scope);
        const names = new Set(
          state
            .roles(WS)
            .filter((r) => scope.includes(r.oid))
            .map((r) => r.name),
        );
        for (const ref of refs) {
          const wide = outcome(unscoped, ref);
          const got = outcome(narrowed, ref);
          if (got.startsWith('E_')) continue; // a refusal never widens
          const kept = wide.split(',').filter((name) => names.has(name));
          expect(got.split(',')).toEqual(kept);
          expect(kept.length).toBeGreaterThan(0);
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe('the authorization memo keys on the scope (a shared memo would be a leak)', () => {
  const snapshotOf = (state: CatalogState) =>
    ({ freshState: () => state, current: async () => state }) as unknown as CatalogSnapshot;
  const job = (roleScope?: number[]) =>
    scoped(makeJob({ workspace: WS, runAs: OWNER, viewer: OWNER }), roleScope);

  it('same runner and viewer, two scopes: two grants, two fingerprints, in either order', () => {
    for (const order of [
      [undefined, [102]],
      [[102], undefined],
      [[101], [102]],
    ] as const) {
      const authorizations = new JobAuthorizations(snapshotOf(stateOf()), null);
      const [first, second] = order.map((s) => authorizations.of(job(s as number[] | undefined)));
      const names = (a: unknown) => outcome(a as JobAuthorization, viewerRef);
      expect(names(first)).toBe(
        order[0] === undefined ? 'r1,r2,r3' : order[0][0] === 101 ? 'r1' : 'r2',
      );
      expect(names(second)).toBe(order[1] === undefined ? 'r1,r2,r3' : 'r2');
      expect(fullFingerprint(authorizations, job(order[0] as number[] | undefined))).not.toBe(
        fullFingerprint(authorizations, job(order[1] as number[] | undefined)),
      );
    }
  });

  it('the runner part is not shared across scopes either (no viewer: ?role= alone differs)', () => {
    const authorizations = new JobAuthorizations(snapshotOf(stateOf()), null);
    const noViewer = (roleScope?: number[]) =>
      scoped(makeJob({ workspace: WS, runAs: OWNER }), roleScope);
    const wide = fullFingerprint(authorizations, noViewer());
    const narrow = fullFingerprint(authorizations, noViewer([101]));
    expect(narrow).not.toBe(wide);
    expect(outcome(authorizations.of(noViewer([101])) as JobAuthorization, byName('r4'))).toBe(
      'E_ROLE_NOT_PERMITTED',
    );
    expect(outcome(authorizations.of(noViewer()) as JobAuthorization, byName('r4'))).toBe('r4');
  });
});

/** The full (workspace-wide) fingerprint of a job: what every reference would grant it. */
function fullFingerprint(authorizations: JobAuthorizations, job: Job): string {
  return (authorizations.of(job) as JobAuthorization).fingerprint;
}
