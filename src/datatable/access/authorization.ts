/*
 * datatable/access/ — who may use what: the one set of authorization rules, from which both the
 * grant of a connection and the cache fingerprint are derived (this file); the roles whose
 * tenants name someone (resolve_roles.ts); a job's authorization on a fresh catalog, memoised
 * (job_authorizations.ts); and what a run depended on (run_dependencies.ts), in the grammar of
 * dependency.ts. Reads the catalog; knows nothing of logins or connections.
 */
import { hash, randomUUID } from 'node:crypto';
import type { DatatableRef } from '../../connector/datatable_ref.js';
import type { EmbedViewer } from '../../embed_viewer.js';
import {
  type ErrorOptions,
  NoDefaultRoleError,
  NoRolesError,
  NoViewerError,
  RoleNotPermittedError,
  RoleRequiredError,
  UnknownDatatableError,
  UnknownRoleError,
  type ViewerCacheError,
} from '../../errors.js';
import type { CatalogDatatable, CatalogRole, CatalogState } from '../catalog/catalog_state.js';
import type { Principals } from '../catalog/directory.js';
import { type Dependency, type DependencySet, parseDependency } from './dependency.js';
import { mayUseRole, resolveEmbedRoles, resolveRoles } from './resolve_roles.js';

/** The people a job's data-table access is decided for, with their group/folder memberships. */
export interface JobParties {
  readonly workspace: string;
  /** `perms.email`: who the job runs as; decides `?role=` by name. */
  readonly runner: { readonly email: string; readonly principals: Principals };
  /** `perms.endUserEmail`: decides `?as=viewer`; `null` when the run has no viewer. */
  readonly viewer: { readonly email: string; readonly principals: Principals } | null;
  /**
   * `perms.roleScope` (canonical, see `canonicalRoleScope`): every grant — viewer, role by
   * name, default — holds only roles whose catalog id is listed. Absent: unscoped.
   */
  readonly roleScope?: readonly number[] | undefined;
  /**
   * `perms.embed` (then `viewer` is null): decides `?as=viewer` through `embed:` tenants only.
   * Only its app matters here; its attributes and email are bound to the connection and keyed.
   */
  readonly embed?: Pick<EmbedViewer, 'app'> | undefined;
}

/** What one reference grants: where to connect, and the roles the connection holds. */
export interface Grant {
  readonly datatable: CatalogDatatable;
  /** At least one, sorted by catalog id: one role → its own login, several → their set login. */
  readonly roles: readonly CatalogRole[];
  /**
   * The change stamps of the data table's governing tables that can alter what this connection
   * sees: for the viewer, the table-wide stamp and their own; for a role, any change.
   */
  readonly governing: string;
}

/**
 * What a job may use: the one place the authorization rules live (SPEC invariants 2, 5, 6).
 *
 * The connection comes from {@link grant}, and the cache fingerprint is *derived from the same
 * function*: it is the outcome of `grant` for every reference the job could make in its
 * workspace (each data table × viewer / default / each of its roles by name). So a change that
 * alters what any reference grants changes the fingerprint, a change that alters none leaves it
 * alone, and a new access kind cannot reach the connection without reaching the key.
 */
export class JobAuthorization {
  readonly #state: CatalogState;
  readonly #parties: JobParties;
  /** Fingerprint parts that depend only on the runner, shared by the jobs of one state. */
  readonly #runnerParts: Map<string, string> | undefined;
  #fingerprint: string | undefined;
  /** Fingerprints over dependency sets (see run_dependencies.ts), by set. */
  #fingerprints: WeakMap<DependencySet, string> | undefined;
  /** The viewer's roles by data table (one pass over the workspace's roles), on first use. */
  #viewerRoles: Map<string, CatalogRole[]> | undefined;

  /** Databases whose rules version is confirmed (RulesWatch); undefined: all of them. */
  readonly #confirmed: ReadonlySet<string> | undefined;
  /** Stands for an unconfirmed rules version: this instance's own, so it matches no entry. */
  #unconfirmed: string | undefined;

  constructor(
    state: CatalogState,
    parties: JobParties,
    runnerParts?: Map<string, string>,
    confirmed?: ReadonlySet<string>,
  ) {
    this.#state = state;
    this.#parties = parties;
    this.#runnerParts = confirmed === undefined ? runnerParts : undefined;
    this.#confirmed = confirmed;
  }

