import type { Command } from 'commander';
import { pino } from 'pino';
import { createExecutor, type Logger, type RunOrigin, withResultCache } from '../../index.js';
import { explainRun, type RunExplanation } from '../apps/explain_run.js';
import { DEMO_APPS, loadApps } from '../demo/demo_apps.js';
import { loadSecretKey, openCacheStore } from '../process/connections.js';
import { emailArg, output, withCatalog, workspaceOf } from './cli_context.js';

interface ExplainOptions {
  app: string;
  path: string;
  args?: string;
  viewer?: string;
  embed?: string;
  attr: string[];
  anonymous?: boolean;
  apps?: string;
  demo?: boolean;
}

/**
 * `viewer-cache explain`: for a viewer, an app's runnable and args, why a run would hit or miss
 * and as whom it would read (src/server/apps/explain_run.ts). Reads the server's cache store (as
 * configured, sealed with its secret key) without running anything.
 */
export function addExplainCommand(program: Command): void {
  program
    .command('explain')
    .description('why a run would hit or miss, and as whom it reads (no rows, passwords or tokens)')
    .requiredOption('--app <name>', 'the app the runnable is run through')
    .requiredOption('--path <path>', 'the runnable, e.g. f/clinics/patients')
    .option('--args <json>', 'the args, as a JSON object', '{}')
    .option('--viewer <email>', 'a signed-in viewer', emailArg)
    .option('--embed <app>', 'an embed viewer of this app')
    .option('--attr <k=v>', 'a signed attribute of the embed viewer', collect, [])
    .option('--anonymous', 'an anonymous visitor')
    .option('--apps <path>', 'the apps module the server serves (default: VIEWER_CACHE_APPS)')
    .option('--demo', "the demo's apps")
    .action((options: ExplainOptions) =>
      withCatalog(async ({ datatables, config }) => {
        const origin = originOf(options);
        let args: unknown;
        try {
          args = JSON.parse(options.args ?? '{}');
        } catch {
          throw new TypeError('--args must be a JSON object');
        }
        if (args === null || typeof args !== 'object' || Array.isArray(args))
          throw new TypeError('--args must be a JSON object');
        const source = options.demo ? DEMO_APPS : (options.apps ?? config.appsPath ?? DEMO_APPS);
        const apps = await loadApps(source, {
          childRunUrl: () => {
            throw new TypeError('explain runs nothing');
          },
          env: process.env,
        });
        const logger: Logger = pino({ level: 'warn' }, pino.destination(2));
        const cleanup: (() => Promise<unknown>)[] = [];
        try {
          const { store } = await openCacheStore(config, logger, cleanup);
          const executor = createExecutor({ runnables: apps.runnables, datatables });
          // The server's key names and seal, so its entries are found (and only they open).
          const cache = withResultCache(executor, {
            store,
            fingerprint: datatables.fingerprint,
            seal: { secretKey: await loadSecretKey(config) },
          });
          const explained = await explainRun(
            { executor, cache, datatables, apps: apps.apps },
            {
              workspace: workspaceOf(program),
              app: options.app,
              path: options.path,
              args: args as Record<string, unknown>,
              origin,
            },
          );
          output(program, explained, renderExplanation);
        } finally {
          for (const step of cleanup.reverse()) await step().catch(() => {});
        }
      }),
    );
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

function originOf(options: ExplainOptions): RunOrigin {
  const given = [options.viewer, options.embed, options.anonymous].filter((x) => x !== undefined);
  if (given.length !== 1) throw new TypeError('give one of --viewer, --embed or --anonymous');
  if (options.viewer !== undefined) return { kind: 'app', session: { email: options.viewer } };
  if (options.anonymous) return { kind: 'app', session: null };
  const attributes: Record<string, string> = {};
  for (const pair of options.attr) {
    const at = pair.indexOf('=');
    if (at <= 0) throw new TypeError('--attr is name=value');
    attributes[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return { kind: 'embed', viewer: { app: options.embed!, attributes, email: null } };
}

/** The explanation for people. */
export function renderExplanation(e: RunExplanation): string {
  const viewer =
    e.viewer.recorded ??
    (e.viewer.embed
      ? `embed viewer of ${e.viewer.embed.app} (${Object.entries(e.viewer.embed.attributes)
          .map(([k, v]) => `${k}=${v}`)
          .join(', ')})`
      : 'none (anonymous, schedule or hook)');
  const entry =
    e.entry.state === 'present'
      ? `present, ${e.entry.ageS ?? '?'} s old, ${e.entry.ttlLeftS ?? '?'} s left`
      : e.entry.state;
  return [
    `viewer       ${viewer}`,
    `runs as      ${e.runAs}`,
    `runnable     ${e.runnable.path} @ ${e.runnable.hash.slice(0, 12)}`,
    'roles',
    ...(e.roles.length === 0
      ? ['  (none)']
      : e.roles.map((r) => `  ${r.datatable}.${r.role}  named by ${r.namedBy.join(', ')}`)),
    `asks         ${e.datatables.dependencies === null ? '(nothing learned yet: every data table as the viewer)' : e.datatables.dependencies.join('  ')}`,
    ...e.datatables.answers.map((a) =>
      a.refused !== undefined
        ? `  ${a.question}  refused ${a.refused}`
        : a.login !== undefined
          ? `  ${a.question}  roles ${a.roles!.join(', ')}  login ${a.login}`
          : `  ${a.question}  ${a.holds === undefined ? '' : a.holds ? 'holds' : 'does not hold'}`,
    ),
    'key',
    `  args ${e.key.argsDigest.slice(0, 16)}…  viewer ${e.key.viewerDigest.slice(0, 16)}…  fingerprint ${e.key.fingerprintDigest.slice(0, 16)}…`,
    `  key  ${e.key.keyDigest.slice(0, 16)}…`,
    `entry        ${entry}`,
    'invalidated by',
    ...e.invalidatedBy.map((line) => `  - ${line}`),
  ].join('\n');
}
