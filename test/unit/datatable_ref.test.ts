import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  accessFromRoleName,
  accessToRoleName,
  DATATABLE_VIEWER_ROLE,
  type DatatableAccess,
  type DatatableRef,
  type DatatableRequest,
  datatableRefOf,
  formatDatatableRef,
  parseDatatableRef,
  validateRoleName,
} from '../../src/connector/datatable_ref.js';
import { InvalidDatatableRefError } from '../../src/errors.js';
import * as before from '../fixtures/datatable_ref_before_narrowing.js';

// SPEC invariants 6 and 9: the reference grammar is strict, and role names reserve `admin`, the
// `wm_set_` prefix and the viewer marker.

const REF = 'E_INVALID_DATATABLE_REF';
const ROLE = 'E_INVALID_ROLE_NAME';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code ?? 'no code';
  }
  return undefined;
}

describe('parseDatatableRef refuses', () => {
  const refused: [string, string, string][] = [
    // [why, reference, code]
    ['an unknown parameter', 'datatable://main?user=alice', REF],
    ['an unknown parameter beside a known one', 'datatable://main?as=viewer&x=1', REF],
    ['a parameter in another case', 'datatable://main?AS=viewer', REF],
    ['a repeated role', 'datatable://main?role=a&role=b', REF],
    ['a repeated identical role', 'datatable://main?role=a&role=a', REF],
    ['a repeated as', 'datatable://main?as=viewer&as=viewer', REF],
    ['both as and role', 'datatable://main?as=viewer&role=sales', REF],
    ['both role and as', 'datatable://main?role=sales&as=viewer', REF],
    ['as=admin', 'datatable://main?as=admin', REF],
    ['as=Viewer', 'datatable://main?as=Viewer', REF],
    ['as=viewer2', 'datatable://main?as=viewer2', REF],
    ['as= (empty)', 'datatable://main?as=', REF],
    ['role= (empty)', 'datatable://main?role=', REF],
    ['an empty name', 'datatable://', REF],
    ['an empty name with a query', 'datatable://?as=viewer', REF],
    ['an uppercase name', 'datatable://Main', REF],
    ['a name starting with a digit', 'datatable://1main', REF],
    ['a name starting with _', 'datatable://_main', REF],
    ['a name with -', 'datatable://ma-in', REF],
    ['a name with a space', 'datatable://ma in', REF],
    ['a name with a dot', 'datatable://ma.in', REF],
    ['a 64-character name', `datatable://${'a'.repeat(64)}`, REF],
    ['an empty query', 'datatable://main?', REF],
    ['&&', 'datatable://main?as=viewer&&role=x', REF],
    ['a trailing &', 'datatable://main?as=viewer&', REF],
    ['a leading &', 'datatable://main?&as=viewer', REF],
    ['a key without =', 'datatable://main?as', REF],
    ['a role key without =', 'datatable://main?role', REF],
    ['an empty key', 'datatable://main?=viewer', REF],
    ['an encoded =', 'datatable://main?as%3Dviewer', REF],
    ['a lone %', 'datatable://main?role=%', REF],
    ['a truncated escape', 'datatable://main?role=ab%4', REF],
    ['a non-hex escape', 'datatable://main?role=%zz', REF],
    ['an escape that is not UTF-8', 'datatable://main?role=%ff', REF],
    ['a half UTF-8 sequence', 'datatable://main?role=%C3', REF],
    ['a raw non-ASCII value', 'datatable://main?role=rôle', REF],
    ['a raw / in a value', 'datatable://main?role=a/b', REF],
    ['a + in a value', 'datatable://main?role=a+b', REF],
    ['a fragment', 'datatable://main#frag', REF],
    ['a fragment after the query', 'datatable://main?as=viewer#frag', REF],
    ['an empty fragment', 'datatable://main?as=viewer#', REF],
    ['another scheme', 'postgres://main', REF],
    ['an uppercase scheme', 'DATATABLE://main', REF],
    ['a single slash', 'datatable:/main', REF],
    ['no scheme', 'main', REF],
    ['leading space', ' datatable://main', REF],
    ['trailing space', 'datatable://main ', REF],
    ['a trailing slash', 'datatable://main/', REF],
    ['a trailing slash before the query', 'datatable://main/?as=viewer', REF],
    ['a path', 'datatable://main/x', REF],
    ['user info', 'datatable://u@main', REF],
    ['a port', 'datatable://main:5432', REF],
    ['the empty string', '', REF],
    ['role=admin', 'datatable://main?role=admin', ROLE],
    ['role=wm_set_…', 'datatable://main?role=wm_set_abc', ROLE],
    ['role=pg_…', 'datatable://main?role=pg_read_all_data', ROLE],
    ['role=public', 'datatable://main?role=public', ROLE],
    ['role=current_user', 'datatable://main?role=current_user', ROLE],
    ['role=%40viewer (the marker, escaped)', 'datatable://main?role=%40viewer', ROLE],
    ['role=%41 (uppercase once decoded)', 'datatable://main?role=%41bc', ROLE],
    ['role=%C3%A9 (non-ASCII once decoded)', 'datatable://main?role=%C3%A9', ROLE],
    ['role=%00', 'datatable://main?role=%00', ROLE],
    ['role=%20x', 'datatable://main?role=%20x', ROLE],
    ['role=Sales', 'datatable://main?role=Sales', ROLE],
    ['role=1abc', 'datatable://main?role=1abc', ROLE],
    ['role=a.b', 'datatable://main?role=a.b', ROLE],
    ['role=a-b', 'datatable://main?role=a-b', ROLE],
    ['a 64-character role', `datatable://main?role=${'r'.repeat(64)}`, ROLE],
    // Narrowing: roles= only beside as=viewer, a list of valid names.
    ['roles= alone', 'datatable://main?roles=provider', REF],
    ['roles= beside role=', 'datatable://main?role=sales&roles=sales', REF],
    ['roles= beside as=viewer and role=', 'datatable://main?as=viewer&role=a&roles=a', REF],
    ['roles= (empty)', 'datatable://main?as=viewer&roles=', REF],
    ['a repeated roles=', 'datatable://main?as=viewer&roles=a&roles=b', REF],
    ['an empty item', 'datatable://main?as=viewer&roles=a,,b', REF],
    ['a trailing comma', 'datatable://main?as=viewer&roles=a,', REF],
    ['a leading comma', 'datatable://main?as=viewer&roles=,a', REF],
    ['a lone comma', 'datatable://main?as=viewer&roles=,', REF],
    ['as=admin beside roles=', 'datatable://main?as=admin&roles=a', REF],
    ['a parameter in another case', 'datatable://main?as=viewer&ROLES=a', REF],
    ['role (singular) beside as', 'datatable://main?as=viewer&role=a', REF],
    ['a space after a comma', 'datatable://main?as=viewer&roles=a,%20b', ROLE],
    ['an escaped comma', 'datatable://main?as=viewer&roles=a%2Cb', ROLE],
    ['roles=admin', 'datatable://main?as=viewer&roles=admin', ROLE],
    ['roles=…,wm_set_…', 'datatable://main?as=viewer&roles=a,wm_set_x', ROLE],
    ['roles=%40viewer', 'datatable://main?as=viewer&roles=%40viewer', ROLE],
    ['roles=Provider', 'datatable://main?as=viewer&roles=Provider', ROLE],
    ['roles=pg_…', 'datatable://main?as=viewer&roles=pg_read_all_data', ROLE],
  ];
  for (const [why, ref, code] of refused) {
    it(`${why}: ${JSON.stringify(ref)} → ${code}`, () => {
      expect(codeOf(() => parseDatatableRef(ref))).toBe(code);
    });
  }

  it('anything that is not a string', () => {
    for (const value of [undefined, null, 42, {}, ['datatable://main']]) {
      expect(codeOf(() => parseDatatableRef(value as unknown as string))).toBe(REF);
    }
  });
});

