import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Command, CommanderError, Option } from 'commander';
import { ViewerCacheError } from '../../index.js';
import { DEMO_WORKSPACE } from '../demo/demo.js';
import { addAccessRecordCommands } from './cli_access_record.js';
import { addAgentTokenCommands } from './cli_agents.js';
import { addAuditCommand } from './cli_audit.js';
import { addCacheCommands } from './cli_cache.js';
import { addCatalogCommands, addMigrateCommand } from './cli_catalog.js';
import { type GlobalOptions, workspaceArg } from './cli_context.js';
import { addEmbedKeyCommands } from './cli_embed.js';
import { addExplainCommand } from './cli_explain.js';
import { addGoverningCommands } from './cli_governing.js';
import { addProcessCommands } from './cli_process.js';
import { addTokenCommands } from './cli_tokens.js';

/** Exit codes: 0 done, 1 the operation failed or was refused, 2 the command line was wrong. */
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;

/** The `viewer-cache` program: global options and every command family. */
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

  // One file per command family; the order is the order of `--help`.
  addProcessCommands(program);
  addMigrateCommand(program);
  addTokenCommands(program);
  addAgentTokenCommands(program);
  addEmbedKeyCommands(program);
  addGoverningCommands(program);
  addCatalogCommands(program);
  addCacheCommands(program);
  addAccessRecordCommands(program);

  addAuditCommand(program);
  addExplainCommand(program);

  return program;
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
  try {
    await program.parseAsync(argv);
    // A command that ran but found something wrong (an audit that failed) says so here.
    return typeof process.exitCode === 'number' ? process.exitCode : 0;
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
    return EXIT_FAILED;
  }
}

/** `viewer-cache` and the command words before the first option (`viewer-cache roles create`). */
function usageHint(argv: string[]): string {
  const words = argv.slice(2).filter((word) => /^[a-z][a-z-]*$/.test(word));
  const command = buildCli().commands.find((c) => c.name() === words[0]);
  const sub = command?.commands.find((c) => c.name() === words[1]);
  return ['viewer-cache', command?.name(), sub?.name()].filter(Boolean).join(' ');
}
