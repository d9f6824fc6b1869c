import type { FastifyReply, FastifyRequest } from 'fastify';
import { LogController } from 'fastify';
import { pino } from 'pino';
import type { JobResult, Logger } from '../../index.js';
import { writesPlainJson } from '../process/server_logger.js';
import { cachingHeaderList } from './http_caching.js';

// The two ends of a request that sit on the hot path: writing a result, and the one log line.

const CLOSE = Buffer.from('}');
const CLOSE_BRACE = 0x7d;

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
  /** Where the hand-built line goes, when the logger writes pino's plain JSON lines; else null. */
  readonly #plain: { write(line: string): unknown } | null;
  /** The logger's bindings as pino renders them (`,"pid":…,"hostname":"…"`). */
  readonly #bindings: string;
  readonly #time: () => string;
  /** Lines held, not yet handed to the stream (see #hold). */
  #lines = '';

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
    // The server's own logger writes pino's default JSON lines (createServerLogger): the line's
    // fields are fixed, so it is written as pino would write it without pino serialising an
    // object per request (5 µs of a cached request's ≈ 50 µs of JavaScript on the 2-core VM;
    // test/unit/server_request_logging.test.ts checks both give the same line). Any other
    // logger (a transport, the pretty printer, a caller's own) gets the line through pino.
    const access = this.#access as unknown as Record<symbol, unknown>;
    const stream = access[pino.symbols.streamSym] as { write?: unknown } | undefined;
    this.#plain =
      writesPlainJson(logger) && typeof stream?.write === 'function'
        ? (stream as { write(line: string): unknown })
        : null;
    this.#bindings = String(access[pino.symbols.chindingsSym] ?? '');
    this.#time = access[pino.symbols.timeSym] as () => string;
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
    const elapsed = reply.elapsedTime;
    this.#observeRequest(route, status, elapsed / 1000);
    const code = this.#refusals.get(request);
    const ms = Math.round(elapsed * 100) / 100;
    if (this.#plain !== null) {
      // The level is read per line: an operator may change it at run time.
      if (!this.#access.isLevelEnabled('info')) return;
      // Every value goes through JSON.stringify (the id, method, route and code are safe by
      // construction, but a line must stay one JSON object whatever they hold).
      this.#hold(
        `{"level":30${this.#time()}${this.#bindings},"reqId":${JSON.stringify(request.id)},"method":${JSON.stringify(request.method)},"route":${JSON.stringify(route)},"status":${status},"ms":${ms}${code === undefined ? '' : `,"code":${JSON.stringify(code)}`},"msg":"request completed"}\n`,
      );
      return;
    }
    this.#access.info(
      code === undefined
        ? { reqId: request.id, method: request.method, route, status, ms }
        : { reqId: request.id, method: request.method, route, status, ms, code },
      'request completed',
    );
  }

  /**
   * Holds a hand-built line until the requests finishing now have all finished, then writes
   * their lines as one. pino's stream (sonic-boom) measures the whole text still waiting to be
   * written (`Buffer.byteLength`, up to 16 KiB) on every write: one write per request was 5.4 %
   * of a cached request's CPU at 64 connections (`bench/outsider_http.ts --profile`).
   *
   * A response's end is reported on the next-tick queue, and the responses of one turn are
   * written together (`endAfterPoll`): a tick queued behind the first report runs after the
   * others, and before any promise callback, so whoever awaits a request (or a server's close)
   * and then flushes the logger finds its line in the stream.
   */
  #hold(line: string): void {
    if (this.#lines === '') {
      process.nextTick(this.#writeLines);
      heldLineWriters.add(this.#writeLines);
    }
    this.#lines += line;
  }

  /** The held lines, if any, to the stream: after the finishing requests, or on process exit. */
  readonly #writeLines = (): void => {
    const lines = this.#lines;
    if (lines === '') return;
    this.#lines = '';
    heldLineWriters.delete(this.#writeLines);
    try {
      this.#plain!.write(lines);
    } catch {
      // A stream already ended (the logger closed with the server): nowhere left to write.
    }
  };
}

/** The writers of request logs holding lines not yet written (see `RequestLog.#hold`). */
const heldLineWriters = new Set<() => void>();

