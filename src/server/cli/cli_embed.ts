import { type Command, InvalidArgumentError, Option } from 'commander';
import {
  EMBED_ALGORITHMS,
  type EmbedAlgorithm,
  embedAudience,
  ViewerCacheError,
} from '../../index.js';
import { EmbedKeys } from '../credentials/embed_keys.js';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

/**
 * `embed-key create|list|rotate|revoke`: the keys a host signs embed links with, per workspace.
 * The server keeps public halves only; `create` and `rotate` print the signing key once.
 */
export function addEmbedKeyCommands(program: Command): void {
  const ws = () => workspaceOf(program);
  const embedKey = program
    .command('embed-key')
    .description('keys a host application signs per-viewer embed links with');
  const algOption = () =>
    new Option('--alg <alg>', 'signature algorithm')
      .choices([...EMBED_ALGORITHMS])
      .default('EdDSA');

  const create = (verb: 'create' | 'rotate') => async (options: { alg: string; label?: string }) =>
    withCatalog(async ({ pool }) => {
      const keys = new EmbedKeys(pool);
      const before = verb === 'rotate' ? await keys.list(ws()) : [];
      const pair = await keys.create(ws(), options.alg as EmbedAlgorithm, options.label ?? null);
      const stillActive = before.filter((key) => key.revokedAt === null).map((key) => key.kid);
      // The private JWK is the one thing the host needs; it goes to stdout once (as `token
      // create` prints its token) and is stored nowhere. The rest is guidance, on stderr.
      output(
        program,
        {
          workspace: ws(),
          kid: pair.kid,
          alg: pair.alg,
          privateJwk: pair.privateJwk,
          audience: embedAudience(ws(), '<app>'),
          ...(verb === 'rotate' ? { stillActive } : {}),
        },
        ({ privateJwk }) => JSON.stringify(privateJwk),
      );
      if (!program.opts<{ json?: boolean }>().json) {
        process.stderr.write(
          `embed key ${pair.kid} (${pair.alg}) created for workspace ${ws()}: give the private JWK above to the host; it is not kept.\n` +
            (stillActive.length > 0
              ? `still active: ${stillActive.join(', ')} (links they signed verify until you \`embed-key revoke\` them)\n`
              : ''),
        );
      }
    });

  embedKey
    .command('create')
    .description('create a signing key (its private JWK is printed once, never stored)')
    .addOption(algOption())
    .option('--label <text>', 'a note to recognise it by')
    .action(create('create'));
  embedKey
    .command('rotate')
    .description(
      'create a new key to sign with; older keys keep verifying until revoked (revoke them once the host has switched)',
    )
    .addOption(algOption())
    .option('--label <text>', 'a note to recognise it by')
    .action(create('rotate'));
  embedKey
    .command('list')
    .description(
      "list the workspace's embed keys (kid, algorithm, created, revoked; no key material)",
    )
    .action(() =>
      withCatalog(async ({ pool }) => {
        output(program, await new EmbedKeys(pool).list(ws()), (rows) =>
          table(
            ['KID', 'ALG', 'CREATED', 'STATE', 'LABEL'],
            rows.map((r) => [
              r.kid,
              r.alg,
              r.createdAt,
              r.revokedAt === null ? 'active' : `revoked ${r.revokedAt}`,
              r.label ?? '-',
            ]),
            '(no embed keys)',
          ),
        );
      }),
    );
  embedKey
    .command('revoke <kid>')
    .description('revoke a key: every server refuses the links it signed within a second')
    .action((kid: string) =>
      withCatalog(async ({ pool }) => {
        if (!/^[A-Za-z0-9_-]{1,64}$/.test(kid)) {
          throw new InvalidArgumentError('a key id is what `embed-key list` shows');
        }
        if (!(await new EmbedKeys(pool).revoke(ws(), kid))) {
          throw new ViewerCacheError('no such active embed key in this workspace', {
            code: 'E_UNKNOWN_EMBED_KEY',
            status: 404,
          });
        }
        output(program, { revoked: kid }, () => `revoked ${kid}`);
      }),
    );
}
