import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions } from 'pino';

type Line = (...args: unknown[]) => void;

/**
 * Fastify's per-request logger, made only when something logs through it. Fastify builds a
 * pino child (`{ reqId }`) for every request, and each child passes its bindings through the
 * redaction stringifiers; on a served request nothing logs through `request.log` (the access
 * line is written by `RequestLog` on the root logger, with `reqId`), so that child was pure
 * cost. Error and debug lines still go through the real child, with the same bindings.
 */
export class DeferredChildLogger implements FastifyBaseLogger {
  readonly #parent: FastifyBaseLogger;
  readonly #bindings: Bindings;
  readonly #options: ChildLoggerOptions;
  #child: FastifyBaseLogger | null = null;

  constructor(parent: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions) {
    this.#parent = parent;
    this.#bindings = bindings;
    this.#options = options;
  }

  get level(): string {
    return this.#real().level;
  }

  set level(level: string) {
    this.#real().level = level;
  }

  fatal(...args: unknown[]): void {
    this.#line('fatal', args);
  }

  error(...args: unknown[]): void {
    this.#line('error', args);
  }

  warn(...args: unknown[]): void {
    this.#line('warn', args);
  }

  info(...args: unknown[]): void {
    this.#line('info', args);
  }

  debug(...args: unknown[]): void {
    this.#line('debug', args);
  }

  trace(...args: unknown[]): void {
    this.#line('trace', args);
  }

  silent(...args: unknown[]): void {
    this.#line('silent', args);
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.#real().child(bindings, options);
  }

  #line(
    level: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent',
    args: unknown[],
  ): void {
    const real = this.#real();
    (real[level] as Line).apply(real, args);
  }

  #real(): FastifyBaseLogger {
    this.#child ??= this.#parent.child(this.#bindings, this.#options);
    return this.#child;
  }
}

/** Fastify's `childLoggerFactory`: a {@link DeferredChildLogger}. */
export function deferredChildLogger(
  logger: FastifyBaseLogger,
  bindings: Bindings,
  options: ChildLoggerOptions,
): FastifyBaseLogger {
  return new DeferredChildLogger(logger, bindings, options);
}
