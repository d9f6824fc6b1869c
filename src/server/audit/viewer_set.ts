/**
 * Who the audit runs as: a viewer set given in a file, or derived from the catalog — one viewer
 * per distinct role set found there (every user a tenant names, directly or through a group or
 * folder, when some policy reads the viewer's identity, since two users with the same roles then
 * see different rows), a signed-in user in no group, an anonymous visitor, a schedule, a hook,
 * and an embed viewer per embed tenant.
 */
import type { Datatables, RunOrigin } from '../../index.js';

/** One viewer of the audit. */
export type AuditViewer =
  /** A signed-in user; with `roles`, through an API key scoped to those roles. */
  | { readonly kind: 'user'; readonly email: string; readonly roles?: readonly string[] }
  /** A per-viewer embed link of `app`, with its signed attributes. */
  | {
      readonly kind: 'embed';
      readonly app: string;
      readonly attributes: Readonly<Record<string, string>>;
      readonly email?: string | null;
    }
  | { readonly kind: 'anonymous' }
  | { readonly kind: 'schedule' }
  | { readonly kind: 'hook' };

/** A signed-in user no tenant names: must hold no role at all. */
export const NO_ROLES_VIEWER = 'no-roles@audit.invalid';

/** How a viewer is shown in reports. */
export function viewerLabel(viewer: AuditViewer): string {
  switch (viewer.kind) {
    case 'user':
      return viewer.roles === undefined
        ? viewer.email
        : `${viewer.email} (key: ${viewer.roles.join(',')})`;
    case 'embed': {
      const attributes = Object.entries(viewer.attributes)
        .map(([k, v]) => `${k}=${v}`)
        .join(',');
      return `embed:${viewer.app}${attributes === '' ? '' : ` ${attributes}`}`;
    }
    default:
      return `(${viewer.kind})`;
  }
}

/** Whether the viewer is nobody: an anonymous visitor, a schedule or a hook. */
export function isNoViewer(viewer: AuditViewer): boolean {
  return viewer.kind === 'anonymous' || viewer.kind === 'schedule' || viewer.kind === 'hook';
}

/** Where a run as `viewer` comes from, as the server would record it. */
export function originOf(viewer: AuditViewer): RunOrigin {
  switch (viewer.kind) {
    case 'user':
      // A scoped key is a direct run by its owner; the scope travels beside the origin.
      return viewer.roles === undefined
        ? { kind: 'app', session: { email: viewer.email } }
        : { kind: 'run', caller: { email: viewer.email } };
    case 'embed':
      return {
        kind: 'embed',
        viewer: { app: viewer.app, attributes: viewer.attributes, email: viewer.email ?? null },
      };
    case 'anonymous':
      return { kind: 'app', session: null };
    case 'schedule':
      return { kind: 'schedule' };
    case 'hook':
      return { kind: 'trigger' };
  }
}

/** The viewers nobody is: always audited. */
export const NO_VIEWERS: readonly AuditViewer[] = [
  { kind: 'anonymous' },
  { kind: 'schedule' },
  { kind: 'hook' },
];

/**
 * Reads a viewer file: a JSON array whose items are an email, `{ email, roles? }` (roles: a
 * scoped key's), or `{ embed: APP, attributes, email? }`. The nobody viewers are added.
 * @throws {TypeError} naming the item that is not understood.
 */
