import { describe, expect, it } from 'vitest';
import { checkSingleStatement } from '../../src/proxy/single_statement.js';

describe('checkSingleStatement: one statement, never a role change', () => {
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
    'select set_config($1, $2, false)',
    'with role as (select 1) select * from role',
    'update t set role = 1',
  ])('accepts %j', (sql) => {
    expect(checkSingleStatement(sql)).toBeNull();
  });

  it.each([
    ['select 1; select 2', 'several statements'],
    ['select 1;;', 'several statements'],
    ["select ';'; delete from t", 'several statements'],
    ['select $$ ; $$; select 2', 'several statements'],
    ['select 1 /* c */ ; /* c */ select 2', 'several statements'],
    ['', 'empty'],
    [' ; ', 'empty'],
    ['-- only a comment', 'empty'],
    ['set role other', 'role change'],
    ['SET ROLE other', 'role change'],
    ['set local role other', 'role change'],
    ['set session role other', 'role change'],
    ['reset role', 'role change'],
    ['/* hidden */ reset  ROLE', 'role change'],
    ['set session authorization default', 'role change'],
    ['set local session authorization x', 'role change'],
    ['reset session authorization', 'role change'],
    ["select 'open", 'unterminated'],
    ['select "open', 'unterminated'],
    ['select $$ open', 'unterminated'],
    ['select /* open', 'unterminated'],
    ["select E'\\'", 'unterminated'],
  ])('refuses %j (%s)', (sql, why) => {
    expect(checkSingleStatement(sql)).toBe(why);
  });
});
