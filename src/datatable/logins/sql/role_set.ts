/** Statements of the set-login protocol (role_set_protocol.ts). */

import { LOGIN_ATTRIBUTES } from './logins.js';

/** Per-login session advisory lock: serialises create, take-back and retire across processes. */
export { LOCK_LOGIN, UNLOCK_LOGIN } from './logins.js';

/** The login's row (if any) and whether the login exists, in one round trip. */
export const READ_ROW_AND_LOGIN = `
  select s.role_oids, s.secret,
         exists (select 1 from pg_catalog.pg_roles where rolname = $1) as login_exists
    from (select 1) one
    left join viewer_cache.role_set s on s.login = $1`;
/**
 * Writes the row only if every role of the set is still enabled, checked under FOR SHARE locks
 * (see LOCK_ENABLED_ROLES); inserts nothing otherwise.
 */
export const INSERT_ROW_IF_ENABLED = `
  insert into viewer_cache.role_set (login, role_oids, secret)
  select $1, $2::oid[], $3
   where (select count(*) from (
            select r.oid from viewer_cache.role r
              join pg_catalog.pg_roles a on a.oid = r.oid
             where r.oid = any($2::oid[]) and r.enabled and not a.rolsuper and not a.rolbypassrls
               for share of r) held) = cardinality($2::oid[])`;

/** SQLSTATE raised by CREATE_LOGIN when a role of the set is no longer enabled. */
export const ROLES_GONE = 'VC001';

/**
 * Creates a set login in one round trip and one transaction: the set's catalog rows locked
 * against a concurrent disable and checked, the login created *with* its memberships (a crash
 * can never leave one without them), and marked as this catalog's. Every value is a literal
 * made here: OIDs are integers, the rest goes through quote_literal-equivalent escaping.
 */
export const CREATE_LOGIN = (
  oids: readonly number[],
  loginLiteral: string,
  verifierLiteral: string,
) => `
  do $vc_create$
  declare
    held int;
    names text;
  begin
    select count(*), string_agg(quote_ident(s.rolname), ', ' order by s.oid)
      into held, names
      from (select r.oid, a.rolname from viewer_cache.role r
              join pg_catalog.pg_roles a on a.oid = r.oid
             where r.oid = any('{${oids.map((oid) => Math.trunc(oid)).join(',')}}'::oid[])
               and r.enabled and not a.rolsuper and not a.rolbypassrls
               for share of r) s;
    if held <> ${oids.length} then
      raise exception 'a role of this set was disabled or dropped' using errcode = '${ROLES_GONE}';
    end if;
    execute format('create role %I with ${LOGIN_ATTRIBUTES} password %L in role ', ${loginLiteral}, ${verifierLiteral}) || names;
    execute format('comment on role %I is %L', ${loginLiteral},
                   'viewer-cache set login of catalog ' || (select catalog_id from viewer_cache.generation));
  end
  $vc_create$`;
export const DELETE_ROW = 'delete from viewer_cache.role_set where login = $1';

export const READ_CATALOG_ID = 'select catalog_id from viewer_cache.generation';

/**
 * The roles of a set that may still be held, locked against a concurrent disable or drop until
 * the caller's transaction ends: `disableRole` updates the same rows, so it waits for a create
 * that checked them, and a create that comes after a disable sees it (SPEC invariant 8).
 */
export const LOCK_ENABLED_ROLES = `
  select r.oid, a.rolname
    from viewer_cache.role r
    join pg_catalog.pg_roles a on a.oid = r.oid
   where r.oid = any($1::oid[]) and r.enabled and not a.rolsuper and not a.rolbypassrls
     for share of r`;

/** Marks a login as this catalog's, in the same transaction that creates it (gc finds it). */
export const MARK = (ident: string, catalogId: string) =>
  `comment on role ${ident} is 'viewer-cache set login of catalog ${catalogId.replace(/[^0-9a-f-]/g, '')}'`;

/**
 * Memberships of a login. `plain` = no admin option and (PostgreSQL 16+) inherited; read through
 * to_jsonb so one statement serves 15, which has no inherit_option column.
 */
export const MEMBERSHIPS_OF = `
  select m.roleid, r.rolname, g.rolname as grantor,
         (not m.admin_option
          and coalesce((to_jsonb(m) ->> 'inherit_option')::boolean, true)) as plain
    from pg_catalog.pg_auth_members m
    join pg_catalog.pg_roles r on r.oid = m.roleid
    join pg_catalog.pg_roles g on g.oid = m.grantor
    join pg_catalog.pg_roles l on l.oid = m.member
   where l.rolname = $1
   order by m.roleid`;

/** Set logins holding a role: by their row, or by membership (orphans without a row). */
export const LOGINS_HOLDING = `
  select login::text as login from viewer_cache.role_set where $1::oid = any(role_oids)
  union
  select l.rolname::text from pg_catalog.pg_auth_members m
    join pg_catalog.pg_roles l on l.oid = m.member
   where m.roleid = $1::oid and l.rolname like 'wm\\_set\\_%'`;

/**
 * This catalog's set logins: those with a row here, and orphans (no row) that this catalog
 * marked when it created them or that hold one of its roles — whatever else they hold. Other
 * catalogs on the same cluster have their own set logins; `logins gc` must never see, let alone
 * retire, those.
 */
export const LIST_LOGINS = `
  select s.login::text as login, s.role_oids, true as has_row,
         coalesce(l.rolcanlogin, false) as can_login
    from viewer_cache.role_set s
    left join pg_catalog.pg_roles l on l.rolname = s.login
  union all
  select l.rolname::text, null, false, l.rolcanlogin
    from pg_catalog.pg_roles l
   where l.rolname like 'wm\\_set\\_%'
     and not exists (select 1 from viewer_cache.role_set s where s.login = l.rolname)
     and (exists (select 1 from pg_catalog.pg_auth_members m
                    join viewer_cache.role r on r.oid = m.roleid
                   where m.member = l.oid)
          or pg_catalog.shobj_description(l.oid, 'pg_authid') =
             (select 'viewer-cache set login of catalog ' || catalog_id
                from viewer_cache.generation))
   order by 1`;
