import { CatalogError } from '../../errors.js';

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
/** `embed:*` (every embed viewer of the workspace) or `embed:APP` (those of one app). */
const EMBED_TENANT_RE = /^embed:(\*|[a-z0-9][a-z0-9_-]{0,62})$/;

/**
 * Checks one tenant entry: `user:EMAIL`, `group:NAME`, `folder:NAME`, `*` (every signed-in
 * user — not embed viewers), `embed:*` or `embed:APP` (embed viewers).
 * @throws {CatalogError}
 */
export function validateTenant(tenant: string): string {
  if (
    tenant === '*' ||
    (typeof tenant === 'string' && (TENANT_RE.test(tenant) || EMBED_TENANT_RE.test(tenant)))
  )
    return tenant;
  throw new CatalogError(
    `invalid tenant ${JSON.stringify(tenant)}: use user:EMAIL, group:NAME, folder:NAME, *, embed:* or embed:APP`,
  );
}

/**
 * The tenant strings that name an embed viewer of `app`: only `embed:*` and `embed:APP`. Never
 * `*`, `user:` (whatever email the host asserted), a group or a folder: an embed viewer has no
 * roles of their own.
 */
export function tenantsNamingEmbed(app: string): Set<string> {
  return new Set(['embed:*', `embed:${app}`]);
}

/** The tenant strings that name `email` with these principals (never an `embed:` tenant). */
export function tenantsNaming(email: string, principals: Principals): Set<string> {
  const names = new Set<string>(['*', `user:${email}`]);
  for (const group of principals.groups) names.add(`group:${group}`);
  for (const folder of principals.folders) names.add(`folder:${folder}`);
  return names;
}
