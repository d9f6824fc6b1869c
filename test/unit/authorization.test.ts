import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { DatatableRef } from '../../src/connector/datatable_ref.js';
import { JobAuthorization, type JobParties } from '../../src/datatable/access/authorization.js';
import {
  type CatalogDatatable,
  type CatalogRole,
  CatalogState,
} from '../../src/datatable/catalog/catalog_state.js';
import type { MembershipKind } from '../../src/datatable/catalog/directory.js';
import { ViewerCacheError } from '../../src/errors.js';

// The connection (grant) and the cache fingerprint come from one object. The property: over
// random catalogs and random single changes to them, two states give the same fingerprint
// exactly when every reference the job could make is granted the same way. If a rule reached
// the connection without reaching the fingerprint (or the fingerprint read something no grant
// depends on), some pair of states would tell them apart.

const WS = 'ws';
const RUNNER = 'runner@x';
const VIEWER = 'viewer@x';
const TENANTS = [
  '*',
  `user:${VIEWER}`,
  `user:${RUNNER}`,
  'group:g1',
  'group:g2',
  'folder:f',
  'embed:*',
  'embed:orders',
];
/** Stands for an embed viewer of app `orders` (the viewer arbitrary's fourth kind). */
const EMBED = 'embed viewer';
const NAMES = ['main', 'other'];

interface Config {
  datatables: { name: string; database: string; defaultRole: number | null }[];
  roles: {
    oid: number;
    datatable: string;
    name: string;
    enabled: boolean;
    version: number;
    safe: boolean;
    tenants: string[];
  }[];
  memberships: { email: string; kind: MembershipKind; name: string }[];
}

const configArb: fc.Arbitrary<Config> = fc
  .record({
    datatables: fc.uniqueArray(
      fc.record({
        name: fc.constantFrom(...NAMES),
        database: fc.constantFrom('db1', 'db2'),
        defaultRole: fc.option(fc.constantFrom(101, 102, 103, 104), { nil: null }),
      }),
      { selector: (d) => d.name, maxLength: 2 },
    ),
    roles: fc.uniqueArray(
      fc.record({
        oid: fc.constantFrom(101, 102, 103, 104),
        datatable: fc.constantFrom(...NAMES),
        name: fc.constantFrom('r1', 'r2', 'r3', 'r4', 'admin'),
        enabled: fc.boolean(),
        version: fc.nat(3),
        safe: fc.boolean(),
        tenants: fc.subarray(TENANTS, { maxLength: 3 }),
      }),
      { selector: (r) => r.oid, maxLength: 4 },
    ),
    memberships: fc.uniqueArray(
      fc.record({
        email: fc.constantFrom(RUNNER, VIEWER),
        kind: fc.constantFrom<MembershipKind>('group', 'folder', 'admin'),
        name: fc.constantFrom('g1', 'g2', 'f'),
      }),
      { selector: (m) => `${m.email}/${m.kind}/${m.name}`, maxLength: 4 },
    ),
  })
  // Role names are unique in a workspace, as in Postgres.
  .map((config) => ({
    ...config,
    roles: config.roles.filter(
      (role, i) => config.roles.findIndex((other) => other.name === role.name) === i,
    ),
  }));

/** One small change an operator could make, or none. */
const changeArb = fc.record({
  kind: fc.constantFrom(
    'none',
    'toggle-enabled',
    'toggle-safe',
    'tenants',
    'membership',
    'default-role',
    'database',
    'rename',
    'drop-role',
    'drop-datatable',
  ),
  pick: fc.nat(),
  tenants: fc.subarray(TENANTS, { maxLength: 3 }),
  membership: fc.record({
    email: fc.constantFrom(RUNNER, VIEWER),
    kind: fc.constantFrom<MembershipKind>('group', 'folder', 'admin'),
    name: fc.constantFrom('g1', 'g2', 'f'),
  }),
  role: fc.option(fc.constantFrom(101, 102, 103, 104), { nil: null }),
});

type Change = typeof changeArb extends fc.Arbitrary<infer T> ? T : never;

function change(config: Config, c: Change): Config {
  const next: Config = structuredClone(config);
  const role = next.roles[c.pick % Math.max(1, next.roles.length)];
  const datatable = next.datatables[c.pick % Math.max(1, next.datatables.length)];
  switch (c.kind) {
    case 'toggle-enabled':
      // As disableRole/enableRole do: the role's version moves with it.
      if (role) {
        role.enabled = !role.enabled;
        role.version++;
      }
      break;
    case 'toggle-safe':
      if (role) role.safe = !role.safe;
      break;
    case 'tenants':
      if (role) role.tenants = c.tenants;
      break;
    case 'membership': {
      const i = next.memberships.findIndex(
        (m) =>
          m.email === c.membership.email &&
          m.kind === c.membership.kind &&
          m.name === c.membership.name,
      );
      if (i === -1) next.memberships.push(c.membership);
      else next.memberships.splice(i, 1);
      break;
    }
    case 'default-role':
      if (datatable) datatable.defaultRole = c.role;
      break;
    case 'database':
      if (datatable) datatable.database = datatable.database === 'db1' ? 'db2' : 'db1';
      break;
    case 'rename':
      if (role && !next.roles.some((r) => r.name === 'r9')) role.name = 'r9';
      break;
    case 'drop-role':
      if (role) next.roles.splice(next.roles.indexOf(role), 1);
      break;
    case 'drop-datatable':
      if (datatable) next.datatables.splice(next.datatables.indexOf(datatable), 1);
      break;
  }
  return next;
}

