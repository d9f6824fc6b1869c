import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import pg from 'pg';
import { pino } from 'pino';
import { createDatatables, type Datatables, type Logger, ViewerCacheError } from '../index.js';
import { readConfig, type ServerConfig } from './config.js';
import { DEMO_WORKSPACE } from './demo.js';
import { WORKSPACE_RE } from './http_schemas.js';
import { createServerLogger, loadSecretKey, openDatabase, startServer } from './runtime.js';
import { migrateServer } from './server_migrations.js';
import { ApiTokens } from './tokens.js';
import { printWelcome } from './welcome.js';

/** Exit codes: 0 done, 1 the operation failed or was refused, 2 the command line was wrong. */
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;

interface GlobalOptions {
  json?: boolean;
  workspace: string;
}

/** Prints `value` as JSON with --json, else as the human text `render` makes of it. */
function output<T>(program: Command, value: T, render: (value: T) => string): void {
  const { json } = program.opts<GlobalOptions>();
  process.stdout.write(json ? `${JSON.stringify(value, null, 2)}\n` : `${render(value)}\n`);
}

/** Opens the catalog (DATABASE_URL or the embedded server's), runs `fn`, and closes it all. */
async function withCatalog<T>(
  fn: (ctx: { datatables: Datatables; pool: pg.Pool; config: ServerConfig }) => Promise<T>,
): Promise<T> {
  const config = readConfig();
  const logger: Logger = pino({ level: process.env['LOG_LEVEL'] ?? 'warn' }, pino.destination(2));
  const secretKey = await loadSecretKey(config);
  const database = await openDatabase(config, logger);
  let datatables: Datatables | undefined;
  const pool = new pg.Pool({ connectionString: database.url, max: 2 });
  try {
    datatables = await createDatatables({ connection: database.url, secretKey, logger });
    await migrateServer(pool);
    return await fn({ datatables, pool, config });
  } finally {
    await datatables?.close();
    await pool.end();
    await database.embedded?.stop();
  }
}

/** A workspace id as the server and library accept it; anything else is a usage error. */
function workspaceArg(value: string): string {
  if (!WORKSPACE_RE.test(value)) {
    throw new InvalidArgumentError(
      'a workspace is 1-128 letters, digits, `_`, `.` or `-`, starting with a letter or digit',
    );
  }
  return value;
}

/** A user's email (the identity a token signs in as); anything else is a usage error. */
function emailArg(value: string): string {
  if (value.length > 254 || !/^[^\s@<>"'`,;\\]+@[^\s@<>"'`,;\\]+$/.test(value)) {
    throw new InvalidArgumentError('the user is an email address, such as alice@example.com');
  }
  return value;
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
    .action(async (options: { port?: string; host?: string; demo?: boolean }) => {
      const config = readConfig({
        ...process.env,
        ...(options.port ? { PORT: options.port } : {}),
        ...(options.host ? { HOST: options.host } : {}),
        ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
      });
      const logger = createServerLogger(config);
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
    .command('migrate')
    .description('apply catalog migrations (idempotent; safe with several processes)')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, { generation: datatables.generation }, () => 'catalog is up to date');
      }),
    );

  const token = program.command('token').description('bearer tokens for the HTTP API');
  token
    .command('create')
    .description('create a token for a user (printed once; stored hashed)')
    .requiredOption('--user <email>', 'the user the token signs in as', emailArg)
    .option('--label <text>', 'a note to recognise it by')
    .action((options: { user: string; label?: string }) =>
      withCatalog(async ({ pool }) => {
        const created = await new ApiTokens(pool).create(ws(), options.user, options.label ?? null);
        output(program, { token: created, workspace: ws() }, ({ token: value }) => value);
      }),
    );
  token
    .command('list')
    .description(
      "list the workspace's tokens (an id per token; the tokens themselves are not kept)",
    )
    .action(() =>
      withCatalog(async ({ pool }) => {
        output(program, await new ApiTokens(pool).list(ws()), (rows) =>
          rows.length === 0
            ? '(no tokens)'
            : rows.map((r) => `${r.id}\t${r.email}\t${r.createdAt}\t${r.label ?? '-'}`).join('\n'),
        );
      }),
    );
  token
    .command('revoke [id]')
    .description(
      'revoke a token by its id from `token list` (or every token of --user); every server refuses it within a second',
    )
    .option('--user <email>', 'revoke every token of this user', emailArg)
    .action((id: string | undefined, options: { user?: string }) =>
      withCatalog(async ({ pool }) => {
        if ((id === undefined) === (options.user === undefined)) {
          throw new ViewerCacheError('name a token id or --user, not both', {
            code: 'E_BAD_REQUEST',
            status: 400,
          });
        }
        const tokens = new ApiTokens(pool);
        const revoked = await tokens.revoke(
          ws(),
          id === undefined ? { email: options.user! } : { id },
        );
        if (revoked === 0) {
          throw new ViewerCacheError('no such token in this workspace', {
            code: 'E_UNKNOWN_TOKEN',
            status: 404,
          });
        }
        output(program, { revoked }, () => `revoked ${revoked} token${revoked === 1 ? '' : 's'}`);
      }),
    );

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
    .option('--tenant <tenant...>', 'user:EMAIL, group:NAME, folder:NAME or *')
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

  program
    .command('cache')
    .description('cache counters of a running server')
    .command('stats')
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