  /**
   * The roles `ref` grants this job, or the coded refusal (fail closed; never a wider login).
   * @throws {ViewerCacheError} E_UNKNOWN_DATATABLE, E_NO_VIEWER, E_NO_ROLES, E_UNKNOWN_ROLE,
   *   E_ROLE_NOT_PERMITTED, E_NO_DEFAULT_ROLE or (narrowed) E_ROLE_REQUIRED.
   */
  grant(ref: DatatableRef): Grant {
    const decision = this.#decide(ref);
    if ('refused' in decision) {
      throw new decision.refused(decision.message, decision.context);
    }
    return decision;
  }

  /** {@link grant} without throwing: refusals are values here (the fingerprint reads many). */
  #decide(ref: DatatableRef): Grant | Refusal {
    const { workspace, runner, viewer } = this.#parties;
    const state = this.#state;
    const datatable = state.datatable(workspace, ref.name);
    if (datatable === undefined) {
      return {
        refused: UnknownDatatableError,
        message: `no data table ${JSON.stringify(ref.name)} in this workspace`,
        context: { datatable: ref.name },
      };
    }
    const context = { datatable: datatable.name };
    switch (ref.access.kind) {
      case 'viewer': {
        // The viewer is perms.endUserEmail (or the embed viewer) and nothing else; never
        // perms.email (invariant 2).
        const embed = this.#parties.embed;
        if (viewer === null && embed === undefined) return { refused: NoViewerError, context };
        const roles = this.#rolesOfViewer().get(datatable.name) ?? [];
        if (roles.length === 0) {
          // An empty intersection is a refusal, never a fallback to the unscoped roles.
          const message = this.#parties.roleScope
            ? 'the viewer holds no enabled role of this data table within the role scope of this run'
            : undefined;
          return { refused: NoRolesError, ...(message ? { message } : {}), context };
        }
        return { datatable, roles, governing: this.#viewerGoverning(datatable.name) };
      }
      case 'narrowed': {
        // Every name must be a role of this data table: a typo is the runnable's error, said
        // as such (whoever the viewer is), never a quiet "holds none".
        for (const name of ref.access.roles) {
          const role = this.#roleOf(datatable.name, name);
          if ('refused' in role) return role;
        }
        const embed = this.#parties.embed;
        if (viewer === null && embed === undefined) return { refused: NoViewerError, context };
        // The viewer's roles (within the role scope) that the request names: never one more.
        const named = ref.access.roles;
        const roles = (this.#rolesOfViewer().get(datatable.name) ?? []).filter((role) =>
          named.includes(role.name),
        );
        if (roles.length === 0) {
          return {
            refused: RoleRequiredError,
            message: `the viewer holds none of the roles this connection is narrowed to (${named.join(', ')})`,
            context,
          };
        }
        return { datatable, roles, governing: this.#viewerGoverning(datatable.name) };
      }
      case 'role': {
        const name = ref.access.role;
        const role = this.#roleOf(datatable.name, name);
        if ('refused' in role) return role;
        if (!mayUseRole(role, runner.email, runner.principals)) {
          return {
            refused: RoleNotPermittedError,
            message: role.enabled
              ? 'the runner is not a tenant of that role'
              : 'that role is disabled',
            context: { ...context, role: name },
          };
        }
        if (!this.#inScope(role)) return outOfScope(context, role);
        return { datatable, roles: [role], governing: this.#anyChange(datatable.name) };
      }
      case 'default': {
        if (datatable.defaultRole === null) return { refused: NoDefaultRoleError, context };
        const role = state.role(datatable.defaultRole);
        if (role === undefined || !role.enabled || !role.safe) {
          return {
            refused: RoleNotPermittedError,
            message: 'the default role of this data table is disabled',
            context: { ...context, ...(role === undefined ? {} : { role: role.name }) },
          };
        }
        if (!this.#inScope(role)) return outOfScope(context, role);
        return { datatable, roles: [role], governing: this.#anyChange(datatable.name) };
      }
    }
  }

  /** The role of data table `datatable` named `name`, or E_UNKNOWN_ROLE. */
  #roleOf(datatable: string, name: string): CatalogRole | Refusal {
    const role = this.#state.roleByName(this.#parties.workspace, name);
    if (role !== undefined && role.datatable === datatable) return role;
    return {
      refused: UnknownRoleError,
      message: `no role ${name} on this data table`,
      context: { datatable, role: name },
    };
  }

  /** The viewer's (or embed viewer's) roles by data table; call only when there is one. */
  #rolesOfViewer(): Map<string, CatalogRole[]> {
    if (this.#viewerRoles === undefined) {
      const byDatatable = new Map<string, CatalogRole[]>();
      const { workspace, viewer, embed } = this.#parties;
      const roles =
        viewer !== null
          ? resolveRoles(this.#state, workspace, viewer.email, viewer.principals)
          : resolveEmbedRoles(this.#state, workspace, embed!.app);
      for (const role of roles) {
        if (!this.#inScope(role)) continue;
        const list = byDatatable.get(role.datatable);
        if (list === undefined) byDatatable.set(role.datatable, [role]);
        else list.push(role);
      }
      this.#viewerRoles = byDatatable;
    }
    return this.#viewerRoles;
  }

  /** Whether the run's role scope (if any) lists `role`. */
  #inScope(role: CatalogRole): boolean {
    const scope = this.#parties.roleScope;
    return scope === undefined || scope.includes(role.oid);
  }

  /**
   * Stamps of the changes to the data table's governing tables that can alter what the viewer
   * sees: the table-wide stamp and their own. An embed viewer is no email of the governing
   * tables: any change counts.
   */
  #viewerGoverning(datatable: string): string {
    const viewer = this.#parties.viewer;
    if (viewer === null) return this.#anyChange(datatable);
    return this.#state
      .governing(this.#parties.workspace, datatable)
      .map((t) => `${t.relation}:${t.wide}:${t.byViewer.get(viewer.email) ?? ''}`)
      .join(',');
  }

  /** Stamps of any change to the data table's governing tables (connections with no viewer). */
  #anyChange(datatable: string): string {
    return this.#state
      .governing(this.#parties.workspace, datatable)
      .map((t) => `${t.relation}:${t.latest}`)
      .join(',');
  }

  /**
   * Whether the viewer holds role `role` of `datatable`: one of the roles `?as=viewer` would
   * grant. Part of the fingerprint by construction (it reads the same grant). An embed viewer
   * holds no roles of their own: only the roles whose tenants name embed viewers answer true.
   */
  viewerHolds(datatable: string, role: string): boolean {
    return this.#heldRole(datatable, role) !== undefined;
  }

  #heldRole(datatable: string, role: string): CatalogRole | undefined {
    const decision = this.#decide({ name: datatable, access: { kind: 'viewer' } });
    return 'refused' in decision ? undefined : decision.roles.find((held) => held.name === role);
  }

  /**
   * The authorization fingerprint: the catalog's id, then the outcome of {@link grant} for every
   * reference of the workspace (each role with its version), hashed. Computed once per
   * instance. The generation is left out on purpose: a change that grants this job nothing new
   * and takes nothing away leaves its fingerprint, and so its cache entries, alone.
   *
   * A narrowed viewer request (`?as=viewer&roles=…`, any list) needs no part of its own: its
   * outcome is a function of the viewer's outcome (their roles with versions, and the governing
   * stamps) and of which role names exist on the data table (the runner part lists every role
   * of each data table by name), both hashed here. So whatever moves a narrowed answer moves
   * this too (checked by test/unit/run_dependencies.test.ts).
   */
  get fingerprint(): string {
    this.#fingerprint ??= this.#computeFingerprint();
    return this.#fingerprint;
  }

  #computeFingerprint(): string {
    const { workspace, runner } = this.#parties;
    const state = this.#state;
    const viewerPart: string[] = [];
    for (const { name } of state.datatables(workspace)) {
      viewerPart.push(
        `${JSON.stringify(name)}:v=${this.#outcome({ name, access: { kind: 'viewer' } })}`,
      );
    }
    // What the runner may use by name or by default depends on the runner and the role scope
    // alone: computed (and hashed) once per catalog state, runner and scope, not once per viewer.
    // The scope is in the memo key: two scopes of one runner sharing a part would be a leak.
    const scope = this.#parties.roleScope;
    const runnerKey = `${scope === undefined ? '' : `=${scope.join(',')}`}\0${workspace}\0${runner.email}`;
    let runnerPart = this.#runnerParts?.get(runnerKey);
    if (runnerPart === undefined) {
      const parts: string[] = [];
      for (const { name } of state.datatables(workspace)) {
        parts.push(
          `${JSON.stringify(name)}:d=${this.#outcome({ name, access: { kind: 'default' } })}`,
        );
        for (const role of state.roles(workspace)) {
          if (role.datatable !== name) continue;
          const ref: DatatableRef = { name, access: { kind: 'role', role: role.name } };
          parts.push(`${JSON.stringify(role.name)}=${this.#outcome(ref)}`);
        }
      }
      runnerPart = hash('sha256', parts.join('\n'), 'base64url');
      this.#runnerParts?.set(runnerKey, runnerPart);
    }
    const digest = hash('sha256', `${viewerPart.join('\n')}\n--\n${runnerPart}`, 'base64url');
    return `c${state.catalogId};${digest}`;
  }

  /**
   * The fingerprint over `set` only: the catalog's id, then the {@link answer} to each of its
   * questions, hashed. Over the set of every question it is {@link fingerprint}.
   */
  fingerprintOver(set: DependencySet): string {
    if (set.everything) return this.fingerprint;
    if (set.members.length === 0) return `c${this.#state.catalogId};-`;
    this.#fingerprints ??= new WeakMap();
    let fingerprint = this.#fingerprints.get(set);
    if (fingerprint === undefined) {
      const parts = set.members.map((dependency) => `${dependency}=${this.answer(dependency)}`);
      fingerprint = `c${this.#state.catalogId};d${hash('sha256', parts.join('\n'), 'base64url')}`;
      this.#fingerprints.set(set, fingerprint);
    }
    return fingerprint;
  }

  /**
   * What this job is told when it asks `dependency`, as text: a reference's grant (or refusal),
   * or whether the viewer holds a role (and which version of it; not the viewer's other roles,
   * which the check does not reveal).
   */
  answer(dependency: Dependency): string {
    const question = parseDependency(dependency);
    if ('every' in question) return this.fingerprint;
    if ('ref' in question) return this.#outcome(question.ref);
    const held = this.#heldRole(question.holds.datatable, question.holds.role);
    // With the role's version: a role disabled and enabled again never brings entries back.
    return held === undefined ? 'no' : `yes:${held.oid}@${held.version}`;
  }

  /**
   * A grant as text: the database, role ids with versions, governing stamps and rules version,
   * or the refusal's code.
   */
  #outcome(ref: DatatableRef): string {
    const decision = this.#decide(ref);
    if ('refused' in decision) return `!${decision.refused.code}`;
    const { datatable, roles, governing } = decision;
    // The rules version: a policy, grant, view or function changed in the data table's
    // database moves every answer that connects there, and no other.
    // Unconfirmed (its database did not answer the rules check in time): a value of this
    // instance alone, so no entry is served and nothing stored is found again (fail closed).
    let rules: string;
    if (this.#confirmed === undefined || this.#confirmed.has(datatable.database)) {
      rules = this.#state.rulesVersion(this.#parties.workspace, datatable.name);
    } else {
      this.#unconfirmed ??= `?${randomUUID()}`;
      rules = this.#unconfirmed;
    }
    return `${JSON.stringify(datatable.database)}[${roles.map((role) => `${role.oid}@${role.version}`).join(',')}]{${governing}}~${rules}`;
  }
}

/** `?role=` or the default role outside the run's role scope (a scoped API key). */
function outOfScope(context: { datatable: string }, role: CatalogRole): Refusal {
  return {
    refused: RoleNotPermittedError,
    message: 'that role is outside the role scope of this run (a scoped API key)',
    context: { ...context, role: role.name },
  };
}

/** A refusal as a value: the error class to throw, and what to throw it with. */
interface Refusal {
  readonly refused: (new (
    message?: string,
    options?: ErrorOptions,
  ) => ViewerCacheError) & {
    readonly code: string;
  };
  readonly message?: string;
  readonly context: ErrorOptions;
}