function stateOf(config: Config): CatalogState {
  const datatables: CatalogDatatable[] = config.datatables.map((d) => ({ workspace: WS, ...d }));
  const roles: CatalogRole[] = config.roles.map((r) => ({
    workspace: WS,
    secret: Buffer.alloc(0),
    ...r,
  }));
  const memberships = config.memberships.map((m) => ({ workspace: WS, ...m }));
  return new CatalogState(7, datatables, roles, memberships, 'catalog');
}

function authorizationOf(
  state: CatalogState,
  viewer: string | null,
  roleScope?: readonly number[],
): JobAuthorization {
  const parties: JobParties = {
    workspace: WS,
    runner: { email: RUNNER, principals: state.principals(WS, RUNNER) },
    viewer:
      viewer === null || viewer === EMBED
        ? null
        : { email: viewer, principals: state.principals(WS, viewer) },
    ...(viewer === EMBED ? { embed: { app: 'orders' } } : {}),
    ...(roleScope === undefined ? {} : { roleScope }),
  };
  return new JobAuthorization(state, parties);
}

/** Every reference the job could make, including unknown names. */
const REFS: DatatableRef[] = [...NAMES, 'missing'].flatMap((name) => [
  { name, access: { kind: 'viewer' } } as const,
  { name, access: { kind: 'default' } } as const,
  ...['r1', 'r2', 'r3', 'r4', 'r9', 'admin', 'nobody'].map(
    (role) => ({ name, access: { kind: 'role', role } }) as const,
  ),
  // Narrowed viewer requests have no fingerprint part of their own: the property below checks
  // that the rest of the fingerprint covers them.
  ...[['r1'], ['r1', 'r2'], ['r2', 'r3', 'r4'], ['r9'], ['nobody', 'r1'], ['admin']].map(
    (roles) => ({ name, access: { kind: 'narrowed', roles } }) as const,
  ),
]);

function outcomes(authorization: JobAuthorization): string[] {
  return REFS.map((ref) => {
    try {
      const grant = authorization.grant(ref);
      return `${grant.datatable.database}:${grant.roles.map((r) => r.oid).join(',')}`;
    } catch (err) {
      if (err instanceof ViewerCacheError) return err.code;
      throw err;
    }
  });
}