export function parseViewerFile(text: string): AuditViewer[] {
  let items: unknown;
  try {
    items = JSON.parse(text);
  } catch (err) {
    throw new TypeError(`viewers: not JSON (${(err as Error).message})`);
  }
  if (!Array.isArray(items)) throw new TypeError('viewers: expected a JSON array');
  const viewers: AuditViewer[] = items.map((item, i): AuditViewer => {
    const refuse = () =>
      new TypeError(
        `viewers[${i}]: expected an email, { email, roles? } or { embed, attributes, email? }`,
      );
    if (typeof item === 'string' && item.includes('@')) return { kind: 'user', email: item };
    if (item === null || typeof item !== 'object') throw refuse();
    const entry = item as Record<string, unknown>;
    if (typeof entry['embed'] === 'string') {
      const attributes = entry['attributes'] ?? {};
      if (
        attributes === null ||
        typeof attributes !== 'object' ||
        Object.values(attributes).some((v) => typeof v !== 'string')
      )
        throw refuse();
      return {
        kind: 'embed',
        app: entry['embed'],
        attributes: attributes as Record<string, string>,
        email: typeof entry['email'] === 'string' ? entry['email'] : null,
      };
    }
    if (typeof entry['email'] !== 'string' || !entry['email'].includes('@')) throw refuse();
    const roles = entry['roles'];
    if (roles === undefined) return { kind: 'user', email: entry['email'] };
    if (!Array.isArray(roles) || roles.some((r) => typeof r !== 'string')) throw refuse();
    return { kind: 'user', email: entry['email'], roles: roles as string[] };
  });
  return [...viewers, ...NO_VIEWERS];
}

/** A viewer with the data-table roles it resolves to (`datatable.role`), as the catalog says. */
export interface ResolvedViewer {
  readonly viewer: AuditViewer;
  readonly roles: readonly string[];
}

/**
 * The roles each viewer holds, by the catalog's tenants and memberships now (a scoped key's
 * viewer: only its roles among them; nobody: none).
 */
export async function resolveViewers(
  datatables: Datatables,
  workspace: string,
  viewers: readonly AuditViewer[],
): Promise<ResolvedViewer[]> {
  const roles = (await datatables.admin.listRoles(workspace)).filter((r) => r.enabled);
  const resolved: ResolvedViewer[] = [];
  for (const viewer of viewers) {
    let names = new Set<string>();
    if (viewer.kind === 'user') {
      const principals = await datatables.principals(workspace, viewer.email);
      names = new Set(['*', `user:${viewer.email}`]);
      for (const group of principals.groups) names.add(`group:${group}`);
      for (const folder of principals.folders) names.add(`folder:${folder}`);
    } else if (viewer.kind === 'embed') {
      names = new Set(['embed:*', `embed:${viewer.app}`]);
    }
    const held = roles
      .filter((r) => r.tenants.some((t) => names.has(t)))
      .filter((r) => viewer.kind !== 'user' || !viewer.roles || viewer.roles.includes(r.name))
      .map((r) => `${r.datatable}.${r.name}`)
      .sort();
    resolved.push({ viewer, roles: held });
  }
  return resolved;
}

/**
 * The derived viewer set (see the file's comment). `readIdentity`: some data table's policies
 * read the viewer's identity, so every named user is audited, not one per role set.
 */
export async function deriveViewers(
  datatables: Datatables,
  workspace: string,
  readIdentity: boolean,
): Promise<ResolvedViewer[]> {
  const roles = (await datatables.admin.listRoles(workspace)).filter((r) => r.enabled);
  const emails = new Set<string>();
  const embedApps = new Set<string>();
  for (const tenant of new Set(roles.flatMap((r) => r.tenants))) {
    const [kind, ...rest] = tenant.split(':');
    const name = rest.join(':');
    if (kind === 'user') emails.add(name);
    else if (kind === 'group' || kind === 'folder')
      for (const email of await datatables.admin.listMembers(workspace, kind, name))
        emails.add(email);
    else if (kind === 'embed') embedApps.add(name === '*' ? 'audit' : name);
  }
  const users: AuditViewer[] = [...emails].sort().map((email) => ({ kind: 'user', email }));
  users.push({ kind: 'user', email: NO_ROLES_VIEWER });
  const resolved = await resolveViewers(datatables, workspace, [
    ...users,
    ...[...embedApps].sort().map((app): AuditViewer => ({ kind: 'embed', app, attributes: {} })),
    ...NO_VIEWERS,
  ]);
  if (readIdentity) return resolved;
  // Without identity reads, users with the same role set see the same rows: one of each.
  const seen = new Set<string>();
  return resolved.filter(({ viewer, roles: held }) => {
    if (viewer.kind !== 'user') return true;
    const set = held.join(',');
    if (seen.has(set)) return false;
    seen.add(set);
    return true;
  });
}
