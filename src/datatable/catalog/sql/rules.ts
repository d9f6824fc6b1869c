/**
 * What a role may read, as Postgres holds it (policies, grants, row-security switches, views and
 * functions), and its version per data table (rules_watch.ts, migration 7).
 */
// Nothing imported: migrations.ts (which names the channel) builds its step from these.

/** The event triggers of the catalog's database (mechanism A). */
export const RULES_DDL_TRIGGER = 'viewer_cache_rules_ddl';
export const RULES_DROP_TRIGGER = 'viewer_cache_rules_drop';

/**
 * Commands that can change what a role may read. Drops are the sql_drop trigger's (it alone
 * can tell a temporary object's drop, which a run may make, from a real one).
 */
export const RULES_DDL_TAGS = [
  'CREATE POLICY',
  'ALTER POLICY',
  'GRANT',
  'REVOKE',
  'ALTER DEFAULT PRIVILEGES',
  'ALTER TABLE',
  'ALTER VIEW',
  'CREATE VIEW',
  'CREATE MATERIALIZED VIEW',
  'ALTER MATERIALIZED VIEW',
  'ALTER FOREIGN TABLE',
  'CREATE FUNCTION',
  'ALTER FUNCTION',
  'ALTER SCHEMA',
  'CREATE RULE',
] as const;

export const RULES_DROP_TAGS = [
  'DROP POLICY',
  'DROP TABLE',
  'DROP VIEW',
  'DROP MATERIALIZED VIEW',
  'DROP FOREIGN TABLE',
  'DROP FUNCTION',
  'DROP SCHEMA',
  'DROP RULE',
  'DROP OWNED',
  'ALTER TABLE',
] as const;

const tags = (list: readonly string[]) => list.map((tag) => `'${tag}'`).join(', ');

/**
 * Bumps the rules version of every data table in this database, then the catalog generation,
 * and notifies — in the DDL's own transaction. Temporary objects (a run's scratch tables) change
 * no rule and bump nothing. Security definer: whoever runs the DDL (a table's owner) need not
 * be able to write the catalog.
 */
export const createRulesChanged = (channel: string): string => `
  create function viewer_cache.rules_changed() returns event_trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
  as $vc$
  declare
    generation bigint;
  begin
    if tg_event = 'sql_drop' then
      if not exists (select 1 from pg_event_trigger_dropped_objects() o where not o.is_temporary)
      then return; end if;
    elsif exists (select 1 from pg_event_trigger_ddl_commands())
      and not exists (select 1 from pg_event_trigger_ddl_commands() c
                       where c.schema_name is distinct from 'pg_temp') then
      return;
    end if;
    insert into viewer_cache.rules_version (workspace, datatable, version)
    select d.workspace, d.name, pg_current_xact_id()::text
      from viewer_cache.datatable d where d.database = current_database()
    -- The digest is forgotten: were the trigger dropped later, the digest's next read differs
    -- from null and bumps again, whatever changed meanwhile.
    on conflict (workspace, datatable) do update set version = excluded.version, digest = null;
    if not found then return; end if;
    update viewer_cache.generation set value = value + 1 returning value into generation;
    perform pg_notify('${channel}', generation::text);
  end
  $vc$`;

/**
 * Installs the event triggers when the migrating role may (a superuser); otherwise the data
 * tables of this database run on the digest (mechanism B), said at start-up.
 */
export const CREATE_RULES_TRIGGERS = `
  do $vc$
  begin
    if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
      create event trigger ${RULES_DDL_TRIGGER} on ddl_command_end
        when tag in (${tags(RULES_DDL_TAGS)})
        execute function viewer_cache.rules_changed();
      create event trigger ${RULES_DROP_TRIGGER} on sql_drop
        when tag in (${tags(RULES_DROP_TAGS)})
        execute function viewer_cache.rules_changed();
    end if;
  end
  $vc$`;

