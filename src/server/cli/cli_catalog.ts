import type { Command } from 'commander';
import { ViewerCacheError } from '../../index.js';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

/** The catalog's commands: the workspace's data tables, roles, groups and set logins. */
export function addCatalogCommands(program: Command): void {
  const ws = () => workspaceOf(program);
  const datatables = program
    .command('datatables')
    .description('data tables: named Postgres databases runnables reach as datatable://NAME');
  datatables
    .command('add <name>')
    .description('register (or repoint) data table NAME at Postgres database DB (idempotent)')
    .requiredOption('--database <db>', 'the Postgres database, on the catalog cluster')
    .action((name: string, options: { database: string }) =>
      withCatalog(async ({ datatables: dt }) => {
        const change = await dt.admin.createDatatable(ws(), name, { database: options.database });
        output(
          program,
          { datatable: name, database: options.database, ...change },
          () => `data table ${name} → database ${options.database}`,
        );
      }),
    );
  datatables
    .command('list')
    .description("list the workspace's data tables")
    .action(() =>
      withCatalog(async ({ datatables: dt }) => {
        output(program, await dt.admin.listDatatables(ws()), (rows) =>
          table(
            ['DATATABLE', 'DATABASE', 'DEFAULT_ROLE'],
            rows.map((r) => [r.name, r.database, r.defaultRole ?? '-']),
            '(no data tables)',
          ),
        );
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
    .description(
      'retire set logins no viewer resolves to any more (safe protocol), and collect learned dependency sets unused for 30 days',
    )
    .action(() =>
      withCatalog(async ({ datatables }) => {
        const retired = await datatables.gcLogins();
        // Sets of runnable versions no longer served: safe to drop (the full fingerprint).
        const learnedSetsRemoved = await datatables.gcLearnedSets();
        output(program, { retired, learnedSetsRemoved }, ({ retired: list }) =>
          [
            list.length === 0 ? 'nothing to retire' : `retired ${list.join(', ')}`,
            `collected ${learnedSetsRemoved} unused learned dependency set(s)`,
          ].join('\n'),
        );
      }),
    );
}

/** `viewer-cache migrate`: the catalog's and the server's migrations, then nothing. */
export function addMigrateCommand(program: Command): void {
  program
    .command('migrate')
    .description('apply catalog migrations (idempotent; safe with several processes)')
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, { generation: datatables.generation }, () => 'catalog is up to date');
      }),
    );
}
