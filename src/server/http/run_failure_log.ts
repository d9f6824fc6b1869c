import type { FastifyBaseLogger } from 'fastify';
import type { Job } from '../../index.js';
import type { HttpErrorBody } from './http_errors.js';

/** Where a failed run came from, for its log line: never the viewer, args or token. */
export interface RunContext {
  readonly job: Job;
  /** The app the request named, when the route has one. */
  readonly app?: string;
}

/** Longest error text a failure line carries. */
const MAX_TEXT = 300;

/**
 * A runnable's or Postgres's error text with its values taken out: anything quoted (a literal,
 * a token of the statement, a value a runnable put in its message), email addresses, and runs
 * of two or more digits (ids, amounts) become `…`/`#`. What stays is the shape of the failure
 * ("permission denied for table orders", "syntax error at or near …"), enough to find the
 * statement; the SQLSTATE and the code travel in their own fields.
 */
export function redactErrorText(text: string, values: readonly string[] = []): string {
  let own = text;
  // The run's own values first, whatever their shape: an args value or a signed attribute a
  // runnable put in its message unquoted (`no orders for emea`) is no less the caller's.
  for (const value of values) if (value.length >= 2) own = own.split(value).join('[value]');
  const redacted = own
    .replace(/[^\s@"'`]+@[^\s@"'`]+/g, '[email]')
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`/g, '"…"')
    .replace(/\b[0-9a-f]{16,}\b/gi, '#')
    .replace(/\d{2,}/g, '#')
    .replace(/\s+/g, ' ');
  return redacted.length > MAX_TEXT ? `${redacted.slice(0, MAX_TEXT)}…` : redacted;
}

/**
 * One line per failed or refused run, readable at the default level: `warn` for a refusal (a
 * 4xx: the viewer may not, the request was wrong), `error` for a failure (5xx). It names the
 * workspace, app, runnable path, outcome code, SQLSTATE where Postgres gave one, and the job id
 * the caller was given in the answer, with the error's text redacted ({@link redactErrorText});
 * the request id comes from the request's logger.
 */
export function logRunFailure(
  log: FastifyBaseLogger,
  run: RunContext,
  error: Error,
  answer: HttpErrorBody,
): void {
  const { job } = run;
  const line = {
    workspace: job.workspace,
    ...(run.app === undefined ? {} : { app: run.app }),
    path: job.runnable.path,
    jobId: job.id,
    code: answer.code,
    status: answer.status,
    ...(answer.sqlstate === undefined ? {} : { sqlstate: answer.sqlstate }),
    err: redactErrorText(error.message, valuesOf(job)),
  };
  if (answer.status >= 500) log.error(line, 'run failed');
  else log.warn(line, 'run refused');
}

/** Every value of `job` a line must not repeat: its args' leaves, its viewer, its embed identity. */
export function valuesOf(job: Job): string[] {
  const values = new Set<string>();
  const walk = (value: unknown, depth: number): void => {
    if (depth > 64 || value === null || value === undefined) return;
    if (typeof value === 'string') values.add(value);
    else if (typeof value === 'number' || typeof value === 'bigint') values.add(String(value));
    else if (typeof value === 'object') {
      for (const inner of Object.values(value as Record<string, unknown>)) walk(inner, depth + 1);
    }
  };
  walk(job.args, 0);
  if (job.perms.endUserEmail !== null) values.add(job.perms.endUserEmail);
  const embed = job.perms.embed;
  if (embed !== undefined) {
    walk(embed.attributes, 0);
    if (embed.email !== null) values.add(embed.email);
  }
  // Longest first: a value that contains a shorter one is taken out whole.
  return [...values].sort((a, b) => b.length - a.length);
}
