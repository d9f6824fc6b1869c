import type { CatalogRole, CatalogState } from '../catalog/catalog_state.js';
import { type Principals, tenantsNaming, tenantsNamingEmbed } from '../catalog/directory.js';

/** The owner role of a data table: never resolved for anyone, whatever the tenants say. */
const OWNER_ROLE = 'admin';

/**
 * The roles whose tenant list names `email` — directly (`user:`), through a group or folder, or
 * through `*` — among the enabled, safe roles of `workspace` (and of `datatable`, when given).
 * Never `admin`. Workspace-admin rights play no part: being allowed to *use* a role by name is
 * not being its tenant. Sorted by catalog id.
 */
export function resolveRoles(
  state: CatalogState,
  workspace: string,
  email: string,
  principals: Principals,
  datatable?: string,
): CatalogRole[] {
  return rolesNamedBy(state, workspace, tenantsNaming(email, principals), datatable);
}

/**
 * The roles an embed viewer of `app` resolves to: those whose tenants include `embed:*` or
 * `embed:APP` — and nothing else (not `*`, not `user:`, whatever the assertion carries). Same
 * filters as {@link resolveRoles}; sorted by catalog id.
 */
export function resolveEmbedRoles(
  state: CatalogState,
  workspace: string,
  app: string,
  datatable?: string,
): CatalogRole[] {
  return rolesNamedBy(state, workspace, tenantsNamingEmbed(app), datatable);
}

function rolesNamedBy(
  state: CatalogState,
  workspace: string,
  names: ReadonlySet<string>,
  datatable: string | undefined,
): CatalogRole[] {
  const roles: CatalogRole[] = [];
  for (const role of state.roles(workspace)) {
    if (!role.enabled || !role.safe || role.name === OWNER_ROLE) continue;
    if (datatable !== undefined && role.datatable !== datatable) continue;
    if (role.tenants.some((tenant) => names.has(tenant))) roles.push(role);
  }
  return roles.sort((a, b) => a.oid - b.oid);
}

/** Whether `email` may connect as `role` by name: a tenant of it, or a workspace admin. */
export function mayUseRole(role: CatalogRole, email: string, principals: Principals): boolean {
  if (!role.enabled || !role.safe || role.name === OWNER_ROLE) return false;
  if (principals.isAdmin) return true;
  const names = tenantsNaming(email, principals);
  return role.tenants.some((tenant) => names.has(tenant));
}