describe('parseDatatableRef accepts exactly the four forms', () => {
  const accepted: [string, DatatableRef][] = [
    ['datatable://main', { name: 'main', access: { kind: 'default' } }],
    ['datatable://m', { name: 'm', access: { kind: 'default' } }],
    ['datatable://main_2', { name: 'main_2', access: { kind: 'default' } }],
    [`datatable://${'a'.repeat(63)}`, { name: 'a'.repeat(63), access: { kind: 'default' } }],
    ['datatable://main?as=viewer', { name: 'main', access: { kind: 'viewer' } }],
    [
      'datatable://main?role=sales_emea',
      { name: 'main', access: { kind: 'role', role: 'sales_emea' } },
    ],
    ['datatable://main?role=_x', { name: 'main', access: { kind: 'role', role: '_x' } }],
    ['datatable://main?role=%73ales', { name: 'main', access: { kind: 'role', role: 'sales' } }],
    [
      `datatable://main?role=${'r'.repeat(63)}`,
      { name: 'main', access: { kind: 'role', role: 'r'.repeat(63) } },
    ],
    [
      'datatable://clinics?as=viewer&roles=provider',
      { name: 'clinics', access: { kind: 'narrowed', roles: ['provider'] } },
    ],
    [
      'datatable://clinics?roles=system_admin,provider&as=viewer',
      { name: 'clinics', access: { kind: 'narrowed', roles: ['provider', 'system_admin'] } },
    ],
    [
      'datatable://clinics?as=viewer&roles=b,a,b,%61',
      { name: 'clinics', access: { kind: 'narrowed', roles: ['a', 'b'] } },
    ],
  ];
  for (const [ref, parsed] of accepted) {
    it(JSON.stringify(ref), () => {
      expect(parseDatatableRef(ref)).toEqual(parsed);
    });
  }
});

