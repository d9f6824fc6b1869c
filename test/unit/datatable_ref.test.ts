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

describe('parseDatatableRef accepts exactly the three forms', () => {
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
  ];

  it('formatDatatableRef round-trips through parseDatatableRef', () => {
    expect(refs.map(formatDatatableRef)).toEqual([
      'datatable://main',
      'datatable://main?as=viewer',
      'datatable://orders_db?role=sales_emea',
    ]);
    for (const ref of refs) expect(parseDatatableRef(formatDatatableRef(ref))).toEqual(ref);
  });

  it('accessToRoleName / accessFromRoleName round-trip, the viewer as the marker', () => {
    expect(accessToRoleName({ kind: 'default' })).toBeNull();
    expect(accessToRoleName({ kind: 'viewer' })).toBe(DATATABLE_VIEWER_ROLE);
    expect(accessToRoleName({ kind: 'role', role: 'sales' })).toBe('sales');
    for (const { access } of refs)
      expect(accessFromRoleName(accessToRoleName(access))).toEqual(access);
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
});

describe('property: whatever string is parsed, only the documented forms come out', () => {
  /** The accepted input grammar, written out by hand (percent-escapes allowed in values). */
  const VALUE = '(?:[A-Za-z0-9_.~-]|%[0-9A-Fa-f]{2})+';
  const INPUT_RE = new RegExp(`^datatable://([a-z][a-z0-9_]{0,62})(?:\\?(as|role)=(${VALUE}))?$`);
  /** The canonical text of each of the three forms. */
  const CANONICAL_RE =
    /^datatable:\/\/[a-z][a-z0-9_]{0,62}(?:\?as=viewer|\?role=[a-z_][a-z0-9_]{0,62})?$/;
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
          fc.constantFrom('?as=', '?role=', '?as=viewer&role=', '?role=x&as=', '?'),
          fc.oneof(
            fc.constantFrom('viewer', 'sales', 'admin', '%40viewer', 'wm_set_a', ''),
            fc.stringMatching(/^[a-z_%0-9A-F]{0,8}$/),
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
      ),
    });
    fc.assert(
      fc.property(ref, (r) => {
        expect(parseDatatableRef(formatDatatableRef(r))).toEqual(r);
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