// Before pino's own exit hook (registered when its stream was made), which flushes the stream
// synchronously: a process that exits before the tick (process.exit mid-turn) loses no line.
process.prependListener('exit', () => {
  for (const write of heldLineWriters) write();
});

/** Results up to this size are copied into the one buffer that carries the whole body. */
const COPY_BELOW = 16 * 1024;

/**
 * Writes `{"jobId":…,"fromCache":…,"result":<stored bytes>}`. The stored JSON goes out as it
 * is — a hit is never parsed or re-serialised. A small result (≤ 16 KiB, most app requests) is
 * copied once into a buffer holding the whole body, written by one `end`: each `write` of an
 * `OutgoingMessage` costs more than copying a few KiB (three writes were 4 µs of a cached
 * request). A larger one is not copied: its pieces are written corked, as one `writev`. Either is
 * written right after the event loop's poll, with the other results finished in it (see
 * `endAfterPoll`). The response is complete here, so the reply is hijacked; Fastify still runs
 * the onResponse hook when it finishes.
 */
export function sendResult(reply: FastifyReply, jobId: string, result: JobResult): void {
  const head = `{"jobId":${JSON.stringify(jobId)},"fromCache":${result.fromCache},"result":`;
  const body = result.json();
  const headBytes = Buffer.byteLength(head);
  const length = headBytes + body.length + 1;
  reply.hijack();
  const raw = reply.raw;
  // All the answer's headers in one list: with nothing set on the response before, Node
  // validates and writes them once (six `setHeader`s each validated, stored, then written).
  raw.writeHead(200, [
    'x-request-id',
    reply.request.id,
    ...cachingHeaderList(reply.request),
    'content-type',
    'application/json; charset=utf-8',
    'content-length',
    String(length),
    'x-viewer-cache',
    result.fromCache ? 'hit' : 'miss',
  ]);
  if (body.length <= COPY_BELOW) {
    const whole = Buffer.allocUnsafe(length);
    whole.write(head, 0, 'utf8');
    whole.set(body, headBytes);
    whole[length - 1] = CLOSE_BRACE;
    endAfterPoll(new FinishedBody(raw, whole, null));
    return;
  }
  endAfterPoll(new FinishedBody(raw, head, body));
}

/** A response whose body is ready: `first` alone, or `first` then `rest` (a large result). */
class FinishedBody {
  constructor(
    readonly raw: FastifyReply['raw'],
    readonly first: Buffer | string,
    readonly rest: Uint8Array | null,
  ) {}

  end(): void {
    const { raw } = this;
    if (this.rest === null) {
      raw.end(this.first);
      return;
    }
    raw.cork();
    raw.write(this.first);
    raw.write(this.rest);
    // end() uncorks the socket fully: no uncork of ours may follow (with keep-alive the socket
    // may already carry the next response by the next tick).
    raw.end(CLOSE);
  }
}

/**
 * Results finished while the event loop polls are written together, right after the poll (the
 * check phase, where `setImmediate` callbacks run), not each the moment it is ready. Writing a
 * response from inside the request's own read made each one a lone `writev`, and on a loaded
 * server that syscall was the largest frame of a cached request (a third of its CPU): every lone
 * write wakes the peer for one response. Written in a burst after the poll, as a Redis reply
 * already batched the Redis-only tier's, the same responses cost far less. Measured with
 * `bench/outsider_http.ts` (autocannon in its own process, cached app request, two tiers):
 * 16 connections 12.4 k → 21.0 k req/s and 80 → 49 µs of server CPU per request (the floor
 * route: 20.6 k, 46 µs); 64 connections 12.4 k → 23.5 k req/s, p50 5.0 → 2.2 ms. Nothing waits
 * longer than what the same poll still had to read; one connection alone sees no change.
 * `setImmediate` is taken at load, so a test's fake timers cannot hold responses back.
 */
const afterPoll = setImmediate;
let finished: FinishedBody[] = [];

function endAfterPoll(body: FinishedBody): void {
  if (finished.push(body) === 1) afterPoll(writeFinished);
}

function writeFinished(): void {
  const batch = finished;
  finished = [];
  for (const body of batch) {
    try {
      body.end();
    } catch (err) {
      // One response that cannot be written must not keep the others of the batch unsent.
      body.raw.destroy(err as Error);
    }
  }
}
