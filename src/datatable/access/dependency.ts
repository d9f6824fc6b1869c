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

/**
 * The dependency text of a reference: JSON, so names can never run into each other. A narrowed
 * viewer request is its own question (`n`, with its sorted roles): its answer is the subset it
 * grants, and its text never equals the unnarrowed viewer's (`v`), so neither entry can stand
 * for the other.
 */
export function refDependency(ref: DatatableRef): Dependency {
  const { name, access } = ref;
  switch (access.kind) {
    case 'role':
      return JSON.stringify(['r', name, access.role]);
    case 'narrowed':
      return JSON.stringify(['n', name, ...access.roles]);
    case 'viewer':
      return JSON.stringify(['v', name]);
    case 'default':
      return JSON.stringify(['d', name]);
  }
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
  const [kind, name, ...rest] = JSON.parse(dependency) as [string, string, ...string[]];
  switch (kind) {
    case 'v':
      return { ref: { name, access: { kind: 'viewer' } } };
    case 'n':
      return { ref: { name, access: { kind: 'narrowed', roles: rest } } };
    case 'd':
      return { ref: { name, access: { kind: 'default' } } };
    case 'r':
      return { ref: { name, access: { kind: 'role', role: rest[0] as string } } };
    case 'h':
      return { holds: { datatable: name, role: rest[0] as string } };
    default:
      throw new Error(`not a dependency: ${dependency}`);
  }
}
