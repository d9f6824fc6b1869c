import { type Command, InvalidArgumentError } from 'commander';
import type pg from 'pg';
import { pino } from 'pino';
import { type Datatables, type Logger, WORKSPACE_RE } from '../../index.js';
import { readConfig, type ServerConfig } from '../process/config.js';
import { openAssembly } from '../start/assembly.js';

// What every CLI command shares: output, the catalog connection, argument checks.

export interface GlobalOptions {
  json?: boolean;
  workspace: string;
}

/** Prints `value` as JSON with --json, else as the human text `render` makes of it. */
export function output<T>(program: Command, value: T, render: (value: T) => string): void {
  const { json } = program.opts<GlobalOptions>();
  process.stdout.write(json ? `${JSON.stringify(value, null, 2)}\n` : `${render(value)}\n`);
}

/**
 * A list for people: a header row, then one tab-separated row per item (scripts that cut
 * columns keep working; `--json` is the stable form), or `empty` when there is none.
 */
export function table(
  headers: readonly string[],
  rows: readonly string[][],
  empty: string,
): string {
  if (rows.length === 0) return empty;
  return [headers, ...rows].map((row) => row.join('\t')).join('\n');
}

/** Opens the catalog (DATABASE_URL or the embedded server's), runs `fn`, and closes it all. */
export async function withCatalog<T>(
  fn: (ctx: {
    datatables: Datatables;
    pool: pg.Pool;
    config: ServerConfig;
    secretKey: string;
  }) => Promise<T>,
): Promise<T> {
  const config = readConfig();
  const logger: Logger = pino({ level: process.env['LOG_LEVEL'] ?? 'warn' }, pino.destination(2));
  // No apps and no store; a change returns once every running server acknowledged it.
  const { datatables, pool, secretKey, release } = await openAssembly(config, logger, {
    role: 'cli',
  });
  try {
    return await fn({ datatables, pool, config, secretKey });
  } finally {
    await release();
  }
}

/** A workspace id as the server and library accept it; anything else is a usage error. */
export function workspaceArg(value: string): string {
  if (!WORKSPACE_RE.test(value)) {
    throw new InvalidArgumentError(
      'a workspace is 1-128 letters, digits, `_`, `.` or `-`, starting with a letter or digit',
    );
  }
  return value;
}

/** A user's email (the identity a token signs in as); anything else is a usage error. */
export function emailArg(value: string): string {
  if (value.length > 254 || !/^[^\s@<>"'`,;\\]+@[^\s@<>"'`,;\\]+$/.test(value)) {
    throw new InvalidArgumentError('the user is an email address, such as alice@example.com');
  }
  return value;
}

/** The workspace the command is about (`-w`, default `demo`). */
export function workspaceOf(program: Command): string {
  return program.opts<GlobalOptions>().workspace;
}