describe('validateRoleName refuses', () => {
  const refused: [string, string][] = [
    ['admin, the data table owner', 'admin'],
    ['the wm_set_ prefix', 'wm_set_0123456789abcdef'],
    ['the bare wm_set_ prefix', 'wm_set_'],
    ['the viewer marker', DATATABLE_VIEWER_ROLE],
    ['the pg_ prefix', 'pg_monitor'],
    ['public', 'public'],
    ['none', 'none'],
    ['current_user', 'current_user'],
    ['session_user', 'session_user'],
    ['current_role', 'current_role'],
    ['user', 'user'],
    ['uppercase', 'Sales'],
    ['all uppercase', 'ADMIN'],
    ['a leading digit', '1sales'],
    ['a space', 'sales emea'],
    ['a leading space', ' sales'],
    ['a trailing newline', 'sales\n'],
    ['a double quote', 'sa"les'],
    ['a single quote', "sa'les"],
    ['a dash', 'sales-emea'],
    ['a dot', 'sales.emea'],
    ['a semicolon', 'sales;drop'],
    ['non-ASCII', 'ventes_é'],
    ['64 characters', 'r'.repeat(64)],
    ['65 characters', 'r'.repeat(65)],
    ['the empty string', ''],
  ];
  for (const [why, name] of refused) {
    it(`${why}: ${JSON.stringify(name)}`, () => {
      expect(codeOf(() => validateRoleName(name))).toBe(ROLE);
    });
  }

  it('anything that is not a string', () => {
    for (const value of [undefined, null, 1, {}]) {
      expect(codeOf(() => validateRoleName(value as unknown as string))).toBe(ROLE);
    }
  });

  it('accepts plain lowercase identifiers up to 63 bytes and returns them unchanged', () => {
    for (const name of ['sales', 'sales_emea', '_x', 'r2d2', 'r'.repeat(63), 'wm_sets', 'admins']) {
      expect(validateRoleName(name)).toBe(name);
    }
  });
});

