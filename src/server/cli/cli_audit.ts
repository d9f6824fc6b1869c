import { readFile, writeFile } from 'node:fs/promises';
import type { Command } from 'commander';
import { pino } from 'pino';
import type { Logger } from '../../index.js';
import { renderHtml, renderJunit, renderSummary } from '../audit/audit_formats.js';
import { runAudit } from '../audit/audit_runner.js';
import { parseViewerFile } from '../audit/viewer_set.js';
import { DEMO_APPS } from '../demo/demo_apps.js';
import { readConfig } from '../process/config.js';
import { loadSecretKey, openDatabase } from '../process/connections.js';
import type { GlobalOptions } from './cli_context.js';

interface AuditOptions {
  apps?: string;
  demo?: boolean;
  viewers?: string;
  junit?: string;
  html?: string;
  strict?: boolean;
  execution?: string;
}

/**
 * `viewer-cache audit`: runs the audited runnables of your apps module (or the demo's) as every
 * viewer and lints every data table's rules (src/server/audit/). Prints a summary (or the report
 * with --json), writes JUnit and HTML when asked; exits 1 on any failure, and on a warning with
 * --strict.
 */
export function addAuditCommand(program: Command): void {
  program
    .command('audit')
    .description(
      'run your apps as every viewer and lint your policies: does each viewer get only their own rows?',
    )
    .option('--apps <path>', 'the apps module to audit (as `serve --apps`)')
    .option('--demo', 'audit the demo (as seeded by `serve --demo`)')
    .option('--viewers <file>', 'a JSON array of viewers (default: derived from the catalog)')
    .option('--junit <file>', 'write a JUnit XML report')
    .option('--html <file>', 'write a self-contained HTML report')
    .option('--strict', 'exit 1 on warnings too')
    .option(
      '--execution <mode>',
      'in-process, or queue: the cached runs go through a queue and a worker of the audit (REDIS_URL)',
      'in-process',
    )
    .action(async (options: AuditOptions) => {
      if ((options.apps === undefined) === (options.demo !== true))
        throw new TypeError('give either --apps PATH or --demo');
      const execution = options.execution;
      if (execution !== 'in-process' && execution !== 'queue')
        throw new TypeError('--execution must be in-process or queue');
      const json = program.opts<GlobalOptions>().json === true;
      const config = readConfig();
      if (execution === 'queue' && config.redisUrl === null)
        throw new TypeError('audit --execution queue needs REDIS_URL (the Redis it queues on)');
      const logger: Logger = pino(
        { level: process.env['LOG_LEVEL'] ?? 'warn' },
        pino.destination(2),
      );
      const secretKey = await loadSecretKey(config);
      const database = await openDatabase(config, logger);
      const progress = process.stderr.isTTY && !json;
      try {
        const report = await runAudit({
          apps: options.apps ?? DEMO_APPS,
          databaseUrl: database.url,
          secretKey,
          execution,
          ...(config.redisUrl === null ? {} : { redisUrl: config.redisUrl }),
          // The apps module's own workspace, unless -w names one.
          ...(program.getOptionValueSource('workspace') === 'cli'
            ? { workspace: program.opts<GlobalOptions>().workspace }
            : {}),
          ...(options.viewers === undefined
            ? {}
            : { viewers: parseViewerFile(await readFile(options.viewers, 'utf8')) }),
          logger,
          ...(progress
            ? {
                onProgress: (done: number, total: number, what: string) =>
                  process.stderr.write(`\r\u001b[2K[${done}/${total}] ${what}`),
              }
            : {}),
        });
        if (progress) process.stderr.write('\r\u001b[2K');
        if (options.junit !== undefined) await writeFile(options.junit, renderJunit(report));
        if (options.html !== undefined) await writeFile(options.html, renderHtml(report));
        process.stdout.write(
          json ? `${JSON.stringify(report, null, 2)}\n` : `${renderSummary(report)}\n`,
        );
        if (report.status === 'fail' || (options.strict === true && report.status === 'warn'))
          process.exitCode = 1;
      } finally {
        await database.embedded?.stop();
      }
    });
}
