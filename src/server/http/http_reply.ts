import type { FastifyReply, FastifyRequest } from 'fastify';
import { LogController } from 'fastify';
import type { JobResult, Logger } from '../../index.js';

// The two ends of a request that sit on the hot path: writing a result, and the one log line.

const CLOSE = Buffer.from('}');

/** Counts a finished request for /metrics. */
export type ObserveRequest = (route: string, status: number, seconds: number) => void;

/**
 * Fastify's own request logging wrote two lines per request, synchronously, with the raw URL (a
 * token in a query string was logged): 22 % of a cached request's CPU. This writes one line
 * when the response is done, with the route pattern and never the URL, and counts the request
 * for /metrics in the same place (no onResponse hook to run per request).
 *
 * The line is written with the request's id on a child of the root logger, not by the request's
 * own child, which is then never made for a request that logs nothing else (see
 * `DeferredChildLogger`). That child has no redaction: with the server's wildcard paths
 * (`*.token`, …) pino runs the redactor on every value of every line, which doubled this line's
 * cost (15–17 µs against 7.5–8 µs per line on the 2-core VM). Its fields are fixed and carry no
 * identity — method, route pattern (never the URL), status, duration, error code — so nothing
 * here is for redaction to find; anything added to this line must keep to that.
 */
export class RequestLog extends LogController {
  readonly #access: Logger;
  readonly #refusals: WeakMap<FastifyRequest, string>;
  readonly #observeRequest: ObserveRequest;

  /**
   * `refusals`: the error code of a refused request, set by the error handler. `accessLog`
   * false (`VIEWER_CACHE_ACCESS_LOG=off`) writes no line; requests are still counted.
   */
  constructor(
    logger: Logger,
    refusals: WeakMap<FastifyRequest, string>,
    observeRequest: ObserveRequest,
    accessLog = true,
  ) {
    super();
    this.#access = logger.child({}, { redact: [] });
    this.#refusals = refusals;
    this.#observeRequest = observeRequest;
    // Decided once: with the line off, completing a request only counts it.
    if (!accessLog) {
      this.requestCompleted = (_error, request, reply) =>
        observeRequest(
          request.routeOptions.url ?? 'unmatched',
          reply.statusCode,
          reply.elapsedTime / 1000,
        );
    }
  }

  override incomingRequest(): void {}

  override routeNotFound(): void {}

  override requestCompleted(
    _error: Error | null | undefined,
    request: FastifyRequest,
    reply: FastifyReply,
  ): void {
    const route = request.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    this.#observeRequest(route, status, reply.elapsedTime / 1000);
    const code = this.#refusals.get(request);
    this.#access.info(
      {
        reqId: request.id,
        method: request.method,
        route,
        status,
        ms: Math.round(reply.elapsedTime * 100) / 100,
        ...(code === undefined ? {} : { code }),
      },
      'request completed',
    );
  }
}

/**
 * Writes `{"jobId":…,"fromCache":…,"result":<stored bytes>}`. The stored JSON goes out as it
 * is — a hit is never parsed, re-serialised or copied: the envelope's pieces and the stored
 * bytes are written corked, as one `writev`. (Fastify's `send` needs one buffer, which cost a
 * `Buffer.concat` copy of the stored bytes.) The response is complete here, so the reply is
 * hijacked; Fastify still runs the onResponse hook when it finishes.
 */
export function sendResult(reply: FastifyReply, jobId: string, result: JobResult): void {
  const head = Buffer.from(
    `{"jobId":${JSON.stringify(jobId)},"fromCache":${result.fromCache},"result":`,
  );
  const body = result.json();
  reply.hijack();
  const raw = reply.raw;
  raw.statusCode = 200;
  raw.setHeader('content-type', 'application/json; charset=utf-8');
  raw.setHeader('content-length', head.length + body.length + CLOSE.length);
  raw.setHeader('x-viewer-cache', result.fromCache ? 'hit' : 'miss');
  raw.cork();
  raw.write(head);
  raw.write(body);
  // end() uncorks the socket fully: no uncork of ours may follow (with keep-alive the socket may
  // already carry the next response by the next tick).
  raw.end(CLOSE);
}
