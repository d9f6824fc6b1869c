/** Catalog changes (catalog_admin.ts). Each runs in a transaction that ends with BUMP_GENERATION. */
import { CATALOG_CHANNEL } from '../migrations.js';

/** Every change bumps the generation and announces it, in the same transaction. */
export const BUMP_GENERATION = `
  with bumped as (
    update viewer_cache.generation set value = value + 1 returning value
  )
  select value, pg_notify('${CATALOG_CHANNEL}', value::text) from bumped`;

export const INSERT_DATATABLE = `
  insert into viewer_cache.datatable (workspace, name, database) values ($1, $2, $3)
  on conflict (workspace, name) do update set database = excluded.database`;

export const SET_DEFAULT_ROLE =
  'update viewer_cache.datatable set default_role = $3 where workspace = $1 and name = $2';

export const READ_DATATABLE =
  'select database, default_role from viewer_cache.datatable where workspace = $1 and name = $2';

export const INSERT_ROLE = `
  insert into viewer_cache.role (oid, workspace, datatable, name, tenants, secret)
  values ($1, $2, $3, $4, $5, $6)`;

/** A role by workspace and current name (pg_roles knows renames the catalog row may lag). */
export const FIND_ROLE = `
  select r.oid, r.datatable, r.enabled, r.secret, d.database, coalesce(a.rolname, r.name) as name
    from viewer_cache.role r
    join viewer_cache.datatable d on d.workspace = r.workspace and d.name = r.datatable
    left join pg_catalog.pg_roles a on a.oid = r.oid
   where r.workspace = $1 and coalesce(a.rolname, r.name) = $2`;

/** A role's tenants, for telling a repeated `createRole` from a conflicting one. */
export const READ_ROLE_TENANTS = 'select tenants from viewer_cache.role where oid = $1';

export const RENAME_ROLE = 'update viewer_cache.role set name = $2 where oid = $1';
export const SET_TENANTS = 'update viewer_cache.role set tenants = $2 where oid = $1';
export const SET_ENABLED =
  'update viewer_cache.role set enabled = $2, version = version + 1 where oid = $1';
export const DELETE_ROLE = 'delete from viewer_cache.role where oid = $1';
export const CLEAR_DEFAULT_ROLE =
  'update viewer_cache.datatable set default_role = null where default_role = $1';

export const LIST_ROLES = `
  select r.oid, r.datatable, coalesce(a.rolname, r.name) as name, r.enabled, r.tenants,
         (a.oid is not null) as exists
    from viewer_cache.role r
    left join pg_catalog.pg_roles a on a.oid = r.oid
   where r.workspace = $1
   order by r.datatable, name`;

export const ADD_MEMBERSHIP = `
  insert into viewer_cache.membership (workspace, email, kind, name) values ($1, $2, $3, $4)
  on conflict do nothing`;

export const REMOVE_MEMBERSHIP = `
  delete from viewer_cache.membership
   where workspace = $1 and email = $2 and kind = $3 and name = $4`;

export const LIST_DATABASES = 'select distinct database from viewer_cache.datatable';
