import type { Command } from 'commander';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

/**
 * `governing add|remove|list`: tables whose rows govern who sees what (an entitlements table).
 * A change to their rows, by anyone, makes the affected viewers' next run miss in every process.
 * Both changes are idempotent: a repeat of `add` updates the viewer column, of `remove` does
 * nothing.
 */
export function addGoverningCommands(program: Command): void {
  const ws = () => workspaceOf(program);
  const governing = program
    .command('governing')
    .description("tables whose rows govern who sees what (in the catalog's database)");
  governing
    .command('add')
    .description('declare a governing table: a change to its rows reaches the cache at once')
    .option('--datatable <name>', 'data table', 'main')
    .requiredOption('--table <table>', 'the table, e.g. public.entitlements')
    .option(
      '--viewer-column <column>',
      "column holding the viewer's email: a change then concerns only the viewers it names",
    )
    .action((options: { datatable: string; table: string; viewerColumn?: string }) =>
      withCatalog(async ({ datatables }) => {
        const change = await datatables.admin.addGoverningTable(
          ws(),
          options.datatable,
          options.table,
          options.viewerColumn === undefined ? {} : { viewerColumn: options.viewerColumn },
        );
        output(program, change, () => `${options.table} governs ${options.datatable}`);
      }),
    );
  governing
    .command('remove')
    .description('remove a governing table (its triggers dropped)')
    .option('--datatable <name>', 'data table', 'main')
    .requiredOption('--table <table>', 'the table, e.g. public.entitlements')
    .action((options: { datatable: string; table: string }) =>
      withCatalog(async ({ datatables }) => {
        const change = await datatables.admin.removeGoverningTable(
          ws(),
          options.datatable,
          options.table,
        );
        output(program, change, () => `${options.table} no longer governs ${options.datatable}`);
      }),
    );
  governing
    .command('list')
    .description("list the workspace's governing tables")
    .action(() =>
      withCatalog(async ({ datatables }) => {
        output(program, await datatables.admin.listGoverningTables(ws()), (rows) =>
          table(
            ['DATATABLE', 'TABLE', 'VIEWER_COLUMN'],
            rows.map((r) => [r.datatable, r.table, r.viewerColumn ?? '-']),
            '(no governing tables)',
          ),
        );
      }),
    );
}
