import type { Command } from 'commander';
import {
  type Datatables,
  type RoleInfo,
  UnknownRoleError,
  ViewerCacheError,
  validateRoleName,
} from '../../index.js';
import { ApiTokens } from '../credentials/tokens.js';
import { emailArg, output, table, withCatalog, workspaceOf } from './cli_context.js';

/**
 * `--roles a,b`: the roles a scoped token is limited to, as the catalog ids they have now. A
 * name that is not a valid role name, or names no role of the workspace, is refused (a key must
 * not be made for a typo). Whether the user holds them is not checked: that can change either
 * way after creation, so every run takes the intersection with what the user holds then.
 * Ids, not names: a rename keeps the key's scope, and a role dropped and made again under the
 * same name is not in it.
 */
async function scopeOf(
  datatables: Datatables,
  workspace: string,
  list: string,
): Promise<{ ids: number[]; names: string[] }> {
  const names = [...new Set(list.split(',').map((name) => name.trim()))];
  if (names.length === 0 || names.some((name) => name === '')) {
    throw new ViewerCacheError('--roles is a comma-separated list of role names, none empty', {
      code: 'E_BAD_REQUEST',
      status: 400,
    });
  }
  for (const name of names) validateRoleName(name);
  const roles = new Map((await datatables.admin.listRoles(workspace)).map((r) => [r.name, r]));
  const ids = names.map((name) => {
    const role = roles.get(name);
    if (role === undefined || !role.exists) {
      throw new UnknownRoleError(`no role ${name} in this workspace`, { role: name });
    }
    return role.oid;
  });
  return { ids, names };
}

/** A token's scope as role names now (a dropped role as `#<catalog id>`), or null. */
function scopeNames(scope: readonly number[] | null, roles: readonly RoleInfo[]): string[] | null {
  if (scope === null) return null;
  return scope.map((id) => roles.find((role) => role.oid === id)?.name ?? `#${id}`);
}

/** `token create|list|revoke`: bearer tokens of the HTTP API, stored hashed. */
export function addTokenCommands(program: Command): void {
  const ws = () => workspaceOf(program);
  const token = program.command('token').description('bearer tokens for the HTTP API');
  token
    .command('create')
    .description('create a token for a user (printed once; stored hashed)')
    .requiredOption('--user <email>', 'the user the token signs in as', emailArg)
    .option('--label <text>', 'a note to recognise it by')
    .option(
      '--roles <a,b>',
      "scope the token to these roles: its runs get the user's roles ∩ these, never more (unknown names are refused)",
    )
    .action((options: { user: string; label?: string; roles?: string }) =>
      withCatalog(async ({ pool, datatables }) => {
        const scope =
          options.roles === undefined ? undefined : await scopeOf(datatables, ws(), options.roles);
        const created = await new ApiTokens(pool).create(
          ws(),
          options.user,
          options.label ?? null,
          scope?.ids,
        );
        output(
          program,
          { token: created, workspace: ws(), ...(scope ? { roles: scope.names } : {}) },
          ({ token: value }) => value,
        );
      }),
    );
  token
    .command('list')
    .description(
      "list the workspace's tokens (an id per token; the tokens themselves are not kept)",
    )
    .action(() =>
      withCatalog(async ({ pool, datatables }) => {
        const roles = await datatables.admin.listRoles(ws());
        const rows = (await new ApiTokens(pool).list(ws())).map((row) => ({
          ...row,
          roles: scopeNames(row.roleScope, roles),
        }));
        output(program, rows, (list) =>
          table(
            ['ID', 'USER', 'CREATED', 'LABEL', 'ROLES'],
            list.map((r) => [
              r.id,
              r.email,
              r.createdAt,
              r.label ?? '-',
              r.roles?.join(',') ?? 'all roles',
            ]),
            '(no tokens)',
          ),
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
