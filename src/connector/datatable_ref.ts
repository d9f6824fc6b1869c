import { InvalidDatatableRefError, InvalidRoleNameError } from '../errors.js';

/**
 * The viewer request spelt as a role name, for protocols that can only pass a role on (a remote
 * worker's `role` parameter). {@link validateRoleName} refuses it, so no real role can have it,
 * and a peer that does not know it refuses it too instead of connecting as some default.
 */
export const DATATABLE_VIEWER_ROLE = '@viewer';

/** Prefix of the logins that hold a set of roles (`wm_set_<hash>`); reserved. */
export const ROLE_SET_LOGIN_PREFIX = 'wm_set_';

/** What `ctx.datatable(name, request)` accepts: the viewer, a named role, or the default. */
export type DatatableRequest = { as: 'viewer' } | { role: string } | Record<string, never>;

/** How a reference asks to connect. */
export type DatatableAccess =
  /** The data table's default role. */
  | { readonly kind: 'default' }
  /** A named role the job's runner must be allowed to use. */
  | { readonly kind: 'role'; readonly role: string }
  /** Exactly the data-table roles of the job's viewer. */
  | { readonly kind: 'viewer' };

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
 * Parses `datatable://NAME`, `datatable://NAME?role=ROLE` or `datatable://NAME?as=viewer`.
 *
 * Strict on purpose: an unknown or repeated parameter, both `as` and `role`, `as=` anything but
 * `viewer`, an empty name, a fragment or a bad `%` escape is an error — so a parser that predates a
 * parameter refuses the reference instead of quietly connecting as the default role.
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
  for (const pair of query.split('&')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw bad('each parameter must be key=value');
    const key = pair.slice(0, eq);
    if (key !== 'as' && key !== 'role') throw bad('unknown parameter (only as= or role=)');
    if (params.has(key)) throw bad(`parameter ${key} is repeated`);
    params.set(key, decodeParam(pair.slice(eq + 1)));
  }
  return { name, access: accessOf(params.get('as'), params.get('role')) };
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
  const { as, role, ...rest } = request as { as?: unknown; role?: unknown };
  if (Object.keys(rest).length > 0) throw bad('unknown datatable() option (only as or role)');
  if (role !== undefined && typeof role !== 'string') throw bad('role must be a string');
  if (as !== undefined && typeof as !== 'string') throw bad("as only accepts 'viewer'");
  return { name, access: accessOf(as, role) };
}

/** The as/role rules, once: at most one of the two; `as` is only `viewer`; `role` a valid name. */
function accessOf(as: string | undefined, role: string | undefined): DatatableAccess {
  if (as !== undefined && role !== undefined) throw bad('give either as=viewer or role=, not both');
  if (as !== undefined) {
    if (as !== 'viewer') throw bad('as= only accepts viewer');
    return { kind: 'viewer' };
  }
  if (role !== undefined) return { kind: 'role', role: validateRoleName(role) };
  return { kind: 'default' };
}

/** The canonical text of a reference; `parseDatatableRef(formatDatatableRef(r))` equals `r`. */
export function formatDatatableRef(ref: DatatableRef): string {
  const base = SCHEME + ref.name;
  switch (ref.access.kind) {
    case 'default':
      return base;
    case 'viewer':
      return `${base}?as=viewer`;
    case 'role':
      return `${base}?role=${ref.access.role}`;
  }
}

/** The access spelt as one role name, for protocols that pass a role on; see {@link DATATABLE_VIEWER_ROLE}. */
export function accessToRoleName(access: DatatableAccess): string | null {
  if (access.kind === 'viewer') return DATATABLE_VIEWER_ROLE;
  return access.kind === 'role' ? access.role : null;
}

/** Inverse of {@link accessToRoleName}: the marker is the viewer, anything else must be a valid role. */
export function accessFromRoleName(role: string | null): DatatableAccess {
  if (role === null) return { kind: 'default' };
  if (role === DATATABLE_VIEWER_ROLE) return { kind: 'viewer' };
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
  if (name === DATATABLE_VIEWER_ROLE) throw badRole('that name is reserved for the viewer request');
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
