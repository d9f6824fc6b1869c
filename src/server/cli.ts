import { Command, CommanderError, Option } from 'commander';
import {
  InvalidationUnsupportedError,
  publishInvalidation,
  StoreUnavailableError,
  ViewerCacheError,
} from '../index.js';
import { addAgentTokenCommands, runAgentWorker } from './cli_agents.js';
import {
  type GlobalOptions,
  output,
  withCatalog,
  workspaceArg,
  workspaceOf,
} from './cli_context.js';
import { addEmbedKeyCommands } from './cli_embed.js';
import { addGoverningCommands } from './cli_governing.js';
import { addTokenCommands } from './cli_tokens.js';
import { readConfig } from './config.js';
import { DEMO_WORKSPACE } from './demo.js';
import { createServerLogger, exitOnFatal, openRedis, startServer } from './runtime.js';
import { printWelcome } from './welcome.js';
import { startWorker } from './worker.js';

/** Exit codes: 0 done, 1 the operation failed or was refused, 2 the command line was wrong. */
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;

interface ServeOptions {
  port?: string;
  host?: string;
  demo?: boolean;
  apps?: string;
  execution?: string;
  agentGroup?: string;
}

export function buildCli(): Command {
  const program = new Command('viewer-cache')
    .description(
      'Reference server and admin CLI of viewer-cache: data tables as the viewer, cached per viewer.',
    )
    .option('--json', 'print machine-readable JSON')
    .addOption(
      new Option('-w, --workspace <id>', 'workspace')
        .default(DEMO_WORKSPACE)
        .argParser(workspaceArg),
    )
    .showHelpAfterError()
    .exitOverride();
  const ws = () => program.opts<GlobalOptions>().workspace;

  program
    .command('serve')
    .description(
      'start the HTTP server (embedded Postgres and in-process cache unless DATABASE_URL / REDIS_URL)',
    )
    .option('-p, --port <port>', 'port (default $PORT or 3000)')
    .option('--host <host>', 'interface to listen on (default $HOST or 127.0.0.1)')
    .option(
      '--demo',
      'seed the demo workspace (default: only on the embedded PostgreSQL; $VIEWER_CACHE_DEMO)',
    )
    .option(
      '--apps <path>',
      'serve the apps module at PATH (default export { runnables, apps, hooks?, schedules? }; $VIEWER_CACHE_APPS)',
    )
    .option(
      '--execution <mode>',
      'where misses run: in-process (here), queue (`viewer-cache worker` processes) or agent (agent workers); $VIEWER_CACHE_EXECUTION',
    )
    .option('--agent-group <name>', 'with --execution agent: the worker group that runs the jobs')
    .action(async (options: ServeOptions) => {
      const config = readConfig({
        ...process.env,
        ...(options.apps ? { VIEWER_CACHE_APPS: options.apps } : {}),
        ...(options.port ? { PORT: options.port } : {}),
        ...(options.host ? { HOST: options.host } : {}),
        ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
        ...(options.execution ? { VIEWER_CACHE_EXECUTION: options.execution } : {}),
        ...(options.agentGroup ? { VIEWER_CACHE_AGENT_GROUP: options.agentGroup } : {}),
      });
      const logger = createServerLogger(config);
      exitOnFatal(logger);
      const server = await startServer(config, logger);
      printWelcome(
        process.stdout,
        server.url,
        server.demoTokens,
        program.opts<GlobalOptions>().json === true,
      );
      await new Promise<void>((resolve) => {
        const stop = (signal: string) => {
          logger.info({ signal }, 'shutting down');
          server.close().then(resolve, resolve);
        };
        process.once('SIGINT', () => stop('SIGINT'));
        process.once('SIGTERM', () => stop('SIGTERM'));
      });
      // Log lines are written asynchronously: write what is left before the process exits.
      await new Promise<void>((resolve) => logger.flush(() => resolve()));
    });

  program
    .command('worker')
    .description(
      'run jobs for a server: queue workers need DATABASE_URL, REDIS_URL and VIEWER_CACHE_SECRET_KEY; --agent takes them over HTTP (VIEWER_CACHE_SERVER_URL + VIEWER_CACHE_AGENT_TOKEN, no database)',
    )
    .option('--agent', 'an agent worker: no DATABASE_URL, REDIS_URL or secret key (refused if set)')
    .option('--apps <path>', 'run the apps module at PATH, as the servers do ($VIEWER_CACHE_APPS)')
    .option(
      '--demo',
      "run the demo's apps ($VIEWER_CACHE_DEMO; one of --apps and --demo is needed)",
    )
    .option('--concurrency <n>', 'jobs run at once', '1')
    .option(
      '--port <port>',
      'queue workers: serve /healthz and /metrics on this port (default: none)',
    )
    .action(
      async (options: {
        agent?: boolean;
        apps?: string;
        demo?: boolean;
        concurrency: string;
        port?: string;
      }) => {
        if (options.agent === true) {
          await runAgentWorker(options);
          return;
        }
        const config = readConfig({
          ...process.env,
          ...(options.apps ? { VIEWER_CACHE_APPS: options.apps } : {}),
          ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
        });
        const concurrency = Number(options.concurrency);
        if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000)
          throw new TypeError('--concurrency must be an integer from 1 to 1000');
        const port = options.port === undefined ? undefined : Number(options.port);
        if (port !== undefined && (!Number.isInteger(port) || port < 0 || port > 65535))
          throw new TypeError('--port must be a port number');
        const lock = process.env['VIEWER_CACHE_WORKER_LOCK_MS'];
        const logger = createServerLogger(config);
        exitOnFatal(logger);
        const running = await startWorker(config, logger, {
          concurrency,
          ...(port === undefined ? {} : { port }),
          ...(lock ? { lockMs: Number(lock) } : {}),
        });
        process.stdout.write(
          `${JSON.stringify({ url: running.url, worker: running.worker.id, concurrency })}\n`,
        );
        await new Promise<void>((resolve) => {
          const stop = (signal: string) => {
            // Graceful: no new jobs, the running ones finish (a second signal does not wait).
            logger.info({ signal, running: running.worker.running }, 'worker stopping');
            running.close().then(resolve, resolve);
          };
          process.once('SIGINT', () => stop('SIGINT'));
          process.once('SIGTERM', () => stop('SIGTERM'));
        });
        await new Promise<void>((resolve) => logger.flush(() => resolve()));
      },
    );

  program
    .command('migrate')
    .description('apply catalog migrations (idempotent; safe with several processes)')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, { generation: datatables.generation }, () => 'catalog is up to date');
      }),
    );

  addTokenCommands(program);
  addAgentTokenCommands(program);
  addEmbedKeyCommands(program);
  addGoverningCommands(program);

  const roles = program.command('roles').description('data-table roles');
  roles
    .command('list')
    .description('list roles with their tenants')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        const list = await datatables.admin.listRoles(ws());
        output(program, list, (rows) =>
          rows.length === 0
            ? '(no roles)'
            : rows
                .map(
                  (r) =>
                    `${r.name}\t${r.datatable}\t${r.enabled ? 'enabled' : 'disabled'}\t${r.tenants.join(',') || '-'}`,
                )
                .join('\n'),
        );
      }),
    );
  roles
    .command('create <name>')
    .description('create a role (a Postgres login with a managed password)')
    .option('--datatable <name>', 'data table', 'main')
    .option(
      '--tenant <tenant...>',
      'user:EMAIL, group:NAME, folder:NAME, * (signed-in users), embed:* or embed:APP (embed viewers)',
    )
    .action((name: string, options: { datatable: string; tenant?: string[] }) =>
      withCatalog(async ({ datatables }) => {
        const change = await datatables.admin.createRole(ws(), options.datatable, name, {
          tenants: options.tenant ?? [],
        });
        output(program, change, () => `created role ${name}`);
      }),
    );
  roles
    .command('rename <name> <newName>')
    .description('rename a role (its set logins stay as they are)')
    .action((name: string, newName: string) =>
      withCatalog(async ({ datatables }) => {
        output(
          program,
          await datatables.admin.renameRole(ws(), name, newName),
          () => `renamed ${name} to ${newName}`,
        );
      }),
    );
  for (const [verb, done, what] of [
    ['disable', 'disabled', 'stop resolving a role and retire every set login that holds it'],
    ['enable', 'enabled', 'resolve a disabled role again'],
    ['drop', 'dropped', 'drop a role (and retire its set logins)'],
  ] as const) {
    roles
      .command(`${verb} <name>`)
      .description(what)
      .action((name: string) =>
        withCatalog(async ({ datatables }) => {
          const admin = datatables.admin;
          const change =
            verb === 'disable'
              ? await admin.disableRole(ws(), name)
              : verb === 'enable'
                ? await admin.enableRole(ws(), name)
                : await admin.dropRole(ws(), name);
          output(program, change, () => `${done} ${name}`);
        }),
      );
  }
  roles
    .command('tenants <name> [tenants...]')
    .description("show a role's tenants, or replace them with the ones given")
    .option('--clear', 'remove every tenant')
    .action((name: string, tenants: string[], options: { clear?: boolean }) =>
      withCatalog(async ({ datatables }) => {
        if (tenants.length > 0 || options.clear) {
          const change = await datatables.admin.setTenants(
            ws(),
            name,
            options.clear ? [] : tenants,
          );
          output(program, change, () => `tenants of ${name} set`);
          return;
        }
        const role = (await datatables.admin.listRoles(ws())).find((r) => r.name === name);
        if (role === undefined)
          throw new ViewerCacheError(`no role ${name}`, { code: 'E_UNKNOWN_ROLE', status: 404 });
        output(program, role.tenants, (list) => list.join('\n') || '(no tenants)');
      }),
    );

  const groups = program
    .command('groups')
    .description('group and folder memberships (built-in directory)');
  for (const verb of ['add', 'remove'] as const) {
    groups
      .command(`${verb} <email> <group>`)
      .description(
        `${verb} a user ${verb === 'add' ? 'to' : 'from'} a group (or folder with --folder)`,
      )
      .option('--folder', 'a folder rather than a group')
      .action((email: string, group: string, options: { folder?: boolean }) =>
        withCatalog(async ({ datatables }) => {
          const kind = options.folder ? 'folder' : 'group';
          const admin = datatables.admin;
          const change =
            verb === 'add'
              ? await admin.addMembership(ws(), email, kind, group)
              : await admin.removeMembership(ws(), email, kind, group);
          output(
            program,
            change,
            () => `${verb === 'add' ? 'added to' : 'removed from'} ${kind} ${group}`,
          );
        }),
      );
  }

  const logins = program
    .command('logins')
    .description('wm_set_ logins (one per distinct role set)');
  logins
    .command('list')
    .description('list set logins and the roles they hold')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, await datatables.listLogins(), (rows) =>
          rows.length === 0
            ? '(no set logins)'
            : rows
                .map(
                  (r) =>
                    `${r.login}\t${r.roles.join(',')}\t${r.hasRow ? 'recorded' : 'ORPHAN'}\t${r.canLogin ? 'login' : 'nologin'}`,
                )
                .join('\n'),
        );
      }),
    );
  logins
    .command('gc')
    .description('retire set logins no viewer resolves to any more (safe protocol)')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        const retired = await datatables.gcLogins();
        output(program, { retired }, ({ retired: list }) =>
          list.length === 0 ? 'nothing to retire' : `retired ${list.join(', ')}`,
        );
      }),
    );

  const cache = program.command('cache').description('the result cache');
  cache
    .command('invalidate')
    .description(
      'drop the cached results of the workspace (-w), or of one runnable with --path, in every server sharing REDIS_URL',
    )
    .option('--path <path>', "one runnable's path (default: the whole workspace)")
    .action(async (options: { path?: string }) => {
      const workspace = workspaceOf(program);
      await invalidateCache(workspace, options.path);
      output(program, { invalidated: { workspace, path: options.path ?? null } }, () =>
        options.path === undefined
          ? `invalidated workspace ${workspace}`
          : `invalidated ${options.path} in ${workspace}`,
      );
    });
  cache
    .command('stats')
    .description('cache counters of a running server')
    .option('--url <url>', 'server URL', `http://127.0.0.1:${process.env['PORT'] ?? 3000}`)
    .action(async (options: { url: string }) => {
      const response = await fetch(new URL('/api/cache/stats', options.url));
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const stats = (await response.json()) as Record<string, unknown>;
      output(program, stats, (value) =>
        Object.entries(value)
          .map(([key, count]) => `${key}\t${String(count)}`)
          .join('\n'),
      );
    });

  return program;
}