describe('JobAuthorization: one source for the connection and the fingerprint', () => {
  it('same fingerprint ⇔ same grant for every reference (random catalogs and changes)', () => {
    let equal = 0;
    let different = 0;
    fc.assert(
      fc.property(
        configArb,
        changeArb,
        fc.constantFrom<string | null>(VIEWER, null, RUNNER, EMBED),
        (config, c, viewer) => {
          const before = authorizationOf(stateOf(config), viewer);
          const after = authorizationOf(stateOf(change(config, c)), viewer);
          const sameGrants = outcomes(before).join('|') === outcomes(after).join('|');
          if (sameGrants) equal++;
          else different++;
          expect(before.fingerprint === after.fingerprint).toBe(sameGrants);
        },
      ),
      { numRuns: 3000 },
    );
    // Both sides of the equivalence were exercised, not just one.
    expect(equal).toBeGreaterThan(300);
    expect(different).toBeGreaterThan(300);
    // 3,000 catalogs take a few seconds on a busy 2-core machine.
  }, 30_000);

  it('the same equivalence holds under a role scope (a scoped API key)', () => {
    let different = 0;
    fc.assert(
      fc.property(
        configArb,
        changeArb,
        fc.constantFrom<string | null>(VIEWER, null, RUNNER),
        fc.subarray([101, 102, 103, 104]),
        (config, c, viewer, scope) => {
          const before = authorizationOf(stateOf(config), viewer, scope);
          const after = authorizationOf(stateOf(change(config, c)), viewer, scope);
          const sameGrants = outcomes(before).join('|') === outcomes(after).join('|');
          if (!sameGrants) different++;
          expect(before.fingerprint === after.fingerprint).toBe(sameGrants);
        },
      ),
      { numRuns: 1000 },
    );
    expect(different).toBeGreaterThan(50);
  }, 30_000);

  it('never grants admin, and a run with no viewer is refused as the viewer', () => {
    const state = stateOf({
      datatables: [{ name: 'main', database: 'db1', defaultRole: null }],
      roles: [
        {
          oid: 101,
          datatable: 'main',
          name: 'admin',
          enabled: true,
          version: 0,
          safe: true,
          tenants: ['*'],
        },
      ],
      memberships: [{ email: RUNNER, kind: 'admin', name: 'ws' }],
    });
    const anonymous = authorizationOf(state, null);
    expect(() => anonymous.grant({ name: 'main', access: { kind: 'viewer' } })).toThrow(
      expect.objectContaining({ code: 'E_NO_VIEWER', datatable: 'main' }),
    );
    const viewer = authorizationOf(state, VIEWER);
    expect(() => viewer.grant({ name: 'main', access: { kind: 'viewer' } })).toThrow(
      expect.objectContaining({ code: 'E_NO_ROLES' }),
    );
    expect(() => viewer.grant({ name: 'main', access: { kind: 'role', role: 'admin' } })).toThrow(
      expect.objectContaining({ code: 'E_ROLE_NOT_PERMITTED', role: 'admin' }),
    );
  });

  it('a narrowed viewer request grants the viewer roles it names, and nothing else', () => {
    const role = (oid: number, name: string, tenants: string[], datatable = 'main') => ({
      oid,
      datatable,
      name,
      enabled: true,
      version: 0,
      safe: true,
      tenants,
    });
    const state = stateOf({
      datatables: [
        { name: 'main', database: 'db1', defaultRole: null },
        { name: 'other', database: 'db2', defaultRole: null },
      ],
      roles: [
        role(101, 'provider', ['group:g1']),
        role(102, 'system_admin', ['group:g2']),
        role(103, 'auditor', [`user:${RUNNER}`]),
        role(104, 'elsewhere', ['*'], 'other'),
      ],
      memberships: [
        { email: VIEWER, kind: 'group', name: 'g1' },
        { email: VIEWER, kind: 'group', name: 'g2' },
      ],
    });
    const narrowed = (...roles: string[]): DatatableRef => ({
      name: 'main',
      access: { kind: 'narrowed', roles },
    });
    const viewer = authorizationOf(state, VIEWER);
    const oids = (ref: DatatableRef, of = viewer) => of.grant(ref).roles.map((r) => r.oid);
    expect(oids({ name: 'main', access: { kind: 'viewer' } })).toEqual([101, 102]);
    expect(oids(narrowed('provider'))).toEqual([101]);
    expect(oids(narrowed('provider', 'system_admin'))).toEqual([101, 102]);
    // Holding only some of the named roles gives the held ones.
    expect(oids(narrowed('auditor', 'system_admin'))).toEqual([102]);
    // Holding none of them: refused, never widened to the viewer's other roles.
    expect(() => viewer.grant(narrowed('auditor'))).toThrow(
      expect.objectContaining({ code: 'E_ROLE_REQUIRED', datatable: 'main' }),
    );
    // A name that is no role of this data table: the runnable's mistake, said so.
    for (const name of ['nobody', 'elsewhere']) {
      expect(() => viewer.grant(narrowed('provider', name))).toThrow(
        expect.objectContaining({ code: 'E_UNKNOWN_ROLE', role: name }),
      );
    }
    expect(() => authorizationOf(state, null).grant(narrowed('provider'))).toThrow(
      expect.objectContaining({ code: 'E_NO_VIEWER' }),
    );
    // A scoped key: the viewer's roles within the scope, then the narrowing.
    const scoped = authorizationOf(state, VIEWER, [102]);
    expect(oids(narrowed('provider', 'system_admin'), scoped)).toEqual([102]);
    expect(() => scoped.grant(narrowed('provider'))).toThrow(
      expect.objectContaining({ code: 'E_ROLE_REQUIRED' }),
    );
    // The runner's roles play no part: the runner holds auditor, the viewer does not.
    expect(() => authorizationOf(state, VIEWER).grant(narrowed('auditor'))).toThrow(
      expect.objectContaining({ code: 'E_ROLE_REQUIRED' }),
    );
  });

  it('the fingerprint carries the catalog id, not the generation', () => {
    const config: Config = {
      datatables: [{ name: 'main', database: 'db1', defaultRole: null }],
      roles: [
        {
          oid: 101,
          datatable: 'main',
          name: 'r1',
          enabled: true,
          version: 0,
          safe: true,
          tenants: ['*'],
        },
      ],
      memberships: [],
    };
    const roles = (c: Config): CatalogRole[] =>
      c.roles.map((r) => ({ workspace: WS, secret: Buffer.alloc(0), ...r }));
    const datatables = config.datatables.map((d) => ({ workspace: WS, ...d }));
    const at = (generation: number, catalogId: string, c = config) =>
      authorizationOf(new CatalogState(generation, datatables, roles(c), [], catalogId), VIEWER)
        .fingerprint;
    expect(at(7, 'catalog')).toBe(at(8, 'catalog'));
    expect(at(7, 'catalog')).not.toBe(at(7, 'another catalog'));
    // Disabled and enabled again: same grants, but never the same fingerprint as before.
    const cycled = structuredClone(config);
    cycled.roles[0]!.version = 2;
    expect(at(9, 'catalog', cycled)).not.toBe(at(7, 'catalog'));
  });
});
