/** Statements about managed logins, shared by the catalog admin and the set-login protocol. */

/** Attributes of every managed login: it can log in and inherit, and nothing else. */
export const LOGIN_ATTRIBUTES =
  'login inherit nosuperuser nocreatedb nocreaterole noreplication nobypassrls connection limit -1';

/** The OID of a Postgres role (a login is one) by name; no row when there is none. */
export const READ_ROLE_OID = 'select oid from pg_catalog.pg_roles where rolname = $1';

/** Ends every session of a login but the caller's own. */
export const TERMINATE_BACKENDS = `
  select pg_terminate_backend(pid) from pg_catalog.pg_stat_activity
   where usename = $1 and pid <> pg_backend_pid()`;

/**
 * Ends every session whose login is the role with OID `$1` — also once that role is dropped
 * (its sessions live on under the OID, and a name no longer finds them).
 */
export const TERMINATE_BACKENDS_OF_OID = `
  select pg_terminate_backend(pid) from pg_catalog.pg_stat_activity
   where usesysid = $1 and pid <> pg_backend_pid()`;

/**
 * Whether backend `$1` is a session of a login that no longer exists: dropped (a retire, an
 * operator) while the session was open, perhaps recreated since under the same name with
 * another OID. Such a session holds no memberships: "permission denied" for everything.
 */
export const SESSION_LOGIN_GONE = `
  select not exists (select 1 from pg_catalog.pg_roles r where r.oid = s.usesysid) as gone
    from pg_catalog.pg_stat_activity s where s.pid = $1`;

/**
 * Per-role settings of a login (`ALTER ROLE … SET`, which a login may run on itself and which
 * `DISCARD ALL` does not reset), with the database each applies to (null: every database).
 */
export const ROLE_SETTINGS = `
  select d.datname as database
    from pg_catalog.pg_db_role_setting s
    join pg_catalog.pg_roles r on r.oid = s.setrole
    left join pg_catalog.pg_database d on d.oid = s.setdatabase
   where r.rolname = $1`;

/**
 * What a login is now, for the checks that detect changes made behind the library's back:
 * whether it can log in with exactly the managed attributes, and how many per-role settings it
 * has. `verifier` is read from pg_authid only when `$2` is true (superuser connections).
 */
export const INSPECT_LOGIN = `
  select r.oid,
         (r.rolcanlogin and r.rolinherit and not r.rolsuper and not r.rolcreatedb
          and not r.rolcreaterole and not r.rolreplication and not r.rolbypassrls
          and r.rolconnlimit = -1 and r.rolvaliduntil is null) as managed,
         (select count(*) from pg_catalog.pg_db_role_setting s where s.setrole = r.oid)::int
           as settings,
         case when $2::boolean
              then (select a.rolpassword from pg_catalog.pg_authid a where a.oid = r.oid)
         end as verifier,
         coalesce((select array_agg(m.roleid::int order by m.roleid)
                     from pg_catalog.pg_auth_members m
                    where m.member = r.oid and not m.admin_option
                      and coalesce((to_jsonb(m) ->> 'inherit_option')::boolean, true)),
                  '{}') as plain_memberships,
         (select count(*) from pg_catalog.pg_auth_members m where m.member = r.oid)::int
           as memberships
    from pg_catalog.pg_roles r
   where r.rolname = $1`;

/** Per-login advisory lock, shared with the set-login protocol (same key space). */
export const LOCK_LOGIN = 'select pg_advisory_lock(hashtextextended($1, 7340))';
export const UNLOCK_LOGIN = 'select pg_advisory_unlock(hashtextextended($1, 7340))';

/** A role's catalog row, locked against a concurrent disable while its login is repaired. */
export const LOCK_ENABLED_ROLE = `
  select r.oid from viewer_cache.role r
    join pg_catalog.pg_roles a on a.oid = r.oid
   where r.oid = $1 and r.enabled and not a.rolsuper and not a.rolbypassrls
     for share of r`;

/** Whether the library's connection may read pg_authid (password verifiers). */
export const CAN_READ_VERIFIERS =
  'select rolsuper from pg_catalog.pg_roles where rolname = current_user';