/**
 * Bumps the epoch through Redis: every server on the same Redis and prefix hears it on its bus
 * (or reads it from Redis if its bus is down). Without Redis each server's cache lives in its
 * own memory, out of reach of another process: refused.
 */
async function invalidateCache(workspace: string, path: string | undefined): Promise<void> {
  const config = readConfig();
  if (config.redisUrl === null) {
    throw new InvalidationUnsupportedError(
      'cache invalidate needs REDIS_URL (the Redis the servers share); without it each server keeps its cache in its own memory: restart the server instead',
    );
  }
  const redis = openRedis(config);
  redis.on('error', () => {}); // the command below reports its own failure
  const timeoutMs = Math.max(config.redisTimeoutMs, 2000);
  try {
    // The client queues nothing while it connects: wait for it, within the same bound.
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new StoreUnavailableError(`redis did not answer within ${timeoutMs} ms`)),
        timeoutMs,
      );
      redis.once('ready', () => {
        clearTimeout(timer);
        resolve();
      });
    });
    await publishInvalidation(redis, path === undefined ? { workspace } : { workspace, path }, {
      prefix: config.redisPrefix,
      timeoutMs,
    });
  } finally {
    redis.disconnect();
  }
}

/** Runs the CLI; resolves to the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const program = buildCli();
  try {
    await program.parseAsync(argv);
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      return err.exitCode === 0 ||
        err.code === 'commander.helpDisplayed' ||
        err.code === 'commander.version'
        ? 0
        : EXIT_USAGE;
    }
    const code = err instanceof ViewerCacheError ? err.code : 'E_FAILED';
    const message = err instanceof Error ? err.message : String(err);
    if (program.opts<GlobalOptions>().json) {
      process.stdout.write(`${JSON.stringify({ error: { code, message } })}\n`);
    } else {
      process.stderr.write(`error: ${code}: ${message}\n`);
    }
    return EXIT_FAILED;
  }
}
