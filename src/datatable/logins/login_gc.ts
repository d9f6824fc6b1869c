import { resolveEmbedRoles, resolveRoles } from '../access/resolve_roles.js';
import type { CatalogState } from '../catalog/catalog_state.js';
import type { Principals } from '../catalog/directory.js';
import { RoleSetProtocol } from './role_set_protocol.js';

/** A set login as `logins list` shows it. */
export interface SetLoginInfo {
  login: string;
  roles: string[];
  hasRow: boolean;
  canLogin: boolean;
}

/** Set logins with their roles' current names (`#oid` for a role the catalog lost). */
export async function listSetLogins(
  state: CatalogState,
  protocol: RoleSetProtocol,
): Promise<SetLoginInfo[]> {
  const logins = await protocol.list();
  return logins.map(({ roleOids, ...rest }) => ({
    ...rest,
    roles: roleOids.map((oid) => state.role(oid)?.name ?? `#${oid}`),
  }));
}

/**
 * The set logins some viewer known to the catalog resolves to now. With a plugged-in directory
 * only `user:` tenants and built-in memberships are known, so a login still in use may be left
 * out (it is recreated on its next use).
 */
export async function wantedSetLogins(
  state: CatalogState,
  principalsOf: (workspace: string, email: string) => Principals | Promise<Principals>,
): Promise<Map<string, WantedSetLogin>> {
  const wanted = new Map<string, WantedSetLogin>();
  const want = (workspace: string, roles: readonly { datatable: string; oid: number }[]) => {
    const byDatatable = new Map<string, number[]>();
    for (const role of roles) {
      byDatatable.set(role.datatable, [...(byDatatable.get(role.datatable) ?? []), role.oid]);
    }
    for (const [datatable, oids] of byDatatable) {
      const database = state.datatable(workspace, datatable)?.database;
      if (oids.length > 1 && database !== undefined) {
        wanted.set(RoleSetProtocol.loginName(oids), { oids, database });
      }
    }
  };
  for (const workspace of state.workspaces()) {
    for (const email of state.knownEmails(workspace)) {
      want(workspace, resolveRoles(state, workspace, email, await principalsOf(workspace, email)));
    }
    // Embed viewers: one role set per app an `embed:APP` tenant names, and the `embed:*` set of
    // every other app ('' is no app name: it stands for those).
    const apps = new Set<string>(['']);
    for (const role of state.roles(workspace)) {
      for (const tenant of role.tenants) {
        if (tenant.startsWith('embed:') && tenant !== 'embed:*') apps.add(tenant.slice(6));
      }
    }
    for (const app of apps) want(workspace, resolveEmbedRoles(state, workspace, app));
  }
  return wanted;
}

/** A set login someone resolves to, with where it is used. */
export interface WantedSetLogin {
  /** Sorted catalog ids. */
  readonly oids: readonly number[];
  readonly database: string;
}
