import { stat } from 'node:fs/promises';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  AppsModuleInvalidError,
  AppsModuleLoadFailedError,
  AppsModuleNotFoundError,
  WORKSPACE_RE,
} from '../../index.js';
import type { AppsContext, AppsDefinition, AppsExport, ServedApps } from './apps.js';
import { checkAudit, mergeAudits, NO_AUDIT } from './audit_definition.js';
/**
 * Loads the apps module at `source`, a path relative to the working directory (`.js`/`.mjs`, or
 * `.ts` when Node runs under tsx as `npm start` does). The module's default export is an
 * {@link AppsDefinition}, or a function of `context` returning one. Every name it mentions is
 * checked here (an app's runnable, a hook's, a schedule's), so a typo refuses the start with
 * E_APPS_MODULE_INVALID naming the field instead of a 404 at run time.
 */
export async function loadAppsModule(source: string, context: AppsContext): Promise<ServedApps> {
  const file = resolve(source);
  const found = await stat(file).catch(() => null);
  if (found === null || !found.isFile()) {
    throw new AppsModuleNotFoundError(
      `no apps module at ${file}: check the path given to --apps (VIEWER_CACHE_APPS)`,
    );
  }
  let loaded: { default?: unknown };
  try {
    loaded = (await import(pathToFileURL(file).href)) as { default?: unknown };
  } catch (err) {
    const hint = file.endsWith('.ts')
      ? ' (a .ts module needs tsx: `npm start -- --apps …`, or compile it to .js)'
      : '';
    throw new AppsModuleLoadFailedError(
      `the apps module ${file} could not be imported${hint}: ${err instanceof Error ? err.message : String(err)}`,
      { cause: err },
    );
  }
  if (loaded.default === undefined) {
    throw new AppsModuleInvalidError(
      `the apps module ${file} has no default export: export default defineApps({ runnables, apps })`,
    );
  }
  return mergeApps([await evaluate(loaded.default as AppsExport, context, file)]);
}

/**
 * What several apps definitions serve together, each evaluated against `context` and checked as
 * {@link loadAppsModule} checks a module's; `label` names each in errors.
 */
export async function serveAppsDefinitions(
  definitions: ReadonlyArray<{ readonly exported: AppsExport; readonly label: string }>,
  context: AppsContext,
): Promise<ServedApps> {
  const served: ServedApps[] = [];
  for (const { exported, label } of definitions)
    served.push(await evaluate(exported, context, label));
  return mergeApps(served);
}

async function evaluate(
  exported: AppsExport,
  context: AppsContext,
  name: string,
): Promise<ServedApps> {
  const definition = typeof exported === 'function' ? await exported(context) : exported;
  return checkApps(definition, name);
}

