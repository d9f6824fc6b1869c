import type { Command } from 'commander';
import { ViewerCacheError } from '../index.js';
import { emailArg, output, withCatalog, workspaceOf } from './cli_context.js';
import { ApiTokens } from './tokens.js';

/** `token create|list|revoke`: bearer tokens of the HTTP API, stored hashed. */
export function addTokenCommands(program: Command): void {
  const ws = () => workspaceOf(program);
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
}
