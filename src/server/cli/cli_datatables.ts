import type { Command } from 'commander';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

/** `viewer-cache datatables add|list`: register a data table, and see the workspace's. */
export function addDatatableCommands(program: Command): void {
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
}
