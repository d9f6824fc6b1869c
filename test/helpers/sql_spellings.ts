/**
 * Generated SQL spellings for the query proxy's allowlist, written from Postgres's grammar
 * (gram.y's `VariableSetStmt`, `VariableResetStmt`, `generic_set`, `set_rest_more`, `func_name`):
 * every way a statement can change the session's role or authorization, plus texts that only
 * mention such words in names, strings and comments. Case, comments and whitespace between
 * tokens are random. Every text is valid SQL (the tests check the parser reads each one).
 */
import fc from 'fast-check';

type A = fc.Arbitrary<string>;

/** A keyword in random case. */
function kw(word: string): A {
  return fc
    .array(fc.boolean(), { minLength: word.length, maxLength: word.length })
    .map((upper) => [...word].map((c, i) => (upper[i] ? c.toUpperCase() : c)).join(''));
}

/** What may stand between two tokens: whitespace and comments of every kind. */
const gap: A = fc.constantFrom(
  ' ',
  '  ',
  '\t',
  '\n',
  '\r\n',
  ' /* c */ ',
  '/**/',
  ' /* a /* nested; set role x */ b */ ',
  ' -- ; reset role\n',
  '\n--\n',
);
/** Around punctuation, nothing at all is allowed too. */
const maybeGap: A = fc.oneof(fc.constant(''), gap);

/** Tokens joined by random gaps; a token may itself be an arbitrary. */
function seq(...tokens: (string | A)[]): A {
  const parts = tokens.map((t) => (typeof t === 'string' ? fc.constant(t) : t));
  return fc
    .tuple(fc.tuple(...parts), fc.array(gap, { minLength: parts.length, maxLength: parts.length }))
    .map(([ts, gs]) => ts.map((t, i) => (i === 0 ? t : `${gs[i]}${t}`)).join(''));
}

/** A whole text: leading gap, the statement, maybe a `;` and a trailing gap. */
function whole(statement: A): A {
  return fc
    .tuple(maybeGap, statement, fc.constantFrom('', ';', ' ;', ';\n', '; -- end'))
    .map(([lead, s, end]) => `${lead}${s}${end}`);
}

/** `role` as a setting's name: the keyword, quoted, Unicode-escaped. */
const roleName: A = fc.oneof(
  kw('role'),
  fc.constant('"role"'),
  fc.constant('U&"r\\006Fle"'),
  fc.constant('U&"!0072ole" UESCAPE \'!\''),
);
/** `session_authorization` as a setting's name. */
const sessionAuthorizationName: A = fc.oneof(
  kw('session_authorization'),
  fc.constant('"session_authorization"'),
);
/** A value the login would be changed to. */
const value: A = fc.constantFrom("'x'", 'x', '"x"', "E'x'", '$$x$$', '$q$x$q$', "U&'x'");
const scope: A = fc.oneof(fc.constant(''), kw('session'), kw('local'));
const assign: A = fc.oneof(kw('to'), fc.constant('='));

/** Every SET and RESET of role and session_authorization, in each production of the grammar. */
const setOrReset: A = fc.oneof(
  seq(kw('set'), scope, roleName, assign, fc.oneof(value, kw('default'))),
  seq(kw('set'), scope, sessionAuthorizationName, assign, fc.oneof(value, kw('default'))),
  seq(kw('set'), scope, kw('role'), fc.constantFrom("'x'", 'x')),
  seq(kw('set'), scope, kw('session'), kw('authorization'), fc.oneof(value, kw('default'))),
  seq(kw('set'), roleName, kw('from'), kw('current')),
  seq(kw('reset'), fc.oneof(roleName, sessionAuthorizationName)),
  seq(kw('reset'), kw('session'), kw('authorization')),
  seq(kw('reset'), kw('all')),
);

/** `set_config` by every name it answers to. */
const setConfigName: A = fc.oneof(
  kw('set_config'),
  fc.constant('"set_config"'),
  fc
    .tuple(fc.oneof(kw('pg_catalog'), fc.constant('"pg_catalog"')), maybeGap, maybeGap)
    .chain(([schema, g1, g2]) =>
      fc
        .oneof(kw('set_config'), fc.constant('"set_config"'))
        .map((f) => `${schema}${g1}.${g2}${f}`),
    ),
);
const setConfigCall: A = fc
  .tuple(
    setConfigName,
    maybeGap,
    fc.constantFrom(
      "'role'",
      "'session_authorization'",
      "'ro' || 'le'",
      "lower('ROLE')",
      '$1',
      "E'r\\x6fle'",
    ),
    value.filter((v) => v !== 'x' && v !== '"x"'),
    fc.constantFrom('false', 'true', '$2'),
  )
  .map(([f, g, name, v, local]) => `${f}${g}(${name}, ${v}, ${local})`);
/** A statement on the allowlist's kinds that calls set_config somewhere inside. */
const callsSetConfig: A = setConfigCall.chain((call) =>
  fc.constantFrom(
    `select ${call}`,
    `SELECT * FROM ${call}`,
    `select 1 from t where ${call} is not null`,
    `with s as (select ${call}) select * from s`,
    `explain analyze select ${call}`,
    `update t set a = ${call}`,
    `insert into t values (${call})`,
    `values (${call})`,
    `select (select ${call})`,
    `select coalesce(${call}, '')`,
    `select * from rows from (${call})`,
  ),
);

/** EXECUTE of a prepared statement, and DO blocks, which run what no parse of the text shows. */
const executeOrDo: A = fc.oneof(
  seq(kw('execute'), fc.constantFrom('p', '"p"', 'p(1)', 'p ($1, 2)')),
  seq(kw('explain'), kw('execute'), fc.constant('p')),
  seq(kw('do'), fc.constantFrom('$$ begin set role x; end $$', "'begin perform 1; end'")),
  seq(kw('do'), kw('language'), kw('plpgsql'), fc.constant('$b$ begin reset role; end $b$')),
);

/** A role change (or something that could hide one), as one text the proxy must refuse. */
export function roleChangeSpelling(): A {
  return fc.oneof(
    whole(setOrReset),
    whole(callsSetConfig),
    whole(executeOrDo),
    // Hidden behind an allowed statement.
    fc
      .tuple(
        seq(kw('select'), fc.constant('1')),
        fc.constantFrom(';', ' ;', ';\n', ';/* c */', '; -- c\n', ';;'),
        whole(setOrReset),
      )
      .map(([a, semi, b]) => `${a}${semi}${b}`),
  );
}

/** A statement that runs although it names `role`, `set` and the rest as columns and strings. */
export function statementWithRoleWords(): A {
  const item: A = fc.oneof(
    fc.constantFrom('"role"', '"set"', '"session_authorization"', '"set_config"'),
    kw('role'),
    fc.constantFrom("'set role x'", '$$reset all$$', "E'set\\'role'", "'select set_config(1)'"),
  );
  return whole(
    fc.oneof(
      seq(kw('select'), item, fc.constant(','), item, kw('from'), fc.constant('t')),
      seq(kw('update'), fc.constant('t'), kw('set'), kw('role'), fc.constant('='), item),
      seq(
        kw('insert'),
        kw('into'),
        fc.constant('t'),
        fc.constant('("role")'),
        kw('values'),
        item.map((i) => `(${i})`),
      ),
      seq(
        kw('select'),
        fc.constant('current_setting'),
        item.map((i) => `(${i})`),
      ),
    ),
  );
}
