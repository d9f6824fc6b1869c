/** Reads of the catalog snapshot; run together in one repeatable-read transaction. */

export const READ_GENERATION = 'select value, catalog_id from viewer_cache.generation';

export const READ_DATATABLES =
  'select workspace, name, database, default_role from viewer_cache.datatable';

/**
 * Names come from pg_roles, so a rename is seen at once; a role that was dropped behind the
 * catalog's back, or given SUPERUSER or BYPASSRLS, is marked unsafe and never handed out.
 */
export const READ_ROLES = `
  select r.oid, r.workspace, r.datatable, coalesce(a.rolname, r.name) as name, r.enabled,
         r.tenants, r.secret, r.version,
         (a.oid is not null and not a.rolsuper and not a.rolbypassrls) as safe
    from viewer_cache.role r
    left join pg_catalog.pg_roles a on a.oid = r.oid
   order by r.oid`;

export const READ_MEMBERSHIPS = 'select workspace, email, kind, name from viewer_cache.membership';

/** A workspace's data tables, with the name of their default role (null: none). */
export const LIST_DATATABLES = `
  select d.name, d.database, r.name as default_role
    from viewer_cache.datatable d
    left join viewer_cache.role r on r.oid = d.default_role
   where d.workspace = $1
   order by d.name`;

/** The members of one group or folder, in a stable order. */
export const LIST_MEMBERS = `
  select email from viewer_cache.membership
   where workspace = $1 and kind = $2 and name = $3
   order by email`;

/** Governing tables with their stamps: '' is the table's own, others are per viewer. */
export const READ_GOVERNING = `
  select g.workspace, g.datatable, g.relation, v.viewer, v.version
    from viewer_cache.governing_table g
    left join viewer_cache.governing_version v on v.relation = g.relation
   order by g.relation`;
