import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { statementVerdict } from '../../src/proxy/statement_allowlist.js';
import { roleChangeSpelling, statementWithRoleWords } from '../helpers/sql_spellings.js';

/** The refusal as the table reads it, or 'runs', or 'syntax'. */
async function verdictOf(sql: string): Promise<string> {
  const v = await statementVerdict(sql);
  if (v === null) return 'runs';
  if ('syntaxError' in v) return 'syntax';
  return `${v.refusal}: ${v.node}`;
}

describe('the query proxy runs one statement of the allowed kinds, by Postgres’s grammar', () => {
  it.each([
    'select 1',
    'select 1;',
    'select 1 ;  -- done\n',
    "select ';' as semi",
    "select 'it''s; fine'",
    "select E'a\\'; b'",
    'select "odd;name" from t',
    'select $$ ; $$',
    'select $tag$ ; $notit$ ; $tag$',
    'select 1 /* ; /* nested ; */ still ; */',
    'with role as (select 1) select * from role',
    'update t set role = 1',
    'select "role", "set" from t where "session_authorization" = $1',
    "select 'set role x' as s",
    'values (1), (2)',
    'table t',
    'insert into t (a) values ($1) returning *',
    'delete from t where a = $1',
    'merge into t using s on t.id = s.id when matched then update set a = s.a',
    'with gone as (delete from t returning *) insert into u select * from gone',
    'explain select 1',
    'explain analyze select * from t',
    'select current_setting($1)',
  ])('runs %j', async (sql) => {
    expect(await verdictOf(sql)).toBe('runs');
  });

  it.each([
    // The spellings the scanner of old let through.
    [`SET "role" TO 'x'`, 'role change: VariableSetStmt'],
    [`RESET "role"`, 'role change: VariableSetStmt'],
    [`SET "session_authorization" TO 'postgres'`, 'role change: VariableSetStmt'],
    [`set "ROLE" to 'x'`, 'role change: VariableSetStmt'],
    [`SET U&"r\\006Fle" TO 'x'`, 'role change: VariableSetStmt'],
    // And every other spelling.
    ['set role other', 'role change: VariableSetStmt'],
    ['SET LOCAL ROLE other', 'role change: VariableSetStmt'],
    ['set session role other', 'role change: VariableSetStmt'],
    ['set/**/role/* x */other', 'role change: VariableSetStmt'],
    ['set\trole\n=\r\nother', 'role change: VariableSetStmt'],
    ['reset role', 'role change: VariableSetStmt'],
    ['RESET ALL', 'role change: VariableSetStmt'],
    ['set session authorization default', 'role change: VariableSetStmt'],
    ['SET SESSION AUTHORIZATION postgres', 'role change: VariableSetStmt'],
    ['set local session authorization x', 'role change: VariableSetStmt'],
    ['reset session authorization', 'role change: VariableSetStmt'],
    ["select set_config('role', 'x', false)", 'role change: FuncCall set_config'],
    ["SELECT pg_catalog.set_config('role', 'x', true)", 'role change: FuncCall set_config'],
    ['select "set_config"($1, $2, false)', 'role change: FuncCall set_config'],
    ["select * from set_config('ro' || 'le', 'x', false)", 'role change: FuncCall set_config'],
    [
      "with s as (select set_config('role','x',false)) select * from s",
      'role change: FuncCall set_config',
    ],
    ["explain analyze select set_config('role','x',false)", 'role change: FuncCall set_config'],
    ["update t set a = set_config('role', 'x', false)", 'role change: FuncCall set_config'],
    ['execute p', 'statement kind: ExecuteStmt'],
    ['EXECUTE p(1, 2)', 'statement kind: ExecuteStmt'],
    ['explain analyze execute p', 'statement kind: ExecuteStmt'],
    ['prepare p as select 1', 'statement kind: PrepareStmt'],
    ['do $$ begin set role x; end $$', 'statement kind: DoStmt'],
    ["DO LANGUAGE plpgsql 'begin perform 1; end'", 'statement kind: DoStmt'],
    ['call p()', 'statement kind: CallStmt'],
    ['set statement_timeout = 0', 'statement kind: VariableSetStmt'],
    ['discard all', 'statement kind: DiscardStmt'],
    ['begin', 'statement kind: TransactionStmt'],
    ['create table x (a int)', 'statement kind: CreateStmt'],
    ['copy t to stdout', 'statement kind: CopyStmt'],
    ['alter role current_user set role = x', 'statement kind: AlterRoleSetStmt'],
    ['select 1; select 2', 'several statements: none'],
    ['select 1;;select 2', 'several statements: none'],
    ["select 1; set role 'x'", 'several statements: none'],
    ['select 1 /* c */ ; /* c */ select 2', 'several statements: none'],
    ['', 'empty: none'],
    [' ; ', 'empty: none'],
    ['-- only a comment', 'empty: none'],
    ["select 'open", 'syntax'],
    ['select "open', 'syntax'],
    ['select $$ open', 'syntax'],
    ['select /* open', 'syntax'],
    ['selec 1', 'syntax'],
  ])('refuses %j (%s)', async (sql, why) => {
    expect(await verdictOf(sql)).toBe(why);
  });

  it("a syntax error carries Postgres's message and 1-based position", async () => {
    expect(await statementVerdict('select 1 fro t')).toEqual({
      syntaxError: 'syntax error at or near "t"',
      position: 14,
    });
  });

  // A generated corpus: every spelling the grammar allows of a role or session-authorization
  // change, SET/RESET of any setting, set_config anywhere in a statement, EXECUTE and DO, with
  // random case, comments and whitespace between tokens. Each is real SQL (no syntax error:
  // the corpus is what Postgres would run) and each is refused.
  it('refuses every generated spelling of a role change (3000 spellings)', async () => {
    await fc.assert(
      fc.asyncProperty(roleChangeSpelling(), async (sql) => {
        const v = await statementVerdict(sql);
        expect(v, sql).not.toBeNull();
        expect(v && 'syntaxError' in v ? v.syntaxError : 'parsed', sql).toBe('parsed');
      }),
      { numRuns: 3000 },
    );
  }, 60_000);

  it('runs every generated SELECT that only mentions role words in names and strings (1000)', async () => {
    await fc.assert(
      fc.asyncProperty(statementWithRoleWords(), async (sql) => {
        expect(await verdictOf(sql), sql).toBe('runs');
      }),
      { numRuns: 1000 },
    );
  }, 60_000);
});