/** Checks one module's shape and every cross-reference; the message names the field. */
function checkApps(value: unknown, name: string): ServedApps {
  const refuse = (what: string) => new AppsModuleInvalidError(`the apps module ${name}: ${what}`);
  if (!isRecord(value)) throw refuse('the default export must be an object (defineApps)');
  const definition = value as Partial<AppsDefinition>;
  for (const key of Object.keys(value)) {
    if (!['runnables', 'apps', 'hooks', 'schedules', 'workspace', 'audit'].includes(key))
      throw refuse(`unknown field ${JSON.stringify(key)}`);
  }
  if (!isRecord(definition.runnables)) throw refuse('runnables must be an object by path');
  for (const [path, runnable] of Object.entries(definition.runnables)) {
    if (!isRecord(runnable)) throw refuse(`runnables[${JSON.stringify(path)}] must be an object`);
  }
  const has = (path: unknown) =>
    typeof path === 'string' && Object.hasOwn(definition.runnables!, path);
  if (!isRecord(definition.apps)) throw refuse('apps must be an object by app name');
  for (const [app, entry] of Object.entries(definition.apps)) {
    const at = `apps[${JSON.stringify(app)}]`;
    if (!isRecord(entry)) throw refuse(`${at} must be { publisher, public, runnables }`);
    if (typeof entry['publisher'] !== 'string' || entry['publisher'] === '')
      throw refuse(`${at}.publisher must be the publisher's email`);
    if (typeof entry['public'] !== 'boolean') throw refuse(`${at}.public must be true or false`);
    const paths = entry['runnables'];
    if (!Array.isArray(paths)) throw refuse(`${at}.runnables must be an array of paths`);
    for (const path of paths)
      if (!has(path)) throw refuse(`${at}.runnables names no runnable: ${JSON.stringify(path)}`);
  }
  const hooks = definition.hooks ?? {};
  if (!isRecord(hooks)) throw refuse('hooks must be an object: hook name → runnable path');
  for (const [hook, path] of Object.entries(hooks))
    if (!has(path)) throw refuse(`hooks[${JSON.stringify(hook)}] names no runnable`);
  const schedules = definition.schedules ?? [];
  if (!Array.isArray(schedules)) throw refuse('schedules must be an array');
  for (const [i, schedule] of schedules.entries()) {
    const at = `schedules[${i}]`;
    if (!isRecord(schedule) || typeof schedule['name'] !== 'string' || schedule['name'] === '')
      throw refuse(`${at} must be { name, path, owner, recipients? }`);
    if (!has(schedule['path'])) throw refuse(`${at}.path names no runnable`);
    if (typeof schedule['owner'] !== 'string' || schedule['owner'] === '')
      throw refuse(`${at}.owner must be the email the schedule runs as`);
  }
  const workspace = definition.workspace ?? null;
  if (workspace !== null && (typeof workspace !== 'string' || !WORKSPACE_RE.test(workspace)))
    throw refuse('workspace must be a workspace id');
  if (schedules.length > 0 && workspace === null)
    throw refuse('schedules need a workspace to run in: add workspace: "…"');
  const audit = checkAudit(definition.audit, (path) => has(path), refuse);
  return {
    runnables: definition.runnables,
    apps: definition.apps,
    hooks,
    schedules,
    workspace,
    audit,
  };
}

/** One served set out of several modules; a name two modules define is refused, not shadowed. */
function mergeApps(parts: readonly ServedApps[]): ServedApps {
  const runnables: Record<string, ServedApps['runnables'][string]> = {};
  const apps: Record<string, ServedApps['apps'][string]> = {};
  const hooks: Record<string, string> = {};
  const schedules: ServedApps['schedules'][number][] = [];
  let workspace: string | null = null;
  const put = <T>(into: Record<string, T>, from: Readonly<Record<string, T>>, what: string) => {
    for (const [name, value] of Object.entries(from)) {
      if (Object.hasOwn(into, name))
        throw new AppsModuleInvalidError(`two apps modules define ${what} ${JSON.stringify(name)}`);
      into[name] = value;
    }
  };
  for (const part of parts) {
    put(runnables, part.runnables, 'the runnable');
    put(apps, part.apps, 'the app');
    put(hooks, part.hooks, 'the hook');
    for (const schedule of part.schedules) {
      if (schedules.some((s) => s.name === schedule.name))
        throw new AppsModuleInvalidError(
          `two schedules are named ${JSON.stringify(schedule.name)}`,
        );
      schedules.push(schedule);
    }
    if (part.workspace !== null) {
      if (workspace !== null && workspace !== part.workspace)
        throw new AppsModuleInvalidError('the apps modules name different workspaces');
      workspace = part.workspace;
    }
  }
  return Object.freeze({
    runnables: Object.freeze(runnables),
    apps: Object.freeze(apps),
    hooks: Object.freeze(hooks),
    schedules: Object.freeze(schedules),
    workspace,
    audit: mergeAudits(
      parts.map((part) => part.audit),
      (what) => new AppsModuleInvalidError(what),
    ),
  });
}

/** The set a server serves when it was given no apps and seeded no demo: nothing. */
export const NO_APPS: ServedApps = Object.freeze({
  runnables: Object.freeze({}),
  apps: Object.freeze({}),
  hooks: Object.freeze({}),
  schedules: Object.freeze([]),
  workspace: null,
  audit: NO_AUDIT,
});

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}