/** Both triggers present and enabled in this database (mechanism A holds). */
export const RULES_TRIGGERS_ON = `
  select count(*) = 2 as "on" from pg_catalog.pg_event_trigger
   where evtname in ('${RULES_DDL_TRIGGER}', '${RULES_DROP_TRIGGER}') and evtenabled <> 'D'`;

/** Every rules version of the catalog ('' for a data table no change has stamped yet). */
export const READ_RULES = 'select workspace, datatable, version from viewer_cache.rules_version';

/**
 * A digest of everything that decides what a role may read in this database (mechanism B):
 * policies, table/view/column/schema/function privileges, row-security switches, view and
 * function definitions, owners. Temporary objects are left out (a run's scratch tables).
 */
export const READ_RULES_DIGEST = `
  select md5(coalesce(string_agg(x, E'\\n' order by x), '')) as digest from (
    select concat_ws(':', 'p', p.polrelid, p.polname, p.polcmd, p.polpermissive,
             p.polroles::text, pg_get_expr(p.polqual, p.polrelid),
             pg_get_expr(p.polwithcheck, p.polrelid)) as x
      from pg_catalog.pg_policy p
    union all
    select concat_ws(':', 'c', c.oid, n.nspname, c.relname, c.relkind, c.relowner,
             c.relacl::text, c.relrowsecurity, c.relforcerowsecurity, c.reloptions::text,
             case when c.relkind in ('v', 'm') then pg_get_viewdef(c.oid) end)
      from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p', 'v', 'm', 'f')
       and n.nspname not in ('pg_catalog', 'information_schema')
       and n.nspname !~ '^pg_(toast|temp_|toast_temp_)'
    union all
    select concat_ws(':', 'a', a.attrelid, a.attnum, a.attname, a.attacl::text)
      from pg_catalog.pg_attribute a where a.attacl is not null
    union all
    select concat_ws(':', 'n', n.oid, n.nspname, n.nspowner, n.nspacl::text)
      from pg_catalog.pg_namespace n
     where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname !~ '^pg_'
    union all
    select concat_ws(':', 'f', p.oid, n.nspname, p.proname, p.proowner, p.proacl::text,
             p.prosecdef, p.provolatile, p.proconfig::text, md5(p.prosrc))
      from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
     where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname !~ '^pg_'
    union all
    select concat_ws(':', 'r', r.oid, r.ev_class, r.rulename, r.ev_enabled)
      from pg_catalog.pg_rewrite r join pg_catalog.pg_class c on c.oid = r.ev_class
      join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname !~ '^pg_'
  ) rules`;

/**
 * Records a digest read in database $1: a data table whose digest moved gets a fresh version
 * (a transaction id, never reused), then the generation is bumped and notified, all in one
 * statement. Returns the new generation, or no row when nothing moved. When nothing moved it
 * writes nothing (no transaction id is drawn): it runs every heartbeat in every process.
 */
export const recordRulesDigest = (channel: string): string => `
  with moved as (
    update viewer_cache.rules_version r
       set version = pg_current_xact_id()::text, digest = $2
      from viewer_cache.datatable d
     where d.database = $1 and r.workspace = d.workspace and r.datatable = d.name
       and r.digest is distinct from $2
    returning 1
  ), added as (
    insert into viewer_cache.rules_version (workspace, datatable, version, digest)
    select d.workspace, d.name, pg_current_xact_id()::text, $2
      from viewer_cache.datatable d
     where d.database = $1
       and not exists (select 1 from viewer_cache.rules_version r
                        where r.workspace = d.workspace and r.datatable = d.name)
    on conflict (workspace, datatable) do nothing
    returning 1
  ), bumped as (
    update viewer_cache.generation set value = value + 1
     where exists (select 1 from moved) or exists (select 1 from added) returning value
  )
  select value, pg_notify('${channel}', value::text) from bumped`;

/** An operator's invalidation of one data table: a fresh version, whatever the rules say. */
export const BUMP_RULES_VERSION = `
  insert into viewer_cache.rules_version (workspace, datatable, version)
  values ($1, $2, pg_current_xact_id()::text)
  on conflict (workspace, datatable) do update set version = excluded.version`;
