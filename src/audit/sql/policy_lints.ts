/*
 * What the policy lints read from a data table's database: one statement per export, each over
 * the system catalogs only (no table of the user's is read, no row of theirs leaves Postgres).
 * `$1` is always the data-table roles' names: privileges are asked of Postgres
 * (`has_table_privilege`), so a grant through PUBLIC or a role the data-table role inherits
 * counts as it would for a run.
 */

/** Schemas that are Postgres's or the library's own, never a user's object to lint. */
const NOT_SYSTEM = `n.nspname not in ('pg_catalog', 'information_schema', 'viewer_cache', 'pg_toast')
  and n.nspname not like 'pg_temp%' and n.nspname not like 'pg_toast_temp%'`;

/**
 * Tables, views and materialised views some data-table role may read or write, with whether row
 * security is on and whether a view runs with its caller's rights (`security_invoker`).
 */
export const GRANTED_RELATIONS = `
  select n.nspname::text as schema, c.relname::text as name, c.relkind::text as kind,
         c.relrowsecurity as rls,
         coalesce('security_invoker=true' = any (c.reloptions)
                  or 'security_invoker=on' = any (c.reloptions), false) as invoker,
         array_agg(r.rolname::text order by r.rolname) as roles
    from pg_class c
    join pg_namespace n on n.oid = c.relnamespace
    join pg_roles r on r.rolname = any ($1::text[])
   where c.relkind in ('r', 'p', 'v', 'm', 'f')
     and ${NOT_SYSTEM}
     and has_table_privilege(r.oid, c.oid, 'SELECT, INSERT, UPDATE, DELETE')
   group by n.nspname, c.relname, c.relkind, c.relrowsecurity, c.reloptions
   order by 1, 2`;

/**
 * Every policy on a user table: whether it is permissive, the roles it is written TO (`{}` for
 * PUBLIC) and its expressions as text.
 */
export const POLICIES = `
  select n.nspname::text as schema, c.relname::text as table, p.polname::text as name,
         p.polpermissive as permissive, p.polcmd::text as command,
         coalesce((select array_agg(r.rolname::text order by r.rolname)
                     from pg_roles r where r.oid = any (p.polroles) and r.oid <> 0),
                  '{}'::text[]) as roles,
         coalesce(pg_get_expr(p.polqual, p.polrelid), '') as using_expr,
         coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '') as check_expr
    from pg_policy p
    join pg_class c on c.oid = p.polrelid
    join pg_namespace n on n.oid = c.relnamespace
   where ${NOT_SYSTEM}
   order by 1, 2, 3`;

/** `SECURITY DEFINER` functions some data-table role may execute (PUBLIC's EXECUTE counts). */
export const DEFINER_FUNCTIONS = `
  select n.nspname::text as schema, p.proname::text as name,
         pg_get_function_identity_arguments(p.oid) as arguments,
         array_agg(r.rolname::text order by r.rolname) as roles
    from pg_proc p
    join pg_namespace n on n.oid = p.pronamespace
    join pg_roles r on r.rolname = any ($1::text[])
   where p.prosecdef and ${NOT_SYSTEM}
     and has_function_privilege(r.oid, p.oid, 'EXECUTE')
   group by n.nspname, p.proname, p.oid
   order by 1, 2`;

/** Whether any policy or view of the database reads the run's viewer identity. */
export const READS_IDENTITY = `
  select exists (
      select 1 from pg_policy p
       where coalesce(pg_get_expr(p.polqual, p.polrelid), '') ~ 'viewer_cache\\.viewer_'
          or coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '') ~ 'viewer_cache\\.viewer_')
   or exists (
      select 1 from pg_views v
       where v.schemaname not in ('pg_catalog', 'information_schema', 'viewer_cache')
         and v.definition ~ 'viewer_cache\\.viewer_') as reads`;
