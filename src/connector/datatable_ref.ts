import { InvalidDatatableRefError, InvalidRoleNameError } from '../errors.js';

/**
 * The viewer request spelt as a role name, for protocols that can only pass a role on (a remote
 * worker's `role` parameter). {@link validateRoleName} refuses it, so no real role can have it,
 * and a peer that does not know it refuses it too instead of connecting as some default.
 */
export const DATATABLE_VIEWER_ROLE = '@viewer';

/** Prefix of the logins that hold a set of roles (`wm_set_<hash>`); reserved. */
export const ROLE_SET_LOGIN_PREFIX = 'wm_set_';

/** Spelling of a narrowed viewer request as a role name: the marker, `:`, the roles. */
const NARROWED_ROLE_PREFIX = `${DATATABLE_VIEWER_ROLE}:`;

/**
 * What `ctx.datatable(name, request)` accepts: the viewer (optionally narrowed to some of their
 * roles), a named role, or the default.
 */
export type DatatableRequest =
  | { as: 'viewer'; roles?: readonly string[] }
  | { role: string }
  | Record<string, never>;

/** How a reference asks to connect. */
export type DatatableAccess =
  /** The data table's default role. */
  | { readonly kind: 'default' }
  /** A named role the job's runner must be allowed to use. */
  | { readonly kind: 'role'; readonly role: string }
  /** Exactly the data-table roles of the job's viewer. */
  | { readonly kind: 'viewer' }
  /**
   * The job's viewer, narrowed: those of the viewer's roles that `roles` names, and no others
   * (`?as=viewer&roles=a,b`). At least one name, sorted, distinct. A kind of its own, not a field
   * on `viewer`: a connector that predates it cannot mistake it for the viewer's full roles.
   */
  | { readonly kind: 'narrowed'; readonly roles: readonly string[] };

export interface DatatableRef {
  readonly name: string;
  readonly access: DatatableAccess;
}

const SCHEME = 'datatable://';
const NAME_RE = /^[a-z][a-z0-9_]{0,62}$/;
const ROLE_RE = /^[a-z_][a-z0-9_]*$/;
/** Names Postgres itself reserves or treats specially, even when quoted. */
const RESERVED_ROLES = new Set([
  'admin',
  'public',
  'none',
  'current_user',
  'current_role',
  'session_user',
  'user',
]);

/**
 * Parses `datatable://NAME`, `datatable://NAME?role=ROLE`, `datatable://NAME?as=viewer` or
 * `datatable://NAME?as=viewer&roles=ROLE,ROLE…` (the viewer narrowed to those of their roles).
 *
 * Strict on purpose: an unknown or repeated parameter, both `as` and `role`, `as=` anything but
 * `viewer`, `roles=` without `as=viewer`, an empty name or list item, a fragment or a bad `%`
 * escape is an error — so a parser that predates a parameter refuses the reference instead of
 * quietly connecting as the default role (or, for `roles=`, as the viewer's full roles: a parser
 * without it refuses it as an unknown parameter).
 *
 * @throws {InvalidDatatableRefError}
 * @throws {InvalidRoleNameError} when `role=` names a reserved or unsafe role.
 */
export function parseDatatableRef(ref: string): DatatableRef {
  if (typeof ref !== 'string') throw bad('a data-table reference must be a string');
  if (!ref.startsWith(SCHEME)) throw bad(`a data-table reference starts with ${SCHEME}`);
  const rest = ref.slice(SCHEME.length);
  const q = rest.indexOf('?');
  const name = q === -1 ? rest : rest.slice(0, q);
  if (!NAME_RE.test(name)) {
    throw bad(
      'the data-table name must be 1–63 lowercase letters, digits or _ (starting with a letter)',
    );
  }
  if (q === -1) return { name, access: { kind: 'default' } };

  const query = rest.slice(q + 1);
  if (query.length === 0) throw bad('empty query after ?');
  const params = new Map<string, string>();
  let roles: string[] | undefined;
  for (const pair of query.split('&')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw bad('each parameter must be key=value');
    const key = pair.slice(0, eq);
    if (key !== 'as' && key !== 'role' && key !== 'roles')
      throw bad('unknown parameter (only as=, role= or roles=)');
    if (params.has(key)) throw bad(`parameter ${key} is repeated`);
    const raw = pair.slice(eq + 1);
    // The list is split before decoding: an escaped comma is part of a name (and refused there).
    if (key === 'roles') roles = raw.split(',').map(decodeParam);
    params.set(key, key === 'roles' ? raw : decodeParam(raw));
  }
  return { name, access: accessOf(params.get('as'), params.get('role'), roles) };
}

/**
 * The reference `ctx.datatable(name, request)` stands for: the same name grammar and the same
 * as/role rules as {@link parseDatatableRef}, so a TS runnable and a SQL runnable can ask for
 * exactly the same things and nothing more.
 *
 * @throws {InvalidDatatableRefError}
 * @throws {InvalidRoleNameError}
 */
export function datatableRefOf(name: string, request: DatatableRequest = {}): DatatableRef {
  if (typeof name !== 'string' || !NAME_RE.test(name)) {
    throw bad(
      'the data-table name must be 1–63 lowercase letters, digits or _ (starting with a letter)',
    );
  }
  if (request === null || typeof request !== 'object') {
    throw bad('the datatable() request must be an object: { as: "viewer" }, { role } or {}');
  }
  const { as, role, roles, ...rest } = request as {
    as?: unknown;
    role?: unknown;
    roles?: unknown;
  };
  if (Object.keys(rest).length > 0)
    throw bad('unknown datatable() option (only as, roles or role)');
  if (role !== undefined && typeof role !== 'string') throw bad('role must be a string');
  if (as !== undefined && typeof as !== 'string') throw bad("as only accepts 'viewer'");
  if (roles !== undefined && !(Array.isArray(roles) && roles.every((r) => typeof r === 'string')))
    throw bad('roles must be an array of role names');
  return { name, access: accessOf(as, role, roles as string[] | undefined) };
}

