/** Statements of the set-login protocol (role_set_login.ts); one statement each. */

/** Per-login session advisory lock: serialises create, take-back and retire across processes. */
export const LOCK_LOGIN = 'select pg_advisory_lock(hashtextextended($1, 7340))';
export const UNLOCK_LOGIN = 'select pg_advisory_unlock(hashtextextended($1, 7340))';

export const READ_ROW = 'select role_oids, secret from viewer_cache.role_set where login = $1';
export const INSERT_ROW =
  'insert into viewer_cache.role_set (login, role_oids, secret) values ($1, $2::oid[], $3)';
export const DELETE_ROW = 'delete from viewer_cache.role_set where login = $1';

export const READ_LOGIN = 'select oid from pg_catalog.pg_roles where rolname = $1';
export const ROLE_NAMES = 'select oid, rolname from pg_catalog.pg_roles where oid = any($1::oid[])';

/** Attributes of every managed login: it can log in and inherit, and nothing else. */
export const LOGIN_ATTRIBUTES =
  'login inherit nosuperuser nocreatedb nocreaterole noreplication nobypassrls connection limit -1';

export const TERMINATE_BACKENDS = `
  select pg_terminate_backend(pid) from pg_catalog.pg_stat_activity
   where usename = $1 and pid <> pg_backend_pid()`;

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
 * This catalog's set logins: those with a row here, and orphans (no row) that hold one of this
 * catalog's roles. Other catalogs on the same cluster have their own set logins; `logins gc`
 * must never see, let alone retire, those.
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
     and exists (select 1 from pg_catalog.pg_auth_members m
                   join viewer_cache.role r on r.oid = m.roleid
                  where m.member = l.oid)
   order by 1`;
