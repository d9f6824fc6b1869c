import { CatalogError } from '../errors.js';

/** What a person is in a workspace, as far as role tenancy is concerned. */
export interface Principals {
  readonly groups: readonly string[];
  readonly folders: readonly string[];
  /** Workspace admins may use any role by name (`?role=`), never `admin`, never as a viewer. */
  readonly isAdmin: boolean;
}

/**
 * Who belongs to which groups and folders. The built-in directory keeps memberships in the
 * catalog (`viewer_cache.membership`), where a change bumps the catalog generation. A platform
 * can plug in its own; its answers then feed the role resolution on every run (cache them on
 * your side if they are slow), and a change in them changes the resolved role set, hence the
 * cache key, on the viewer's next run.
 */
export interface Directory {
  principals(workspace: string, email: string): Promise<Principals> | Principals;
}

export const NO_PRINCIPALS: Principals = Object.freeze({
  groups: Object.freeze([]),
  folders: Object.freeze([]),
  isAdmin: false,
});

/** Membership kinds of the built-in directory. */
export type MembershipKind = 'group' | 'folder' | 'admin';

const TENANT_RE = /^(user|group|folder):([^\s\p{C}]{1,320})$/u;

/**
 * Checks one tenant entry: `user:EMAIL`, `group:NAME`, `folder:NAME` or `*` (everyone).
 * @throws {CatalogError}
 */
export function validateTenant(tenant: string): string {
  if (tenant === '*' || (typeof tenant === 'string' && TENANT_RE.test(tenant))) return tenant;
  throw new CatalogError(
    `invalid tenant ${JSON.stringify(tenant)}: use user:EMAIL, group:NAME, folder:NAME or *`,
  );
}

/** The tenant strings that name `email` with these principals. */
export function tenantsNaming(email: string, principals: Principals): Set<string> {
  const names = new Set<string>(['*', `user:${email}`]);
  for (const group of principals.groups) names.add(`group:${group}`);
  for (const folder of principals.folders) names.add(`folder:${folder}`);
  return names;
}
