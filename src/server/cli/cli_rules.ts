import type { Command } from 'commander';
import { output, withCatalog } from './cli_context.js';

/**
 * `cache invalidate --datatable NAME`: a fresh rules version for the data table, so every entry
 * whose run depended on it misses from the next run, in every server and worker on the catalog
 * (through the catalog, not Redis: it works without REDIS_URL). For rule changes the library
 * cannot see — a policy reading a table in another database, a function reading the clock.
 * Returns once every running server acknowledged it, and says how many did.
 */
export async function invalidateDatatable(
  program: Command,
  workspace: string,
  datatable: string,
): Promise<void> {
  await withCatalog(async ({ datatables }) => {
    const { generation, acknowledged, missing } = await datatables.invalidateDatatable(
      workspace,
      datatable,
    );
    output(
      program,
      { invalidated: { workspace, datatable }, generation, receivers: acknowledged, missing },
      () =>
        `invalidated every entry that depended on data table ${datatable} in workspace ${workspace} (heard by ${acknowledged} server process${acknowledged === 1 ? '' : 'es'}${missing === 0 ? '' : `; ${missing} did not answer and stopped trusting their memory by the staleness bound`})`,
    );
  });
}