describe('format, and the role-name spelling of an access', () => {
  const refs: DatatableRef[] = [
    { name: 'main', access: { kind: 'default' } },
    { name: 'main', access: { kind: 'viewer' } },
    { name: 'orders_db', access: { kind: 'role', role: 'sales_emea' } },
    { name: 'clinics', access: { kind: 'narrowed', roles: ['provider'] } },
    { name: 'clinics', access: { kind: 'narrowed', roles: ['provider', 'system_admin'] } },
  ];

  it('formatDatatableRef round-trips through parseDatatableRef', () => {
    expect(refs.map(formatDatatableRef)).toEqual([
      'datatable://main',
      'datatable://main?as=viewer',
      'datatable://orders_db?role=sales_emea',
      'datatable://clinics?as=viewer&roles=provider',
      'datatable://clinics?as=viewer&roles=provider,system_admin',
    ]);
    for (const ref of refs) expect(parseDatatableRef(formatDatatableRef(ref))).toEqual(ref);
    // Any spelling of one narrowing formats to the one canonical text.
    expect(
      formatDatatableRef(
        parseDatatableRef('datatable://clinics?roles=system_admin,provider,provider&as=viewer'),
      ),
    ).toBe('datatable://clinics?as=viewer&roles=provider,system_admin');
  });

  it('accessToRoleName / accessFromRoleName round-trip, the viewer as the marker', () => {
    expect(accessToRoleName({ kind: 'default' })).toBeNull();
    expect(accessToRoleName({ kind: 'viewer' })).toBe(DATATABLE_VIEWER_ROLE);
    expect(accessToRoleName({ kind: 'role', role: 'sales' })).toBe('sales');
    expect(accessToRoleName({ kind: 'narrowed', roles: ['provider', 'system_admin'] })).toBe(
      '@viewer:provider,system_admin',
    );
    for (const { access } of refs) {
      expect(accessFromRoleName(accessToRoleName(access))).toEqual(access);
      const name = accessToRoleName(access);
      if (name !== null) expect(accessToRoleName(accessFromRoleName(name))).toBe(name);
    }
    expect(accessFromRoleName(DATATABLE_VIEWER_ROLE)).toEqual({ kind: 'viewer' });
    expect(accessFromRoleName(null)).toEqual({ kind: 'default' });
  });

  it('accessFromRoleName refuses every name validateRoleName refuses', () => {
    for (const name of ['admin', 'wm_set_abc', 'pg_x', 'Viewer', 'viewer@', '@Viewer', '', 'a b']) {
      expect(codeOf(() => accessFromRoleName(name))).toBe(ROLE);
    }
    // The marker is not a role name, so a peer that only knows roles refuses it.
    expect(codeOf(() => validateRoleName(DATATABLE_VIEWER_ROLE))).toBe(ROLE);
  });

  it('the narrowed spelling: no real role can have it, and only its canonical form is read', () => {
    for (const name of [
      '@viewer:provider',
      '@viewer:provider,system_admin',
      '@viewer:',
      '@viewer:,',
    ]) {
      expect(
        codeOf(() => validateRoleName(name)),
        name,
      ).toBe(ROLE);
    }
    for (const name of [
      '@viewer:',
      '@viewer:,',
      '@viewer:a,',
      '@viewer:,a',
      '@viewer:b,a', // not sorted
      '@viewer:a,a', // not distinct
      '@viewer:admin',
      '@viewer:a,wm_set_x',
      '@viewer:a b',
      '@viewer:Provider',
      '@viewer::a',
    ]) {
      expect(
        codeOf(() => accessFromRoleName(name)),
        name,
      ).toBe(ROLE);
    }
  });
});

describe('a parser that predates narrowing refuses it (SPEC invariant 9)', () => {
  // test/fixtures/datatable_ref_before_narrowing.ts is the grammar of 026af5f, verbatim.
  const narrowed = [
    'datatable://clinics?as=viewer&roles=provider',
    'datatable://clinics?as=viewer&roles=provider,system_admin',
    'datatable://clinics?roles=provider&as=viewer',
  ];

  it.each(narrowed)('the old parseDatatableRef refuses %s as an unknown parameter', (ref) => {
    expect(codeOf(() => before.parseDatatableRef(ref))).toBe(REF);
    expect(() => before.parseDatatableRef(ref)).toThrow(/unknown parameter/);
    // …and the new one reads the narrowing, never the viewer's full roles.
    expect(parseDatatableRef(ref).access.kind).toBe('narrowed');
  });

  it('the old role-name decoding refuses the narrowed spelling instead of reading a role', () => {
    for (const ref of narrowed) {
      const name = accessToRoleName(parseDatatableRef(ref).access)!;
      expect(
        codeOf(() => before.accessFromRoleName(name)),
        name,
      ).toBe(ROLE);
    }
  });

  it('what the old parser accepted, the new one reads the same way', () => {
    for (const ref of [
      'datatable://main',
      'datatable://main?as=viewer',
      'datatable://main?role=sales_emea',
      'datatable://main?role=%73ales',
    ]) {
      expect(parseDatatableRef(ref)).toEqual(before.parseDatatableRef(ref));
    }
    for (const name of [null, DATATABLE_VIEWER_ROLE, 'sales']) {
      expect(accessFromRoleName(name)).toEqual(before.accessFromRoleName(name));
    }
  });
});