/**
 * The as/role/roles rules, once: at most one of `as` and `role`; `as` is only `viewer`; `role`
 * a valid name; `roles` only with `as=viewer`, a non-empty list of valid names (sorted and
 * deduplicated: one request, one spelling).
 */
function accessOf(
  as: string | undefined,
  role: string | undefined,
  roles: readonly string[] | undefined,
): DatatableAccess {
  if (as !== undefined && role !== undefined) throw bad('give either as=viewer or role=, not both');
  if (roles !== undefined && as === undefined) throw bad('roles= narrows as=viewer: give both');
  if (as !== undefined) {
    if (as !== 'viewer') throw bad('as= only accepts viewer');
    if (roles === undefined) return { kind: 'viewer' };
    return { kind: 'narrowed', roles: narrowedRoles(roles) };
  }
  if (role !== undefined) return { kind: 'role', role: validateRoleName(role) };
  return { kind: 'default' };
}

/** A narrowing's role list, checked and in its one canonical order. */
function narrowedRoles(roles: readonly string[]): readonly string[] {
  if (roles.length === 0) throw bad('roles= names at least one role');
  for (const role of roles) validateRoleName(role);
  return Object.freeze([...new Set(roles)].sort());
}

/** The canonical text of a reference; `parseDatatableRef(formatDatatableRef(r))` equals `r`. */
export function formatDatatableRef(ref: DatatableRef): string {
  const base = SCHEME + ref.name;
  switch (ref.access.kind) {
    case 'default':
      return base;
    case 'viewer':
      return `${base}?as=viewer`;
    case 'narrowed':
      return `${base}?as=viewer&roles=${ref.access.roles.join(',')}`;
    case 'role':
      return `${base}?role=${ref.access.role}`;
  }
}

/**
 * The access spelt as one role name, for protocols that pass a role on: a named role is itself,
 * the viewer is {@link DATATABLE_VIEWER_ROLE}, the narrowed viewer is that marker followed by `:`
 * and the sorted roles (`@viewer:provider,system_admin`). {@link validateRoleName} refuses both
 * markers, so no real role can have them, and a peer that predates either refuses it.
 */
export function accessToRoleName(access: DatatableAccess): string | null {
  switch (access.kind) {
    case 'default':
      return null;
    case 'viewer':
      return DATATABLE_VIEWER_ROLE;
    case 'narrowed':
      return NARROWED_ROLE_PREFIX + access.roles.join(',');
    case 'role':
      return access.role;
  }
}

/**
 * Inverse of {@link accessToRoleName}: the markers are the viewer (narrowed or not), anything
 * else must be a valid role. A narrowed spelling must be the canonical one (sorted, distinct):
 * it is machine-made, so anything else is refused rather than read two ways.
 */
export function accessFromRoleName(role: string | null): DatatableAccess {
  if (role === null) return { kind: 'default' };
  if (role === DATATABLE_VIEWER_ROLE) return { kind: 'viewer' };
  if (typeof role === 'string' && role.startsWith(NARROWED_ROLE_PREFIX)) {
    const listed = role.slice(NARROWED_ROLE_PREFIX.length).split(',');
    for (const name of listed) validateRoleName(name);
    const roles = narrowedRoles(listed);
    if (roles.join(',') !== listed.join(','))
      throw badRole('a narrowed request lists its roles sorted, each once');
    return { kind: 'narrowed', roles };
  }
  return { kind: 'role', role: validateRoleName(role) };
}

/**
 * Returns `name` if it may be a data-table role: a plain lowercase identifier of at most 63 bytes,
 * not `admin` (the data table's owner), not the `wm_set_` prefix of set logins, not the viewer
 * marker, not `pg_…` and not a name Postgres reserves.
 *
 * @throws {InvalidRoleNameError}
 */
export function validateRoleName(name: string): string {
  if (typeof name !== 'string' || name.length === 0)
    throw badRole('a role name must be a non-empty string');
  if (name === DATATABLE_VIEWER_ROLE || name.startsWith(NARROWED_ROLE_PREFIX))
    throw badRole('that name is reserved for the viewer request');
  if (!ROLE_RE.test(name)) {
    throw badRole('a role name is lowercase letters, digits and _, not starting with a digit');
  }
  if (name.length > 63) throw badRole('a role name is at most 63 bytes');
  if (RESERVED_ROLES.has(name)) throw badRole(`"${name}" is reserved`);
  if (name.startsWith(ROLE_SET_LOGIN_PREFIX))
    throw badRole(`the ${ROLE_SET_LOGIN_PREFIX} prefix is reserved for set logins`);
  if (name.startsWith('pg_')) throw badRole('the pg_ prefix is reserved by PostgreSQL');
  return name;
}

function decodeParam(raw: string): string {
  // Only %XX escapes of unreserved bytes make sense here; anything else is malformed.
  if (/%(?![0-9A-Fa-f]{2})/.test(raw) || /[^A-Za-z0-9_.~%-]/.test(raw)) {
    throw bad('bad character or % escape in a parameter value');
  }
  let decoded: string;
  try {
    decoded = decodeURIComponent(raw);
  } catch {
    throw bad('bad % escape in a parameter value');
  }
  if (decoded.length === 0) throw bad('empty parameter value');
  return decoded;
}

function bad(message: string): InvalidDatatableRefError {
  return new InvalidDatatableRefError(message);
}

function badRole(message: string): InvalidRoleNameError {
  return new InvalidRoleNameError(message);
}
