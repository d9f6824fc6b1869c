import type { DatatableRef } from '../../connector/datatable_ref.js';

/*
 * The grammar of what a run depends on: each question a run asks the connector, written as text
 * (a data-table reference, or a role check), and sets of them. Both the authorization, which
 * answers each question (authorization.ts), and the run dependencies, which record and predict
 * them (run_dependencies.ts), speak it; neither owns it.
 */

/** One question a run asks the connector, as text: a reference, or a role check. */
export type Dependency = string;

/**
 * An immutable, sorted set of dependencies; `everything` means every reference of the workspace
 * (the full fingerprint). Compared by identity in memos: a set that grows is a new object.
 */
export interface DependencySet {
  readonly everything: boolean;
  readonly members: readonly Dependency[];
}

/** The dependency text of a reference: JSON, so names can never run into each other. */
export function refDependency(ref: DatatableRef): Dependency {
  const { name, access } = ref;
  return access.kind === 'role'
    ? JSON.stringify(['r', name, access.role])
    : JSON.stringify([access.kind === 'viewer' ? 'v' : 'd', name]);
}

/** Every reference the job could make: the answer is the workspace-wide fingerprint. */
export const EVERY_REFERENCE: Dependency = '"*"';

export function holdsDependency(datatable: string, role: string): Dependency {
  return JSON.stringify(['h', datatable, role]);
}

/** The question a dependency text stands for. */
export function parseDependency(
  dependency: Dependency,
): { ref: DatatableRef } | { holds: { datatable: string; role: string } } | { every: true } {
  if (dependency === EVERY_REFERENCE) return { every: true };
  const [kind, name, role] = JSON.parse(dependency) as [string, string, string?];
  switch (kind) {
    case 'v':
      return { ref: { name, access: { kind: 'viewer' } } };
    case 'd':
      return { ref: { name, access: { kind: 'default' } } };
    case 'r':
      return { ref: { name, access: { kind: 'role', role: role as string } } };
    default:
      return { holds: { datatable: name, role: role as string } };
  }
}
