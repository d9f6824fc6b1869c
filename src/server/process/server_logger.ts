import { pino } from 'pino';
import type { Logger } from '../../index.js';
import type { ServerConfig } from './config.js';

// The server's and the workers' logger, apart from the HTTP server so that every CLI command
// (and a worker) can log without loading Fastify, an optional peer.

/**
 * pino, pretty on a TTY; identities, tokens, passwords and args are redacted wherever they
 * appear. JSON lines are written asynchronously and in batches (Fastify's two synchronous
 * lines per request were 22 % of a cached request's CPU): at most 250 ms late, and
 * `logger.flush()` on shutdown (or pino's exit hook) writes what is left.
 */
export function createServerLogger(
  config: Pick<ServerConfig, 'logLevel' | 'prettyLogs'>,
  /** File descriptor or path of the JSON lines (benchmarks write to /dev/null). @default 1 */
  destination: number | string = 1,
): Logger {
  const options = {
    level: config.logLevel,
    redact: {
      paths: [
        'req.headers.authorization',
        // An agent's query carries the job's token beside its own (http_agents.ts).
        'req.headers["x-viewer-cache-job-token"]',
        'password',
        '*.password',
        'token',
        '*.token',
        'args',
        '*.args',
        'email',
        '*.email',
        'viewer',
        '*.viewer',
      ],
      censor: '[redacted]',
    },
  };
  if (config.prettyLogs) {
    return pino({
      ...options,
      transport: {
        target: 'pino-pretty',
        // Colour codes only for a terminal that wants them: a pipe or a file gets plain text.
        options: {
          colorize: process.stdout.isTTY === true && !process.env['NO_COLOR'],
          translateTime: 'SYS:HH:MM:ss',
        },
      },
    });
  }
  // Buffered up to 4 KiB per write, and flushed at least every 250 ms so a quiet server's lines
  // still show promptly. Each async write costs a syscall and a thread-pool round trip (7 % of
  // a cached request's CPU when every line was its own write).
  const stream = pino.destination({ dest: destination, sync: false, minLength: 4096 });
  setInterval(() => stream.flush(), 250).unref();
  const logger = pino(options, stream);
  plainJsonLoggers.add(logger);
  return logger;
}

/** Loggers made here that write plain pino JSON lines (no transport, formatter or mixin). */
const plainJsonLoggers = new WeakSet<Logger>();

/**
 * Whether `logger` (or its root) is one {@link createServerLogger} made writing JSON lines with
 * pino's defaults: a line built by hand in pino's own shape is then the line pino would write
 * (`RequestLog`'s access line, see http_reply.ts).
 */
export function writesPlainJson(logger: Logger): boolean {
  return plainJsonLoggers.has(logger);
}

/**
 * On an uncaught exception (or an unhandled rejection, which Node 20 turns into one): the stack
 * to stderr as Node writes it, one `fatal` line in the JSON log (the error's name and code,
 * never its message, which may echo a runnable's rows), then exit 1. Buffered lines are not
 * lost: the 'exit' event runs pino's flush of its buffer (`test/unit/server_logger.test.ts`).
 */
export function exitOnFatal(logger: Logger): void {
  process.once('uncaughtException', (err: Error & { code?: unknown }) => {
    try {
      process.stderr.write(`${err?.stack ?? String(err)}\n`);
      logger.fatal({ err: { name: err?.name, code: err?.code } }, 'fatal error; exiting');
    } finally {
      process.exit(1);
    }
  });
}