describe('property: whatever string is parsed, only the documented forms come out', () => {
  /** The accepted input grammar, written out by hand (percent-escapes allowed in values). */
  const VALUE = '(?:[A-Za-z0-9_.~-]|%[0-9A-Fa-f]{2})+';
  const INPUT_RE = new RegExp(`^datatable://([a-z][a-z0-9_]{0,62})(?:\\?(as|role)=(${VALUE}))?$`);
  /** The narrowed form, its two parameters in either order. */
  const LIST = `${VALUE}(?:,${VALUE})*`;
  const NARROWED_INPUT_RE = new RegExp(
    `^datatable://([a-z][a-z0-9_]{0,62})\\?(?:as=(${VALUE})&roles=(${LIST})|roles=(${LIST})&as=(${VALUE}))$`,
  );
  const ROLE_NAME = '[a-z_][a-z0-9_]{0,62}';
  /** The canonical text of each of the four forms. */
  const CANONICAL_RE = new RegExp(
    `^datatable://[a-z][a-z0-9_]{0,62}(?:\\?as=viewer|\\?role=${ROLE_NAME}|\\?as=viewer&roles=${ROLE_NAME}(?:,${ROLE_NAME})*)?$`,
  );
  const RESERVED = new Set([
    'admin',
    'public',
    'none',
    'current_user',
    'current_role',
    'session_user',
    'user',
  ]);

  function check(input: string): void {
    let parsed: DatatableRef;
    try {
      parsed = parseDatatableRef(input);
    } catch (err) {
      expect([REF, ROLE]).toContain((err as { code?: string }).code);
      return;
    }
    // Exactly one of the three documented forms, and nothing else on the object.
    expect(Object.keys(parsed).sort()).toEqual(['access', 'name']);
    const access: DatatableAccess = parsed.access;
    if (access.kind === 'role') {
      expect(Object.keys(access).sort()).toEqual(['kind', 'role']);
      expect(validateRoleName(access.role)).toBe(access.role);
      expect(access.role).toMatch(/^[a-z_][a-z0-9_]{0,62}$/);
      expect(RESERVED.has(access.role) || access.role.startsWith('wm_set_')).toBe(false);
      expect(access.role.startsWith('pg_')).toBe(false);
    } else if (access.kind === 'narrowed') {
      expect(Object.keys(access).sort()).toEqual(['kind', 'roles']);
      expect(access.roles.length).toBeGreaterThan(0);
      expect([...access.roles]).toEqual([...new Set(access.roles)].sort());
      for (const role of access.roles) expect(validateRoleName(role)).toBe(role);
      const n = NARROWED_INPUT_RE.exec(input);
      expect(n, `accepted input outside the grammar: ${JSON.stringify(input)}`).not.toBeNull();
      expect(parsed.name).toBe(n![1]);
      expect(decodeURIComponent(n![2] ?? n![5]!)).toBe('viewer');
      const listed = (n![3] ?? n![4]!).split(',').map((item) => decodeURIComponent(item));
      expect([...access.roles]).toEqual([...new Set(listed)].sort());
      expect(parseDatatableRef(formatDatatableRef(parsed))).toEqual(parsed);
      expect(formatDatatableRef(parsed)).toMatch(CANONICAL_RE);
      return;
    } else {
      expect(['default', 'viewer']).toContain(access.kind);
      expect(Object.keys(access)).toEqual(['kind']);
    }
    // The input follows the grammar, and says what was parsed.
    const m = INPUT_RE.exec(input);
    expect(m, `accepted input outside the grammar: ${JSON.stringify(input)}`).not.toBeNull();
    expect(parsed.name).toBe(m![1]);
    if (m![2] === undefined) expect(access.kind).toBe('default');
    else if (m![2] === 'as') {
      expect(access.kind).toBe('viewer');
      expect(decodeURIComponent(m![3]!)).toBe('viewer');
    } else {
      expect(access).toEqual({ kind: 'role', role: decodeURIComponent(m![3]!) });
    }
    // Canonical text re-parses to the same thing.
    const text = formatDatatableRef(parsed);
    expect(text).toMatch(CANONICAL_RE);
    expect(parseDatatableRef(text)).toEqual(parsed);
  }

  const pieces = fc.constantFrom(
    'datatable://',
    'datatable:/',
    'DATATABLE://',
    'main',
    'm',
    'Main',
    'x1',
    '_',
    '?',
    '&',
    '=',
    '#',
    '/',
    '%',
    'as',
    'role',
    'roles',
    ',',
    '?as=viewer&roles=',
    'viewer',
    'Viewer',
    'admin',
    'sales_emea',
    'wm_set_',
    'pg_',
    'public',
    '@viewer',
    '%40viewer',
    '%76iewer',
    '%61',
    '%41',
    '%C3%A9',
    '%ff',
    '%2',
    '%3D',
    '%26',
    ' ',
    '\n',
    '\0',
    'é',
    '🙂',
    'r'.repeat(63),
  );
  const junk = fc.oneof(
    fc.string(),
    fc.string({ unit: 'binary' }),
    fc.string({ unit: 'grapheme' }),
    fc.string({ unit: fc.constantFrom('a', 'z', '_', '0', '=', '&', '?', '%', 'A', '-', '.') }),
  );
  const built = fc
    .array(fc.oneof({ weight: 4, arbitrary: pieces }, { weight: 1, arbitrary: junk }), {
      maxLength: 12,
    })
    .map((parts) => parts.join(''));
  const nearlyValid = fc
    .tuple(
      fc.constantFrom('datatable://'),
      fc.stringMatching(/^[a-z][a-z0-9_]{0,5}$/),
      fc.option(
        fc.tuple(
          fc.constantFrom(
            '?as=',
            '?role=',
            '?as=viewer&role=',
            '?role=x&as=',
            '?',
            '?as=viewer&roles=',
            '?roles=',
            '?roles=a,b&as=',
            '?as=viewer&roles=a,',
          ),
          fc.oneof(
            fc.constantFrom(
              'viewer',
              'sales',
              'admin',
              '%40viewer',
              'wm_set_a',
              '',
              'a,b',
              'b,a,b',
            ),
            fc.stringMatching(/^[a-z_%0-9A-F,]{0,8}$/),
          ),
        ),
      ),
    )
    .map(([scheme, name, query]) => scheme + name + (query === null ? '' : query.join('')));

  it('for any string', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.string({ unit: 'binary' })), (s) => check(s)),
      {
        numRuns: 2000,
      },
    );
  });

  it('for strings built from the grammar’s pieces mixed with junk', () => {
    fc.assert(
      fc.property(built, (s) => check(s)),
      { numRuns: 5000 },
    );
  });

  it('for nearly valid references', () => {
    fc.assert(
      fc.property(nearlyValid, (s) => check(s)),
      { numRuns: 3000 },
    );
  });

  it('every valid reference is accepted and round-trips', () => {
    const ref: fc.Arbitrary<DatatableRef> = fc.record({
      name: fc.stringMatching(/^[a-z][a-z0-9_]{0,62}$/),
      access: fc.oneof(
        fc.constant<DatatableAccess>({ kind: 'default' }),
        fc.constant<DatatableAccess>({ kind: 'viewer' }),
        fc
          .stringMatching(/^[a-z_][a-z0-9_]{0,62}$/)
          .filter(
            (role) => !RESERVED.has(role) && !role.startsWith('wm_set_') && !role.startsWith('pg_'),
          )
          .map((role): DatatableAccess => ({ kind: 'role', role })),
        fc
          .uniqueArray(
            fc
              .stringMatching(/^[a-z_][a-z0-9_]{0,62}$/)
              .filter(
                (role) =>
                  !RESERVED.has(role) && !role.startsWith('wm_set_') && !role.startsWith('pg_'),
              ),
            { minLength: 1, maxLength: 5 },
          )
          .map((roles): DatatableAccess => ({ kind: 'narrowed', roles: roles.sort() })),
      ),
    });
    fc.assert(
      fc.property(ref, (r) => {
        expect(parseDatatableRef(formatDatatableRef(r))).toEqual(r);
        expect(accessFromRoleName(accessToRoleName(r.access))).toEqual(r.access);
      }),
      { numRuns: 2000 },
    );
  });
});

