/**
 * The apps the reference server serves: who published each (its jobs run as them), whether
 * anonymous visitors may use it, and which runnables it may run. The routes read them; an apps
 * module (apps_loader.ts: yours with `serve --apps PATH`, or the demo's) only writes them, so
 * nothing here knows of HTTP.
 */
import type { RunnableDefinition } from '../../index.js';
import type { AuditDefinition, ServedAudit } from './audit_definition.js';
import type { ScheduleDefinition } from './scheduler.js';

/** An app: who published it (jobs run as them), whether anonymous visitors may use it. */
export interface AppDefinition {
  readonly publisher: string;
  readonly public: boolean;
  readonly runnables: readonly string[];
}

/** The apps served, by name. */
export type Apps = Readonly<Record<string, AppDefinition>>;

/**
 * What an apps module's default export describes (`serve --apps PATH`): the runnables the
 * server's executor may run, the apps that expose them, and optionally webhooks and schedules.
 */
export interface AppsDefinition {
  /** Runnables by path (`f/orders/list`): TypeScript functions or SQL scripts. */
  readonly runnables: Readonly<Record<string, RunnableDefinition>>;
  /** Apps by name; each lists the runnable paths it may run. */
  readonly apps: Apps;
  /** Webhook name → runnable path (`POST /api/w/:ws/hooks/:hook`, no viewer). @default {} */
  readonly hooks?: Readonly<Record<string, string>>;
  /** Runs on an interval as their owner (no viewer), or once per recipient. @default [] */
  readonly schedules?: readonly ScheduleDefinition[];
  /** The workspace the schedules run in; required when there are schedules. */
  readonly workspace?: string;
  /**
   * What `viewer-cache audit` may run as every viewer, and what must hold (see
   * audit_definition.ts). @default nothing is audited
   */
  readonly audit?: AuditDefinition;
}

/** What the server hands a module that exports a function instead of an object. */
export interface AppsContext {
  /**
   * The server's job-token route of a workspace (`POST …/jobs/run_child`), for a runnable that
   * starts a child job over HTTP with `ctx.jobToken`. Known once the server listens: call it
   * while a job runs, not while the module loads.
   */
  readonly childRunUrl: (workspace: string) => URL;
  /** The environment the server was started with. */
  readonly env: Readonly<Record<string, string | undefined>>;
}

/** An apps module's default export: the definition, or a function of the server's context. */
export type AppsExport =
  | AppsDefinition
  | ((context: AppsContext) => AppsDefinition | Promise<AppsDefinition>);

/**
 * Types an apps module's default export (an identity function, as Vite's `defineConfig`):
 * `export default defineApps({ runnables, apps })`.
 */
export function defineApps<const T extends AppsExport>(definition: T): T {
  return definition;
}

/** A loaded, checked apps module: every name it mentions exists. Frozen. */
export interface ServedApps {
  readonly runnables: Readonly<Record<string, RunnableDefinition>>;
  readonly apps: Apps;
  readonly hooks: Readonly<Record<string, string>>;
  readonly schedules: readonly ScheduleDefinition[];
  /** The workspace the schedules run in; null when there are none. */
  readonly workspace: string | null;
  /** What `viewer-cache audit` runs and checks. */
  readonly audit: ServedAudit;
}
