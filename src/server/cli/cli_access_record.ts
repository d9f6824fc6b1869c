import { type Command, InvalidArgumentError } from 'commander';
import { listAccesses } from '../process/access_record.js';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

/**
 * `access-record list --user EMAIL`: what one person was shown, when — from the access record
 * (`VIEWER_CACHE_ACCESS_RECORD=on`), which keeps viewers as keyed hashes only: the email given
 * here is hashed with the deployment secret and looked up, never stored.
 */
export function addAccessRecordCommands(program: Command): void {
  const record = program
    .command('access-record')
    .description('who was shown what, when (VIEWER_CACHE_ACCESS_RECORD=on)');
  record
    .command('list')
    .description("one viewer's runs, newest first: app, runnable, origin, outcome — never rows")
    .requiredOption('--user <email>', "the viewer's email (hashed, never stored)")
    .option('--limit <n>', 'rows at most (1–10000)', parseLimit, 100)
    .action((options: { user: string; limit: number }) =>
      withCatalog(async ({ pool, secretKey }) => {
        const rows = await listAccesses(
          pool,
          secretKey,
          workspaceOf(program),
          options.user,
          options.limit,
        );
        output(program, rows, (list) =>
          table(
            ['AT', 'APP', 'RUNNABLE', 'ORIGIN', 'OUTCOME', 'CODE'],
            list.map((r) => [r.at, r.app ?? '-', r.runnable, r.origin, r.outcome, r.code ?? '-']),
            '(no accesses recorded for this viewer)',
          ),
        );
      }),
    );
}

function parseLimit(value: string): number {
  const limit = Number(value);
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
    throw new InvalidArgumentError('an integer from 1 to 10000');
  }
  return limit;
}