describe('datatableRefOf: ctx.datatable asks for exactly what a reference can', () => {
  it.each([
    [{}, 'datatable://main'],
    [{ as: 'viewer' }, 'datatable://main?as=viewer'],
    [{ role: 'sales_emea' }, 'datatable://main?role=sales_emea'],
    [{ as: 'viewer', roles: ['provider'] }, 'datatable://main?as=viewer&roles=provider'],
    [
      { as: 'viewer', roles: ['system_admin', 'provider'] },
      'datatable://main?as=viewer&roles=provider,system_admin',
    ],
  ] as const)('%j is the reference %s', (request, text) => {
    expect(datatableRefOf('main', request as DatatableRequest)).toEqual(parseDatatableRef(text));
  });

  it.each([
    ['both as and role', { as: 'viewer', role: 'x' }, 'InvalidDatatableRefError'],
    ['as other than viewer', { as: 'publisher' }, 'InvalidDatatableRefError'],
    ['an unknown option', { as: 'viewer', scope: 1 }, 'InvalidDatatableRefError'],
    ['a non-string role', { role: 7 }, 'InvalidDatatableRefError'],
    ['a reserved role', { role: 'admin' }, 'InvalidRoleNameError'],
    ['the viewer marker as a role', { role: DATATABLE_VIEWER_ROLE }, 'InvalidRoleNameError'],
    ['a set login as a role', { role: 'wm_set_abc' }, 'InvalidRoleNameError'],
    ['a request that is not an object', 'viewer', 'InvalidDatatableRefError'],
    ['roles without as', { roles: ['provider'] }, 'InvalidDatatableRefError'],
    ['roles beside role', { role: 'x', roles: ['x'] }, 'InvalidDatatableRefError'],
    ['an empty roles list', { as: 'viewer', roles: [] }, 'InvalidDatatableRefError'],
    ['roles that is not a list', { as: 'viewer', roles: 'provider' }, 'InvalidDatatableRefError'],
    ['a non-string in roles', { as: 'viewer', roles: ['a', 1] }, 'InvalidDatatableRefError'],
    ['a reserved name in roles', { as: 'viewer', roles: ['admin'] }, 'InvalidRoleNameError'],
    [
      'the viewer marker in roles',
      { as: 'viewer', roles: [DATATABLE_VIEWER_ROLE] },
      'InvalidRoleNameError',
    ],
  ])('refuses %s', (_what, request, name) => {
    expect(() => datatableRefOf('main', request as unknown as DatatableRequest)).toThrow(
      expect.objectContaining({ name }),
    );
  });

  it.each(['', 'Main', '1abc', 'a/b', 'x'.repeat(64)])(
    'refuses the name %j, as the grammar does',
    (name) => {
      expect(() => datatableRefOf(name)).toThrow(InvalidDatatableRefError);
      expect(() => parseDatatableRef(`datatable://${name}`)).toThrow();
    },
  );

  it('a name cannot smuggle a query: ctx.datatable("main?as=viewer") is refused', () => {
    expect(() => datatableRefOf('main?as=viewer')).toThrow(InvalidDatatableRefError);
  });
});
